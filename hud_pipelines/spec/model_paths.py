"""Walking the model types along a pydantic error's location: the YAML key path it stands for.

Pydantic reports a location as a tuple that mixes real keys with the tags of discriminated unions
(``('agent', 'policy', 'scripted', 'target')``) and of plain unions' options; the walk tells the two
apart, so that an error names the key a file holds (``checks.0.value``, not
``checks.0.min_success_rate.value``). Apart from :mod:`hud_pipelines.spec.validation` so that the
models themselves (a run's configuration, :meth:`~hud_pipelines.spec.models.PipelineSpec.with_sections`)
can name their keys as a file's errors do.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from hud_pipelines.spec.document import KeyPath
from hud_pipelines.spec.messages import error_key

KIND = "kind"


def key_path(error: ErrorDetails, root: type[BaseModel]) -> KeyPath:
    """The YAML key path ``error`` is about (union tags dropped: ``checks.0.value``, not
    ``checks.0.min_success_rate.value``)."""
    return walk(error_key(error), root)[0]


def walk(loc: KeyPath, root: type[BaseModel]) -> tuple[KeyPath, Any]:
    """The YAML key path of a pydantic location (union tags dropped) and the type found at its end."""
    located = locate(loc, root)
    return located.path, located.end_type


@dataclass(frozen=True)
class Located:
    path: KeyPath
    end_type: Any
    unions: tuple[KeyPath, ...]
    """The keys of the plain (not ``kind``) unions the location went through an option of, outermost first."""


def locate(loc: KeyPath, root: type[BaseModel]) -> Located:
    """:func:`walk`, and where the location went through an option of a plain union."""
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
    return Located(tuple(path), _unwrap(current), tuple(unions))


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


def union_tags(tp: Any) -> list[str]:
    members = _union_members(tp)
    return list(members) if members else []


def field_names(tp: Any) -> list[str]:
    return list(tp.model_fields) if _is_model(tp) else []


def field_description(tp: Any, name: str) -> str | None:
    if not _is_model(tp):
        return None
    info: FieldInfo | None = tp.model_fields.get(name)
    return info.description if info is not None else None
