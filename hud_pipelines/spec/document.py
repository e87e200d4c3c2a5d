"""A YAML file read into plain Python values plus the source position of every key and value.

ruamel.yaml's round-trip composer gives a node tree in which every node (scalars included) knows
its line and column and in which duplicate keys are still visible; this module walks that tree
itself instead of letting a constructor build objects, so that it can report *every* duplicate
key, unsupported tag and unset ``${VAR}`` of a file in one pass, and record where each value came
from. Validation problems found later are then located by key path through :meth:`YamlDocument.problem`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from hud_pipelines.spec.interpolation import interpolate
from hud_pipelines.spec.problems import Problem

KeyPath = tuple[str | int, ...]

_YAML = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (f"{_YAML}{t}" for t in ("str", "int", "float", "bool", "null"))
MAP, SEQ, MERGE, TIMESTAMP = (f"{_YAML}{t}" for t in ("map", "seq", "merge", "timestamp"))
_TYPED_SCALARS = frozenset({INT, FLOAT, BOOL, NULL})


def format_path(path: KeyPath) -> str:
    """``agent.policy.kind`` / ``tasks[1].seed``: a key path as a user reads it."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


@dataclass(frozen=True)
class Span:
    """A 0-based position plus how many characters of that line it covers."""

    line: int
    column: int
    width: int


@dataclass(frozen=True)
class Entry:
    """Where one value of the document sits: its key (``None`` for list items and the root) and itself."""

    key: Span | None
    value: Span
    block: bool
    """The value is a block-style mapping or list that starts on a later line than its key."""


EXTENSION_PREFIX = "x-"
EXTENSION_KEY = f"^{EXTENSION_PREFIX}"
"""Top-level keys of this pattern (``x-defaults: &defaults ...``) hold YAML anchors for the file to reuse, as
in Compose files: the loader drops them before validation, so they are never settings (nor hashed)."""


def without_extensions(data: Any) -> Any:
    """A pipeline's top level without its ``x-`` keys (:data:`EXTENSION_KEY`); anything else as it is."""
    if not callable(getattr(data, "items", None)):  # not a mapping: the validation says what it is
        return data
    items: list[tuple[object, object]] = list(data.items())
    return {key: value for key, value in items if not (isinstance(key, str) and key.startswith(EXTENSION_PREFIX))}


@dataclass
class YamlDocument:
    """Plain data (dicts, lists, str, int, float, bool, None) read from one file, with positions."""

    file: str
    lines: list[str]
    data: Any
    entries: dict[KeyPath, Entry] = field(default_factory=dict[KeyPath, Entry])

    def entry(self, path: KeyPath) -> tuple[KeyPath, Entry | None]:
        """The entry at ``path``, or at its longest prefix present in the file (for a missing key)."""
        while path and path not in self.entries:
            path = path[:-1]
        return path, self.entries.get(path)

    def problem(self, path: KeyPath, message: str, *, on_key: bool = False) -> Problem:
        """A problem about the value at ``path`` (or its key), located at the closest place in the file.

        Block collections are pointed at by their key: their value only starts on the next line.
        """
        found, entry = self.entry(path)
        span: Span | None = None
        if entry is not None:
            prefer_key = on_key or entry.block or found != path
            span = entry.key if prefer_key and entry.key is not None else entry.value
        return self.problem_at(span, format_path(path), message)

    def problem_at(self, span: Span | None, path: str, message: str) -> Problem:
        if span is None:
            return Problem(self.file, 0, 0, path, message)
        line = self.lines[span.line] if span.line < len(self.lines) else ""
        return Problem(self.file, span.line + 1, span.column + 1, path, message, line, span.width)


def read_document(text: str, file: str, env: Mapping[str, str]) -> tuple[YamlDocument | None, list[Problem]]:
    """Parse ``text``; the document is ``None`` when the file is not a YAML mapping at all."""
    lines = text.splitlines()
    problems = _tab_problems(lines, file)
    try:
        root: Node | None = YAML(typ="rt").compose(text)
    except MarkedYAMLError as exc:
        syntax = syntax_problem(exc, lines, file)
        if not any(p.line == syntax.line for p in problems):  # a tab already explains this line
            problems.append(syntax)
        return None, problems
    document = YamlDocument(file, lines, None)
    if root is None:
        message = "the file is empty; a pipeline needs 'name', 'sim' and 'agent'"
        problems.append(Problem(file, 1, 1, "", message, lines[0] if lines else ""))
        return None, problems
    if not isinstance(root, MappingNode):
        message = f"expected a mapping of keys (name, sim, agent, ...), got {_node_kind(root)}"
        problems.append(document.problem_at(_span(root, lines), "", message))
        return None, problems
    reader = _Reader(document, env)
    document.entries[()] = Entry(None, _span(root, lines), block=False)
    document.data = reader.value(root, ())
    return document, problems + reader.problems


def _tab_problems(lines: list[str], file: str) -> list[Problem]:
    problems: list[Problem] = []
    for number, line in enumerate(lines):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent:
            message = "tab character in indentation: YAML indents with spaces"
            problems.append(Problem(file, number + 1, indent.index("\t") + 1, "", message, line))
    return problems


# -- typed access to ruamel's (untyped) nodes and marks ---------------------------------------------


def _position(mark: Any) -> tuple[int, int] | None:
    if mark is None:
        return None
    return int(mark.line), int(mark.column)


def _is_empty(node: Node) -> bool:
    """A value left out after its key (an implicit null): its position is wherever the next token is."""
    return isinstance(node, ScalarNode) and _tag(node) == NULL and not str(cast(object, node.value))


def _tag(node: Node) -> str:
    return str(cast(object, node.tag))


def _text(node: Node) -> str:
    return str(cast(object, node.value))


def _pairs(node: MappingNode) -> list[tuple[Node, Node]]:
    return list(cast(list[tuple[Node, Node]], node.value))


def _items(node: SequenceNode) -> list[Node]:
    return list(cast(list[Node], node.value))


def _is_flow(node: Node) -> bool:
    flow: Any = getattr(node, "flow_style", None)
    return bool(flow)


def _span(node: Node, lines: list[str]) -> Span:
    start = _position(node.start_mark) or (0, 0)
    end = _position(node.end_mark) or start
    width = end[1] - start[1] if end[0] == start[0] else len(lines[start[0]]) - start[1] if start[0] < len(lines) else 1
    return Span(start[0], start[1], max(width, 1))


def syntax_problem(exc: MarkedYAMLError, lines: list[str], file: str) -> Problem:
    """A YAML syntax error as a problem at its line and column (a pipeline file's, a deployment file's)."""
    problem_text = cast(str | None, exc.problem)
    context_text = cast(str | None, exc.context)
    problem_at = _position(exc.problem_mark)
    context_at = _position(exc.context_mark)
    message = f"invalid YAML: {problem_text or context_text or 'cannot parse'}"
    if problem_text and context_text:
        started = (
            f" started at line {context_at[0] + 1}"
            if context_at and problem_at and context_at[0] != problem_at[0]
            else ""
        )
        message += f" ({context_text}{started})"
    mark = problem_at or context_at
    if mark is None:
        return Problem(file, 0, 0, "", message)
    line = lines[mark[0]] if mark[0] < len(lines) else ""
    if line[max(mark[1] - 1, 0) : mark[1] + 1].count("${") and "flow" in message:
        message += "; in a {...} or [...] mapping, quote an environment reference: '${VAR}'"
    return Problem(file, mark[0] + 1, mark[1] + 1, "", message, line)


def _node_kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"the scalar {_text(node)!r}"


class _Reader:
    """Turns a node tree into plain values, registering positions and collecting problems."""

    def __init__(self, document: YamlDocument, env: Mapping[str, str]) -> None:
        self.document = document
        self.env = env
        self.problems: list[Problem] = []
        self._active: set[int] = set()
        self._constructor: Any = YAML(typ="rt").constructor

    def value(self, node: Node, path: KeyPath) -> Any:
        if id(node) in self._active:
            self._problem(node, path, "recursive alias: an anchor refers to itself")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            if isinstance(node, SequenceNode):
                return self._sequence(node, path)
            return self._scalar(node, path)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: MappingNode, path: KeyPath) -> dict[str, Any]:
        if _tag(node) != MAP:
            self._unsupported_tag(node, path)
        lines = self.document.lines
        result: dict[str, Any] = {}
        explicit: dict[str, Node] = {}
        merges: list[Node] = []
        pairs: list[tuple[str, Node, Node]] = []
        for key_node, value_node in _pairs(node):
            if _tag(key_node) == MERGE:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                self._problem(key_node, path, f"keys must be plain names, got {_node_kind(key_node)}")
                continue
            key = _text(key_node)
            if key in explicit:
                first = _span(explicit[key], lines).line + 1
                message = f"duplicate key {key!r} (first defined at line {first}); keep only one"
                self._problem(key_node, (*path, key), message)
                continue
            explicit[key] = key_node
            pairs.append((key, key_node, value_node))
        for merged in merges:  # explicit keys win over merged ones, whatever their order
            sources = _items(merged) if isinstance(merged, SequenceNode) else [merged]
            for source in sources:
                if not isinstance(source, MappingNode):
                    message = f"'<<' merges a mapping (or a list of them), got {_node_kind(source)}"
                    self._problem(source, path, message)
                    continue
                merged_values: Any = self.value(source, path)
                if isinstance(merged_values, dict):
                    for key, value in cast(dict[str, Any], merged_values).items():
                        result.setdefault(key, value)
        for key, key_node, value_node in pairs:
            block = isinstance(value_node, MappingNode | SequenceNode) and not _is_flow(value_node)
            block = block or _is_empty(value_node)  # `checks:` with nothing after it: its "value" is the next key
            self.document.entries[(*path, key)] = Entry(_span(key_node, lines), _span(value_node, lines), block)
            result[key] = self.value(value_node, (*path, key))
        return result

    def _sequence(self, node: SequenceNode, path: KeyPath) -> list[Any]:
        if _tag(node) != SEQ:
            self._unsupported_tag(node, path)
        values: list[Any] = []
        for index, item in enumerate(_items(node)):
            self.document.entries[(*path, index)] = Entry(None, _span(item, self.document.lines), block=False)
            values.append(self.value(item, (*path, index)))
        return values

    def _scalar(self, node: Node, path: KeyPath) -> Any:
        tag = _tag(node)
        if tag == STR:
            return self._string(node, path)
        if tag == TIMESTAMP:
            return _text(node)  # a date-looking value is kept as the text the user wrote
        if tag in _TYPED_SCALARS:
            value: Any = self._constructor.construct_object(node, deep=True)
            if isinstance(value, bool) or value is None:
                return value
            return int(value) if tag == INT else float(value)
        self._unsupported_tag(node, path)
        return _text(node)

    def _string(self, node: Node, path: KeyPath) -> str:
        text = _text(node)
        value, errors = interpolate(text, self.env)
        for error in errors:
            written = text[error.offset : error.offset + error.length]
            span = _span(node, self.document.lines)
            line = self.document.lines[span.line] if span.line < len(self.document.lines) else ""
            found = line.find(written, span.column)
            if found >= 0:
                span = Span(span.line, found, len(written))
            self.problems.append(self.document.problem_at(span, format_path(path), error.message))
        return value

    def _unsupported_tag(self, node: Node, path: KeyPath) -> None:
        self._problem(node, path, f"YAML tag {_tag(node)!r} is not supported: pipeline files hold plain values")

    def _problem(self, node: Node, path: KeyPath, message: str) -> None:
        self.problems.append(self.document.problem_at(_span(node, self.document.lines), format_path(path), message))
