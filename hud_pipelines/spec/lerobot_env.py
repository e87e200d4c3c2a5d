"""``sim.lerobot_env``: a lerobot env config resolved, in the parent, to the env lerobot's ``make_env`` builds.

A policy trained on lerobot's env wrapper expects the env ``lerobot-eval`` builds: ``gym.make(<package>/<task>,
disable_env_checker=..., **config.gym_kwargs)`` for a config such as ``PushtEnv``. Resolving the config here
gives exactly that gym id and those keyword arguments, so the sim child builds the env as a plain registry id
and never imports lerobot (or torch, which lerobot's config module imports: about 3 s, paid only by a spec
that names a ``lerobot_env``, and only once per process).

Only configs that ``gym.make`` builds are served: a type whose envs come from lerobot's own wrapper
(``create_envs`` overridden: metaworld, libero, robocasa, ...) needs lerobot inside the sim, and a hub type
downloads its env; both are refused naming why, as is a type whose gym package is not installed.

:class:`LeRobotEnvError` carries the key of the config it is about, so the spec can point at its line.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec.problems import did_you_mean

TYPE = "type"
"""The key of ``sim.lerobot_env`` that names the lerobot env type (``EnvConfig`` choice name)."""
DERIVED_FIELDS = frozenset({"features", "features_map"})
"""Config fields lerobot derives from the others (feature shapes, key names): never written in a YAML."""


class LeRobotEnvError(HudPipelinesError):
    """A ``sim.lerobot_env`` that lerobot (or the sim child) cannot build; ``key`` is the config key at fault."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


@dataclass(frozen=True)
class LeRobotEnv:
    """What a lerobot env config builds: the gym id and keyword arguments of lerobot's ``make_env``."""

    type: str
    gym_id: str
    build_args: dict[str, Any]
    """``gym.make`` keywords: the config's ``gym_kwargs`` and its ``disable_env_checker``."""
    package: str
    """The module that registers ``gym_id`` (``gym_pusht``)."""


def resolve_lerobot_env(fields: Mapping[str, Any], *, check_package: bool = True) -> LeRobotEnv:
    """The env of the lerobot config ``fields`` (``{"type": "pusht", ...}``), checked the way a YAML wants it.

    ``check_package``: refuse a type whose gym package is not importable here (off when the sim runs under
    another Python, ``sim.python``, which may have it).
    """
    config = lerobot_env_config(fields)
    package = str(config.package_name)
    if check_package and importlib.util.find_spec(package) is None:
        raise LeRobotEnvError(
            TYPE,
            f"lerobot env type {config.type!r} needs the package {package!r} (pip: {package.replace('_', '-')}), "
            f"which is not installed in {sys.executable}; install it, or run the sim under a 'python' that has it",
        )
    build_args: dict[str, Any] = {"disable_env_checker": config.disable_env_checker, **config.gym_kwargs}
    return LeRobotEnv(type=str(config.type), gym_id=str(config.gym_id), build_args=build_args, package=package)


def lerobot_env_config(fields: Mapping[str, Any]) -> Any:
    """lerobot's ``EnvConfig`` for ``fields``: the type must be one a sim child can build, every field its own."""
    env_config = _env_config_class()
    kind = _env_type(fields, env_config)
    config_class: Any = env_config.get_choice_class(kind)
    _refuse_unbuildable(kind, config_class, env_config)
    values = {key: value for key, value in fields.items() if key != TYPE}
    hints = _field_types(config_class)
    for key, value in values.items():
        _check_field(kind, config_class, hints, key, value)
    try:
        return config_class(**values)
    except (TypeError, ValueError) as exc:
        raise LeRobotEnvError(TYPE, f"lerobot's {config_class.__name__} refused {values}: {exc}") from exc


def known_types() -> list[str]:
    """Every lerobot env type lerobot registers (the ones a sim child can build and the others)."""
    return sorted(_env_config_class().get_known_choices())


@functools.cache
def _env_config_class() -> Any:
    try:
        from lerobot.envs.configs import EnvConfig
    except ModuleNotFoundError as exc:
        raise LeRobotEnvError(TYPE, f"'lerobot_env' needs lerobot, which cannot be imported here ({exc})") from exc
    return EnvConfig


def _env_type(fields: Mapping[str, Any], env_config: Any) -> str:
    known = sorted(env_config.get_known_choices())
    kind = fields.get(TYPE)
    if kind is None:
        raise LeRobotEnvError("", f"missing key 'type': the lerobot env type, one of: {', '.join(known)}")
    if not isinstance(kind, str) or kind not in known:
        hint = did_you_mean(kind, known) if isinstance(kind, str) else ""
        raise LeRobotEnvError(TYPE, f"unknown lerobot env type {kind!r}{hint}; known types: {', '.join(known)}")
    return kind


def _refuse_unbuildable(kind: str, config_class: Any, env_config: Any) -> None:
    """A type the sim child cannot build with ``gym.make`` alone is refused, naming what it would need."""
    from lerobot.envs.configs import HubEnvConfig

    if issubclass(config_class, HubEnvConfig):
        raise LeRobotEnvError(
            TYPE,
            f"lerobot env type {kind!r} downloads and runs its env from the Hugging Face Hub ({config_class.__name__} "
            "with 'hub_path'); a sim child builds gym registry envs only",
        )
    if config_class.create_envs is not env_config.create_envs:
        raise LeRobotEnvError(
            TYPE,
            f"lerobot env type {kind!r} is built by lerobot's own wrapper ({config_class.__name__}.create_envs in "
            f"{config_class.create_envs.__module__}), which needs lerobot and torch inside the sim; a sim child "
            "builds gym registry envs only: give a 'factory' that builds it instead",
        )


def _field_types(config_class: Any) -> dict[str, Any]:
    """The config's settable fields and their types (the derived ``features`` left out)."""
    hints = typing.get_type_hints(config_class)
    return {
        f.name: hints.get(f.name, Any)
        for f in dataclasses.fields(config_class)
        if f.init and f.name not in DERIVED_FIELDS
    }


def _check_field(kind: str, config_class: Any, hints: Mapping[str, Any], key: str, value: Any) -> None:
    if key not in hints:
        fields = sorted(hints)
        raise LeRobotEnvError(
            key,
            f"lerobot env type {kind!r} ({config_class.__name__}) has no field {key!r}{did_you_mean(key, fields)}; "
            f"its fields: {', '.join(fields)}",
        )
    try:
        TypeAdapter(hints[key]).validate_python(value, strict=True)
    except ValidationError:
        expected = getattr(hints[key], "__name__", str(hints[key]))
        raise LeRobotEnvError(
            key, f"{config_class.__name__}.{key} expects {expected}, got {value!r} ({type(value).__name__})"
        ) from None
