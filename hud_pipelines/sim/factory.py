"""Resolve a sim factory spec to something that builds envs, and sort task arguments.

A spec is one of:

- ``package.module:callable`` - any callable returning a gymnasium-style env (or a vector env when
  its signature has ``num_envs``);
- ``path/to/file.py:callable`` - the same, loaded from a file;
- a gymnasium registry id such as ``CartPole-v1`` or ``gym_pusht/PushT-v0`` (the namespace's
  package is imported when the id is not registered yet).

Task arguments are partitioned by the factory's signature: its parameters are *build* arguments (a
changed value rebuilds the env), ``seed`` and ``options`` are *episodic* (they go to ``reset``).
Anything else is an error that shows the signature.

A registry id is built as one ``gym.make`` env per slot unless ``vectorization_mode`` asks for one of
gymnasium's vector envs: every slot is its own env with its own seed and its own reset, so a slot's episode
depends neither on ``num_envs`` nor on ``shards``. A vector wrapper would autoreset a finished slot's env
without its task's seed and options (an env whose reset needs options then fails the whole batch) and cast
observations to the space's dtype where one env alone does not. The default lives here so that
``hud-pipelines serve`` and a pipeline build a registry id the same way.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import gymnasium as gym

from hud_pipelines.errors import FactoryError, TaskArgumentError
from hud_pipelines.targets import load_target

log = logging.getLogger(__name__)

EPISODIC_ARGS = frozenset({"seed", "options"})
"""Task arguments that go to ``reset`` rather than to the factory."""
MAKE_ARGS = frozenset({"render_mode", "max_episode_steps", "disable_env_checker"})
"""``gym.make`` keywords every registry id accepts."""
NUM_ENVS = "num_envs"
VECTORIZATION_MODE = "vectorization_mode"
"""A build argument of every registry id: ``gym.make_vec``'s mode (``sync``, ``async``, ``vector_entry_point``)."""

ENV_MEMBERS = ("reset", "step", "observation_space", "action_space")
"""What the sim needs of what a callable factory returns."""


class FactoryKind(StrEnum):
    """How a factory names its env: a gymnasium registry id, or a callable by import path."""

    REGISTRY = "registry"
    CALLABLE = "callable"


@dataclass(frozen=True)
class Factory:
    """A resolved factory: how to build one env, or a vector env of ``num_envs`` slots."""

    spec: str
    kind: FactoryKind
    target: Callable[..., Any] | str
    """The callable, or the registry id."""
    build_params: frozenset[str]
    accepts_any: bool
    """The factory takes ``**kwargs``: every non-episodic argument is a build argument."""
    vectorizes: bool
    """The factory's signature has ``num_envs``: it batches natively."""
    signature: str

    @property
    def name(self) -> str:
        return self.spec.rsplit(":", 1)[-1] if self.kind is FactoryKind.CALLABLE else self.spec

    def split_task(self, task: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split one task's arguments into (build args, episodic args)."""
        build: dict[str, Any] = {}
        episodic: dict[str, Any] = {}
        for key, value in task.items():
            if key in EPISODIC_ARGS:
                episodic[key] = value
            elif key == NUM_ENVS:
                raise TaskArgumentError(f"{NUM_ENVS!r} is set when the sim starts, not per task")
            elif key in self.build_params or self.accepts_any:
                build[key] = value
            else:
                hint = difflib.get_close_matches(key, [*self.build_params, *EPISODIC_ARGS], n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise TaskArgumentError(
                    f"task argument {key!r} is accepted neither by the factory {self.name}{self.signature} "
                    f"nor by reset(seed, options){suggestion}; build arguments: {sorted(self.build_params)}"
                )
        return build, episodic

    def builds_vector(self, build_args: Mapping[str, Any], num_envs: int) -> bool:
        """Whether :meth:`build` returns one vector env for all slots (else one env per slot).

        A callable vectorizes when its signature has ``num_envs``; a registry id goes through
        ``gym.make_vec`` only when ``vectorization_mode`` is given (one ``gym.make`` env per slot otherwise).
        """
        if self.kind is FactoryKind.REGISTRY:
            return self.vectorization_mode(build_args, num_envs) is not None
        return self.vectorizes

    def vectorization_mode(self, build_args: Mapping[str, Any], num_envs: int) -> str | None:
        """The ``gym.make_vec`` mode a registry id is built with (``None``: one ``gym.make`` env per slot).

        Only a given ``vectorization_mode``; always ``None`` for a callable factory.
        """
        given = build_args.get(VECTORIZATION_MODE) if self.kind is FactoryKind.REGISTRY else None
        return None if given is None else str(given)

    def build(self, build_args: Mapping[str, Any], num_envs: int) -> Any:
        """Build a vector env of ``num_envs`` slots when :meth:`builds_vector`, else a single env."""
        args = dict(build_args)
        if isinstance(self.target, str):
            args.pop(VECTORIZATION_MODE, None)
            mode = self.vectorization_mode(build_args, num_envs)
            if mode is None:
                return gym.make(self.target, **args)
            return gym.make_vec(self.target, num_envs=num_envs, vectorization_mode=mode, **args)
        built = self.target(**args, num_envs=num_envs) if self.vectorizes else self.target(**args)
        missing = [name for name in ENV_MEMBERS if not hasattr(built, name)]
        if missing:
            hint = " (a missing return?)" if built is None else ""
            raise FactoryError(
                f"factory {self.name} returned {type(built).__name__}{hint}, not a gymnasium-style env: it has no "
                f"{', '.join(missing)}"
            )
        return built


def resolve_factory(spec: str) -> Factory:
    """Resolve ``spec``; an unknown module, attribute or id is an error with the closest matches."""
    if ":" in spec:
        attribute = spec.rpartition(":")[2]
        target = load_target(spec, error=FactoryError, what="factory")
        if not callable(target):
            raise FactoryError(f"factory {spec!r}: {attribute!r} is not callable")
        return _callable_factory(spec, target)
    return _registry_factory(spec)


@dataclass(frozen=True)
class _Signature:
    """What a factory's signature says: the keyword parameters, whether it takes ``**kwargs``, its text."""

    names: frozenset[str]
    accepts_any: bool
    text: str


_ANY_SIGNATURE = _Signature(frozenset(), True, "(**kwargs)")


def _parameters(target: Callable[..., Any]) -> _Signature:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin or extension callable without a signature
        return _ANY_SIGNATURE
    try:  # show `x: int`, not `x: 'int'`, for modules with postponed annotations
        signature = inspect.signature(target, eval_str=True)
    except Exception:  # an annotation that does not evaluate: the plain signature still names the parameters
        log.debug("cannot evaluate the annotations of %r", target)
    names = frozenset(
        p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return _Signature(names, accepts_any, str(signature))


def _factory(
    spec: str, kind: FactoryKind, target: Callable[..., Any] | str, signature: _Signature, names: frozenset[str]
) -> Factory:
    """A project callable batches natively when it takes ``num_envs``; a registry id never does itself."""
    return Factory(
        spec=spec,
        kind=kind,
        target=target,
        build_params=names - {NUM_ENVS},
        accepts_any=signature.accepts_any,
        vectorizes=kind is FactoryKind.CALLABLE and NUM_ENVS in names,
        signature=signature.text,
    )


def _callable_factory(spec: str, target: Callable[..., Any]) -> Factory:
    signature = _parameters(target)
    return _factory(spec, FactoryKind.CALLABLE, target, signature, signature.names)


def unknown_registry_id(env_id: str) -> str | None:
    """Why gymnasium's registry, as it stands, holds no ``env_id`` (with the closest ids), or ``None``."""
    if env_id in gym.registry:
        return None
    hint = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    suggestion = f"; did you mean {', '.join(hint)}?" if hint else ""
    return f"unknown gymnasium registry id {env_id!r}{suggestion}"


def _registry_factory(env_id: str) -> Factory:
    if env_id not in gym.registry and "/" in env_id:
        namespace = env_id.split("/", 1)[0]
        try:
            importlib.import_module(namespace)
        except ModuleNotFoundError as exc:
            raise FactoryError(
                f"registry id {env_id!r}: namespace {namespace!r} is not registered and no package of "
                f"that name can be imported ({exc})"
            ) from exc
    unknown = unknown_registry_id(env_id)
    if unknown is not None:
        raise FactoryError(unknown)
    env_spec = gym.spec(env_id)
    entry = env_spec.entry_point
    creator: Callable[..., Any] | None = None
    if callable(entry):
        creator = entry
    elif isinstance(entry, str):
        module_name, _, attribute = entry.partition(":")
        creator = getattr(importlib.import_module(module_name), attribute)
    signature = _parameters(creator) if creator else _ANY_SIGNATURE
    names = signature.names | frozenset(env_spec.kwargs) | MAKE_ARGS | {VECTORIZATION_MODE}
    return _factory(env_id, FactoryKind.REGISTRY, env_id, signature, names)
