"""Policies that need neither torch nor a network: random, constant and scripted callables."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.agent.policy import Actions, BasePolicy, Policy, PolicyBatch, as_chunks
from hud_pipelines.contract import Contract
from hud_pipelines.errors import PolicyError
from hud_pipelines.targets import load_target

ObservationFn = Callable[[dict[str, npt.NDArray[Any]]], Any]
"""``fn(observation_batch) -> [B, A] or [B, T, A]``: the simplest scripted controller."""


_UNNAMED = 2**32 - 1
"""Stream prefix of rows that name no episode (never a task index)."""


class RandomPolicy(BasePolicy):
    """Uniform actions within the contract's action bounds, one seeded stream per episode.

    Integer actions (discrete spaces) are drawn as integers in ``[low, high]``; a float dimension
    without bounds is drawn from a standard normal. Each row draws from its own generator, seeded from
    ``seed`` and the row's :data:`~hud_pipelines.agent.policy.RandomStream`, so an episode's actions
    do not depend on which other slots or instances shared the forward.
    """

    def __init__(self, contract: Contract, *, seed: int = 0, chunk_size: int = 1) -> None:
        if chunk_size < 1:
            raise PolicyError(f"chunk_size must be >= 1, got {chunk_size}")
        feature = contract.action
        self.width = feature.size
        self.chunk_size = chunk_size
        self.integer = np.dtype(feature.dtype).kind in "biu"
        self.low = np.asarray(feature.low if feature.low is not None else [np.nan] * self.width, dtype=np.float64)
        self.high = np.asarray(feature.high if feature.high is not None else [np.nan] * self.width, dtype=np.float64)
        self.seed = seed
        self._calls = 0

    def infer(self, batch: PolicyBatch) -> Actions:
        if batch.streams is None:  # no episode identity: a stream per call and row, in call order
            batch = dataclasses.replace(batch, streams=[(_UNNAMED, self._calls, row) for row in range(batch.size)])
            self._calls += 1
        return np.stack([self._chunk(rng) for rng in batch.generators(self.seed)])

    def _chunk(self, rng: np.random.Generator) -> Actions:
        shape = (self.chunk_size, self.width)
        bounded = np.isfinite(self.low) & np.isfinite(self.high)
        if self.integer:
            low = np.where(bounded, self.low, 0).astype(np.int64)
            high = np.where(bounded, self.high, 1).astype(np.int64)
            return rng.integers(low, high + 1, size=shape).astype(np.float32)
        uniform = rng.uniform(np.where(bounded, self.low, 0.0), np.where(bounded, self.high, 1.0), size=shape)
        normal = rng.standard_normal(size=shape)
        return np.where(bounded, uniform, normal).astype(np.float32)


class ConstantPolicy(BasePolicy):
    """The same action for every slot and step (zeros when no value is given)."""

    def __init__(self, contract: Contract, value: list[float] | None = None) -> None:
        width = contract.action.size
        row = np.zeros(width, dtype=np.float32) if value is None else np.asarray(value, dtype=np.float32)
        if row.shape != (width,):
            raise PolicyError(
                f"constant policy value has {row.size} entries; the action has {width} (names {contract.action.names})"
            )
        if not np.isfinite(row).all():
            raise PolicyError(f"constant policy value {value} is not finite")
        self.row = row

    def infer(self, batch: PolicyBatch) -> Actions:
        return np.broadcast_to(self.row, (batch.size, 1, self.row.size)).copy()


class FunctionPolicy(BasePolicy):
    """Adapts ``fn(observation_batch) -> [B, A] | [B, T, A]`` to the policy seam."""

    def __init__(self, fn: ObservationFn, contract: Contract, *, name: str | None = None) -> None:
        self.fn = fn
        self.width = contract.action.size
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)
        self.horizon: int | None = _declared_horizon(fn)

    def reset(self) -> None:
        reset = getattr(self.fn, "reset", None)
        if callable(reset):
            reset()

    def infer(self, batch: PolicyBatch) -> Actions:
        return as_chunks(self.fn(batch.observation), batch.size, self.width, source=f"scripted policy {self.name}")


def _declared_horizon(obj: object) -> int | None:
    value = getattr(obj, "horizon", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def scripted_policy(
    target: str | object,
    contract: Contract,
    *,
    args: Mapping[str, Any] | None = None,
    base_dir: Path = Path(),
) -> Policy:
    """A policy from a callable given by import path (or the object itself).

    - a class, or any target given ``args``, is a factory: it is called with ``args`` and must
      return a policy (an object with ``infer``) or an observation function;
    - an object with ``infer`` is used as it is;
    - any other callable is an observation function ``fn(observation_batch)``.
    """
    name = target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))
    resolved: object = load_target(target, base_dir=base_dir, error=PolicyError) if isinstance(target, str) else target
    if inspect.isclass(resolved) or args:
        if not callable(resolved):
            raise PolicyError(f"scripted target {name!r} is not callable, so it cannot take args {dict(args or {})}")
        try:
            resolved = resolved(**dict(args or {}))
        except TypeError as exc:
            raise PolicyError(f"scripted target {name!r} cannot be called with args {dict(args or {})}: {exc}") from exc
    if isinstance(resolved, Policy):
        return resolved
    if callable(resolved):
        return FunctionPolicy(resolved, contract, name=str(name))
    raise PolicyError(
        f"scripted target {name!r} is a {type(resolved).__name__}: expected a policy (with infer), a class or "
        "factory returning one, or a function fn(observation_batch) -> actions"
    )
