"""Problems found in pipeline files, and the one exception that carries all of them.

A user fixing a YAML file wants every mistake at once, each pointing at the exact place: the loader
therefore collects :class:`Problem` records (file, line, column, key path, message, the offending
source line) instead of stopping at the first, and raises a single :class:`SpecError` that renders
them compiler-style::

    pipelines/cartpole.yaml:7:11: agent.policy.kind: unknown policy kind 'scrpted' (did you mean 'scripted'?)
        7 |     kind: scrpted
          |           ^^^^^^^
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hud_pipelines.errors import HudPipelinesError

MAX_CARET_WIDTH = 60


@dataclass(frozen=True)
class Problem:
    """One mistake in one file, located to the character.

    ``line`` and ``column`` are 1-based (0 when the problem concerns the file as a whole); ``path``
    is the key path in the YAML (``agent.policy.kind``, ``tasks[1].seed``; empty for the root);
    ``source_line`` is the text of that line and ``width`` how many characters the caret marks.
    """

    file: str
    line: int
    column: int
    path: str
    message: str
    source_line: str | None = None
    width: int = 1

    @property
    def where(self) -> str:
        """``file:line:column``, the form editors and terminals turn into links."""
        if self.line <= 0:
            return self.file
        return f"{self.file}:{self.line}:{self.column}"

    def render(self) -> str:
        """The problem as a header line plus, when the line is known, the line and a caret under it."""
        prefix = f"{self.path}: " if self.path else ""
        header = f"{self.where}: {prefix}{self.message}"
        if self.source_line is None or self.line <= 0:
            return header
        gutter = f"{self.line:>5} | "
        text = self.source_line.rstrip("\n").expandtabs(1)
        indent = " " * (max(self.column, 1) - 1)
        caret = "^" * max(1, min(self.width, MAX_CARET_WIDTH))
        return f"{header}\n{gutter}{text}\n{' ' * (len(gutter) - 2)}| {indent}{caret}"

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.file, self.line, self.column, self.message)


class SpecError(HudPipelinesError):
    """One or more pipeline files are invalid; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=Problem.sort_key)
        super().__init__(self.render())

    def render(self) -> str:
        files = {p.file for p in self.problems}
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        where = f"{len(files)} files" if len(files) > 1 else next(iter(files), "<no file>")
        body = "\n".join(p.render() for p in self.problems)
        return f"{count} {noun} in {where}:\n{body}"


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to ``word`` when one is similar enough to be a likely typo.

    Similarity is difflib's ratio, which misses short names (``G0`` for ``Go`` scores 0.5): a
    candidate that differs only in case, or by one edit (a character changed, added, dropped or two
    swapped), counts as a typo too.
    """
    names = list(candidates)
    folded = [name for name in names if name.casefold() == word.casefold()]
    if folded:
        return folded[0]
    matches = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    if len(word) < 2:  # one character is one edit from every other: no likely typo
        return None
    return next((name for name in names if _one_edit(word.casefold(), name.casefold())), None)


def _one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one character changed, added or dropped, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(differ) == 1 or (
            len(differ) == 2
            and differ[1] == differ[0] + 1
            and a[differ[0]] == b[differ[1]]
            and a[differ[1]] == b[differ[0]]
        )
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` or an empty string."""
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""


def display_path(path: Path | str) -> str:
    """A path relative to the working directory when it lies below it (shorter, clickable), else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)
