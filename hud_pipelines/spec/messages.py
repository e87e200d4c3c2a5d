"""A pydantic error of one value in the words a pipeline file's errors use: what was expected, what was found.

Apart from :mod:`hud_pipelines.spec.validation`, which also walks the model types to locate a problem in
the YAML, so that the models themselves (a run's configuration checked by
:meth:`~hud_pipelines.spec.models.PipelineSpec.with_sections`) and the deployment file say their
problems in the same words as the pipeline file.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import ErrorDetails

from hud_pipelines.spec.document import KeyPath
from hud_pipelines.spec.problems import did_you_mean
from hud_pipelines.spec.sections import NAME_PATTERN, TASK_NAME_PATTERN

PATTERN_HINTS = {
    NAME_PATTERN: "a name of lowercase letters, digits and '_' starting with a letter",
    TASK_NAME_PATTERN: "a name of lowercase letters, digits, '_' and '-' starting with a letter or digit",
    r"^wss?://": "a ws:// or wss:// URL",
    r"^[^/\s]+/[^/\s]+$": "'owner/name'",
}
_TYPE_EXPECTATIONS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "bool_not_number": "a number",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_BOUND_KEYS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


def error_key(error: ErrorDetails) -> KeyPath:
    """The key ``error`` is about: its ``loc``, and below it the key a model's own rule names (``spec_rule``)."""
    loc: KeyPath = tuple(error["loc"])
    return (*loc, *parse_at(str(error.get("ctx", {}).get("at", "")))) if error["type"] == "spec_rule" else loc


def plain_message(error: ErrorDetails) -> str:
    """A pydantic error of one value in the words a pipeline file's errors use (``expected a number >= 0, got -1``)."""
    key = str(error["loc"][-1]) if error["loc"] else ""
    if error["type"] == "missing":
        return f"missing required key {key!r}"
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    return message_for(error["type"], dict(error.get("ctx") or {}), error.get("input"), str(error["msg"]))


def message_for(kind: str, ctx: dict[str, Any], found: Any, fallback: str) -> str:
    got = f", got {describe(found)}"
    if kind in _TYPE_EXPECTATIONS:
        empty = " (nothing is written after the key)" if found is None else ""
        if kind == "string_type" and isinstance(found, int | float) and not isinstance(found, bool):
            empty = " (YAML reads it as a number: quote it to keep it as written, e.g. '000100')"
        return f"expected {_TYPE_EXPECTATIONS[kind]}{got}{empty}"
    if kind in _BOUNDS:
        return f"expected a number {_BOUNDS[kind]} {_number(ctx.get(_BOUND_KEYS[kind]))}{got}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        return f"expected {PATTERN_HINTS.get(pattern, f'text matching {pattern}')}{got}"
    if kind == "string_too_short":
        return f"expected a non-empty string{got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "spec_rule":
        return str(ctx["message"])
    if kind == "value_error":  # a model's own rule: its message says it all
        return fallback.removeprefix("Value error, ")
    if kind == "union_tag_invalid":  # a run config's or a deployment file's policy or grader kind typo
        tag, tags = str(ctx.get("tag")), re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        return f"unknown kind {tag!r}{did_you_mean(tag, tags)}; expected one of: {', '.join(tags)}"
    if kind in ("enum", "literal_error"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        word = str(found) if isinstance(found, str) else ""
        return f"expected one of: {', '.join(options)}{got}{did_you_mean(word, options)}"
    return f"{fallback}{got}"


def _number(value: Any) -> str:
    """``1`` rather than ``1.0`` for a whole bound: the file may hold either."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def describe(value: Any) -> str:
    """A value as it would be written in YAML, short enough for one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else f"{value[:57]}...")
    return str(value)


def parse_at(at: str) -> KeyPath:
    return tuple(int(p) if p.isdigit() else p for p in at.split(".") if p)
