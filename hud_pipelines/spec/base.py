"""Strict pydantic building blocks shared by the pipeline spec and the agent settings.

Every model that a pipeline file fills in refuses unknown keys and is frozen, and every number
refuses a boolean: pydantic's lax mode would read ``horizon: true`` as 1 and ``send_ahead: false`` as
0, a silent mistake in a file a person wrote. The spec (:mod:`hud_pipelines.spec.models`) and the
agent settings (:mod:`hud_pipelines.spec.agent`) both build on these, so one YAML file follows one
set of rules whichever section a key lives in. This module imports nothing from the package, so
either side may import it first.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

BOOL_NOT_NUMBER = "bool_not_number"
"""Error type of a boolean given where a number belongs (the spec's error messages key on it)."""


def refuse_bool(value: object) -> object:
    """Pass ``value`` on unless it is a boolean, which is always a mistake where a number belongs."""
    if isinstance(value, bool):
        raise PydanticCustomError(BOOL_NOT_NUMBER, "expected a number, got a boolean")
    return value


Int = Annotated[int, BeforeValidator(refuse_bool)]
"""An integer that refuses ``true`` / ``false`` (numeric strings from ``${VAR}`` still convert)."""
Float = Annotated[float, BeforeValidator(refuse_bool)]
"""A number that refuses ``true`` / ``false`` (numeric strings from ``${VAR}`` still convert)."""
Count = Annotated[int, Field(ge=1), BeforeValidator(refuse_bool)]
"""An :data:`Int` of at least 1, for optional fields and unions (``Count | None``): a bound written on
such a field (``Int | None = Field(ge=1)``) is enforced but reaches the JSON Schema as a ``ge`` that
editors do not know, where this one is a ``minimum``."""


def omit_default(schema: dict[str, Any]) -> None:
    # For fields whose default is derived from elsewhere (a position, a kind): documented in prose
    # instead of an editor offering a meaningless placeholder.
    schema.pop("default", None)


def schema_default(value: Any) -> Any:
    """Show a ``default_factory`` default in the JSON Schema (pydantic leaves it out)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["default"] = value

    return extra


NAME_MAX_LENGTH = 64
"""The longest name of a pipeline, task or check: names become file names (with run ids beside them), Dagster
keys and partition keys, and a file name has 255 bytes at most."""


def name_field(pattern: str, description: str) -> Any:
    """A ``name`` that defaults to one derived from elsewhere (a position, a kind), said in ``description``."""
    return Field(
        default="",
        pattern=pattern,
        max_length=NAME_MAX_LENGTH,
        description=description,
        json_schema_extra=omit_default,
    )


def target_field(attribute: str, use: str) -> Any:
    """A ``target``: Python code by import path, ``module:<attribute>`` or a file relative to the YAML file."""
    return Field(
        min_length=1,
        description=f"`module:{attribute}` or `path/to/file.py:{attribute}` (relative to the YAML file) {use}",
    )


class StrictModel(BaseModel):
    """A frozen model that refuses unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


__all__ = [
    "BOOL_NOT_NUMBER",
    "Count",
    "Float",
    "Int",
    "StrictModel",
    "name_field",
    "omit_default",
    "refuse_bool",
    "schema_default",
    "target_field",
]
