"""Pydantic validation errors turned into located, readable problems.

Pydantic reports a location as a tuple that mixes real keys with the tags of discriminated unions
(``('agent', 'policy', 'scripted', 'target')``); this module walks the model types alongside the
location to tell the two apart, finds the key path's place in the YAML file, and rewrites the
message in the file's own terms: what was expected, what was found, and the closest valid name for
an unknown key or ``kind``.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from hud_pipelines.spec.document import KeyPath, YamlDocument
from hud_pipelines.spec.messages import describe, error_key, message_for
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, closest, did_you_mean

KIND = "kind"
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
    located = [(details, _locate(tuple(details["loc"]), root)) for details in errors]
    return _problems_of(located, 0, document, root)


def _without_typoed_missing(errors: list[ErrorDetails], root: type[BaseModel]) -> list[ErrorDetails]:
    """``errors`` less each ``missing`` key that an unknown key of the same mapping is a typo of."""
    typoed: set[tuple[Any, ...]] = set()
    for details in errors:
        if details["type"] == "extra_forbidden":
            parent = tuple(details["loc"][:-1])
            meant = closest(str(details["loc"][-1]), _field_names(_walk(parent, root)[1]))
            if meant is not None:
                typoed.add((*parent, meant))
    return [d for d in errors if not (d["type"] == "missing" and tuple(d["loc"]) in typoed)]


def _problems_of(
    located: list[tuple[ErrorDetails, _Located]], level: int, document: YamlDocument, root: type[BaseModel]
) -> list[Problem]:
    """The problems of errors that went through ``level`` plain unions already (a list of entries that are
    each a string or a mapping is two levels)."""
    problems: list[Problem] = []
    groups: dict[KeyPath, list[tuple[ErrorDetails, _Located]]] = {}
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
        path, _ = _walk(loc, root)
        return document.problem(path, str(ctx["message"]))
    path, end_type = _walk(loc, root)
    found = details.get("input")
    if kind == "missing":
        _, parent_type = _walk(loc[:-1], root)
        described = _field_description(parent_type, str(loc[-1]))
        hint = f" ({described})" if described else ""
        return document.problem(path, f"missing required key {loc[-1]!r}{hint}")
    if kind == "extra_forbidden":
        _, parent_type = _walk(loc[:-1], root)
        allowed = _field_names(parent_type)
        key = str(loc[-1])
        expected = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return document.problem(path, f"unknown key {key!r}{did_you_mean(key, allowed)}{expected}", on_key=True)
    if kind == "union_tag_invalid":
        tags = _union_tags(end_type)
        tag = str(ctx.get("tag"))
        noun = _union_noun(path)
        return document.problem(
            (*path, KIND),
            f"unknown {noun} kind {tag!r}{did_you_mean(tag, tags)}; expected one of: {', '.join(tags)}",
        )
    if kind == "union_tag_not_found" or (kind == "model_attributes_type" and _union_tags(end_type)):
        tags = _union_tags(end_type)
        noun = _union_noun(path)
        if isinstance(found, dict):
            message = f"missing key 'kind': which {noun} this is, one of: {', '.join(tags)}"
        else:
            message = f"expected a mapping with a 'kind' (one of: {', '.join(tags)}), got {describe(found)}"
        return document.problem(path, message)
    return document.problem(path, message_for(kind, ctx, found, details["msg"]))


# -- walking the model types along a pydantic location ---------------------------------------------


def key_path(error: ErrorDetails, root: type[BaseModel] = PipelineSpec) -> KeyPath:
    """The YAML key path ``error`` is about (union tags dropped: ``checks.0.value``, not
    ``checks.0.min_success_rate.value``)."""
    return _walk(error_key(error), root)[0]


def _walk(loc: KeyPath, root: type[BaseModel] = PipelineSpec) -> tuple[KeyPath, Any]:
    """The YAML key path of a pydantic location (union tags dropped) and the type found at its end."""
    located = _locate(loc, root)
    return located.path, located.end_type


@dataclass(frozen=True)
class _Located:
    path: KeyPath
    end_type: Any
    unions: tuple[KeyPath, ...]
    """The keys of the plain (not ``kind``) unions the location went through an option of, outermost first."""


def _locate(loc: KeyPath, root: type[BaseModel] = PipelineSpec) -> _Located:
    """:func:`_walk`, and where the location went through an option of a plain union."""
    current: Any = root
    path: list[str | int] = []
    unions: list[KeyPath] = []
    for part in loc:
        current = _unwrap(current)
        members = _union_members(current)
        if members is not None and isinstance(part, str) and part in members:
            current = members[part]
            continue
        if members is None and _is_union(current) and isinstance(part, str):
            unions.append(tuple(path))  # pydantic's tag of the option that failed, e.g. "literal['auto']"
            current = _option(current, part)
            continue
        path.append(part)
        current = _child_type(current, part)
    return _Located(tuple(path), _unwrap(current), tuple(unions))


def _option(union: Any, tag: str) -> Any:
    """The option of a plain union that pydantic's ``tag`` names (``str``, ``constrained-str``,
    ``FleetServer``, ``list[union[str,CheckpointEntry]]``); ``None`` when no option reads so."""
    for option in get_args(union):
        option = _unwrap(option)
        if _tag_of(option) == tag.removeprefix("constrained-"):
            return option
    return None


def _tag_of(tp: Any) -> str | None:
    """How pydantic names a union's option in an error's location."""
    if _is_model(tp) or tp in (str, int, float, bool):
        return str(tp.__name__)
    args = [_tag_of(_unwrap(a)) for a in get_args(tp)]
    if not args or not all(args):
        return None
    inner = ",".join(a for a in args if a)
    if _is_union(tp):
        return f"union[{inner}]"
    origin = get_origin(tp)
    return f"{origin.__name__}[{inner}]" if origin in (list, dict) else None


def _child_type(parent: Any, part: str | int) -> Any:
    if _is_model(parent):
        fields: dict[str, FieldInfo] = parent.model_fields
        info = fields.get(str(part))
        return info.annotation if info is not None else None
    origin = get_origin(parent)
    args = get_args(parent)
    if origin is list and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def _unwrap(tp: Any) -> Any:
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
            continue
        if _is_union(tp):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) == 1:
                tp = members[0]
                continue
        return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _union_members(tp: Any) -> dict[str, type[BaseModel]] | None:
    """``{kind: model}`` for a discriminated union of models, else ``None``."""
    if not _is_union(tp):
        return None
    members: dict[str, type[BaseModel]] = {}
    for member in get_args(_unwrap(tp)):
        member = _unwrap(member)
        if not _is_model(member) or KIND not in member.model_fields:
            return None
        members[str(member.model_fields[KIND].default)] = member
    return members


def _union_tags(tp: Any) -> list[str]:
    members = _union_members(tp)
    return list(members) if members else []


def _union_noun(path: KeyPath) -> str:
    names = [p for p in path if isinstance(p, str)]
    return UNION_NOUNS.get(names[-1], names[-1]) if names else "item"


def _field_names(tp: Any) -> list[str]:
    return list(tp.model_fields) if _is_model(tp) else []


def _field_description(tp: Any, name: str) -> str | None:
    if not _is_model(tp):
        return None
    info: FieldInfo | None = tp.model_fields.get(name)
    return info.description if info is not None else None
