"""Pydantic validation errors turned into located, readable problems.

Pydantic reports a location as a tuple that mixes real keys with the tags of discriminated unions
(``('agent', 'policy', 'scripted', 'target')``); this module walks the model types alongside the
location to tell the two apart, finds the key path's place in the YAML file, and rewrites the
message in the file's own terms: what was expected, what was found, and the closest valid name for
an unknown key or ``kind``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hud_pipelines.spec.document import KeyPath, YamlDocument
from hud_pipelines.spec.messages import describe, error_key, message_for
from hud_pipelines.spec.model_paths import KIND, Located, field_description, field_names, locate, union_tags, walk
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, closest, did_you_mean

UNION_NOUNS = {"policy": "policy", "graders": "grader", "checks": "check"}


def validation_problems(
    error: ValidationError, document: YamlDocument, root: type[BaseModel] = PipelineSpec
) -> list[Problem]:
    """One problem per pydantic error, located in ``document`` (a file of ``root``).

    A value that fits none of the options of a plain union (``lockstep_threads``: an integer,
    ``auto`` or null) makes pydantic report one error per option, each under an internal tag; those
    become a single problem at the key that lists what each option expected. When the value has the
    shape of one option (a list where a string or a list of entries is allowed) and only the inside
    is wrong, the problems are that option's, at their own keys: the others' say nothing useful.
    A required key missing beside an unknown key one typo from it (``pth:`` for ``path:``) is one
    problem, the unknown key's, which names the missing one.
    """
    errors = _without_typoed_missing(error.errors(), root)
    located = [(details, locate(tuple(details["loc"]), root)) for details in errors]
    return _problems_of(located, 0, document, root)


def _without_typoed_missing(errors: list[ErrorDetails], root: type[BaseModel]) -> list[ErrorDetails]:
    """``errors`` less each ``missing`` key that an unknown key of the same mapping is a typo of."""
    typoed: set[tuple[Any, ...]] = set()
    for details in errors:
        if details["type"] == "extra_forbidden":
            parent = tuple(details["loc"][:-1])
            meant = closest(str(details["loc"][-1]), field_names(walk(parent, root)[1]))
            if meant is not None:
                typoed.add((*parent, meant))
    return [d for d in errors if not (d["type"] == "missing" and tuple(d["loc"]) in typoed)]


def _problems_of(
    located: list[tuple[ErrorDetails, Located]], level: int, document: YamlDocument, root: type[BaseModel]
) -> list[Problem]:
    """The problems of errors that went through ``level`` plain unions already (a list of entries that are
    each a string or a mapping is two levels)."""
    problems: list[Problem] = []
    groups: dict[KeyPath, list[tuple[ErrorDetails, Located]]] = {}
    for details, where in located:
        if len(where.unions) > level:
            groups.setdefault(where.unions[level], []).append((details, where))
        else:
            problems.append(_problem(details, document, root))
            more: list[tuple[str, str]] = list((details.get("ctx") or {}).get("more", ()))
            problems += [_problem(_also(details, at, message), document, root) for at, message in more]
    for path, members in groups.items():
        inside = [(details, where) for details, where in members if len(where.path) > len(path)]
        if inside:  # the value has one option's shape: what is wrong is inside it
            problems += _problems_of(inside, level + 1, document, root)
        else:
            problems.append(_union_problem(path, [details for details, _ in members], document))
    return problems


def _also(details: ErrorDetails, at: str, message: str) -> ErrorDetails:
    """Another violation of a :func:`~hud_pipelines.spec.sections.spec_rules` error, as its own error."""
    return {**details, "ctx": {"message": message, "at": at}}


def _union_problem(path: KeyPath, options: list[ErrorDetails], document: YamlDocument) -> Problem:
    """One problem for a value that every option of a plain union refused."""
    found = options[0].get("input")
    got = f", got {describe(found)}"
    expectations: list[str] = []
    hints: list[str] = []
    for details in options:
        message = message_for(details["type"], dict(details.get("ctx") or {}), found, details["msg"])
        expected, _, hint = message.partition(got)  # an option's did-you-mean follows what it got
        expected = expected.removeprefix("expected ")
        if expected not in expectations:
            expectations.append(expected)
        hints += [hint] if hint and hint not in hints else []
    return document.problem(path, f"expected {' or '.join(expectations)}{got}{''.join(hints[:1])}")


def _problem(details: ErrorDetails, document: YamlDocument, root: type[BaseModel] = PipelineSpec) -> Problem:
    loc = error_key(details)
    kind = details["type"]
    ctx: dict[str, Any] = dict(details.get("ctx") or {})
    if kind == "spec_rule":
        path, _ = walk(loc, root)
        return document.problem(path, str(ctx["message"]))
    path, end_type = walk(loc, root)
    found = details.get("input")
    if kind == "missing":
        _, parent_type = walk(loc[:-1], root)
        described = field_description(parent_type, str(loc[-1]))
        hint = f" ({described})" if described else ""
        return document.problem(path, f"missing required key {loc[-1]!r}{hint}")
    if kind == "extra_forbidden":
        _, parent_type = walk(loc[:-1], root)
        allowed = field_names(parent_type)
        key = str(loc[-1])
        expected = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return document.problem(path, f"unknown key {key!r}{did_you_mean(key, allowed)}{expected}", on_key=True)
    if kind == "union_tag_invalid":
        tags = union_tags(end_type)
        tag = str(ctx.get("tag"))
        noun = _union_noun(path)
        return document.problem(
            (*path, KIND),
            f"unknown {noun} kind {tag!r}{did_you_mean(tag, tags)}; expected one of: {', '.join(tags)}",
        )
    if kind == "union_tag_not_found" or (kind == "model_attributes_type" and union_tags(end_type)):
        tags = union_tags(end_type)
        noun = _union_noun(path)
        if isinstance(found, dict):
            message = f"missing key 'kind': which {noun} this is, one of: {', '.join(tags)}"
        else:
            message = f"expected a mapping with a 'kind' (one of: {', '.join(tags)}), got {describe(found)}"
        return document.problem(path, message)
    return document.problem(path, message_for(kind, ctx, found, details["msg"]))


def _union_noun(path: KeyPath) -> str:
    names = [p for p in path if isinstance(p, str)]
    return UNION_NOUNS.get(names[-1], names[-1]) if names else "item"
