"""The two ways N slots are backed by envs, behind one batched interface.

- :class:`ReplicatedEnvs`: N independent ``gym.Env`` copies in this process (``N = 1`` is a plain
  single env). A finished slot is simply not stepped again.
- :class:`VectorEnvs`: one gymnasium-style vector env (a factory with ``num_envs`` in its signature,
  or ``gym.make_vec`` for a registry id). Every slot is stepped every tick, so finished slots get
  the hold action and whatever the vector env does afterwards (autoreset) is discarded by the
  caller's mask.

Both write the observations of the slots they stepped into a caller-owned batch buffer (one array
per contract feature, ``[N, ...]``) after checking each against the contract, and return rewards,
done flags and a per-slot success signal (-1 where the env reported none).
"""

from __future__ import annotations

import logging
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract
from hud_pipelines.contract.observations import flatten_observation, leaves, observation_row, to_numpy
from hud_pipelines.errors import EnvFault, Phase, TaskArgumentError
from hud_pipelines.sim.observation_rows import ObservationBuffer, copied_bare, write_rows
from hud_pipelines.sim.slots import every
from hud_pipelines.sim.step_values import (
    flag,
    flags,
    reset_observation,
    reward_of,
    step_returns,
    success_of,
    vector_success,
)

log = logging.getLogger(__name__)

ENV_FAILURES = (Exception, SystemExit)
"""What an env's own code raises that fails its episodes, not the sim: any exception, and ``SystemExit`` (a pygame
env calls ``sys.exit()`` when its window is closed), which otherwise ended the server with no word of why. A
``KeyboardInterrupt`` is the server's second stop signal: it stops the sim."""
START_UP = "at start-up"
REBUILD = "of a rebuild"

IDLE_HOOK = "idle_hook"
"""An env method of this name, if present, is run by the sim's main thread between requests."""


@dataclass(frozen=True)
class ProbeReset:
    """The arguments of the reset that samples one observation of freshly built envs, to derive the contract from.

    An env whose ``reset`` needs its task's options (``options["difficulty"]``) cannot start from a
    reset without them: a pipeline's sim probes with its first tasks' seeds and options in turn, the
    first reset that works giving the sample (``hud-pipelines serve --probe-seed --probe-options``, each
    repeatable), so one task whose options break ``reset`` errors its own episodes and no others'; a
    reset that rebuilds the envs probes with its own first slot's. Either way a sim is probed the same
    way every time it starts, so its contract is too.
    """

    seed: int | None = None
    options: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"env.reset(seed={self.seed!r}, options={self.options!r})"


@dataclass
class Started:
    """What one reset produced: each slot's offered prompt, and the slots whose env raised."""

    prompts: list[str | None]
    errors: dict[int, str] = field(default_factory=dict[int, str])
    """Per-slot tracebacks of exceptions raised by that slot's env (replicated envs only)."""
    unbuilt: set[int] = field(default_factory=set[int])
    """Slots among ``errors`` whose env raised while it was built anew, before its reset."""


@dataclass
class Tick:
    """What one lockstep step produced; rows of slots that were not stepped are meaningless."""

    reward: npt.NDArray[np.float64]
    terminated: npt.NDArray[np.bool_]
    truncated: npt.NDArray[np.bool_]
    success: npt.NDArray[np.int8]
    errors: dict[int, str] = field(default_factory=dict[int, str])
    """Per-slot tracebacks of exceptions raised by that slot's env (replicated envs only)."""

    @classmethod
    def empty(cls, num_slots: int) -> Tick:
        return cls(
            reward=np.zeros(num_slots, dtype=np.float64),
            terminated=np.zeros(num_slots, dtype=np.bool_),
            truncated=np.zeros(num_slots, dtype=np.bool_),
            success=np.full(num_slots, -1, dtype=np.int8),
        )


class SlotEnvs(ABC):
    """N slots' worth of envs; every method is called on the sim's main thread.

    ``contract`` and ``names`` (flattened observation key -> contract feature) are set by the
    bridge once the contract is resolved, before the first ``reset``.
    """

    num_slots: int
    single_observation_space: gym.Space[Any] | None
    single_action_space: gym.Space[Any]
    source: Any
    """The env the contract is derived from (its metadata, registry id, rate): the first replica or the vector env."""

    def __init__(self) -> None:
        self.contract: Contract | None = None
        self.names: dict[str, str] = {}
        self.device: Any = None
        """The torch device of a torch-native env (its observations are tensors), else ``None``."""

    @abstractmethod
    def sample_observation(self, probe: ProbeReset) -> object:
        """One unbatched observation (after a reset with ``probe``'s arguments), for contract derivation."""

    def probe(self, probe: ProbeReset, *, when: str) -> object:
        """:meth:`sample_observation`; an error of the env's says it was the probe reset, ``when``, and its
        arguments: the episodes' resets come later, with each slot's own seed and options."""
        try:
            return self.sample_observation(probe)
        except ENV_FAILURES as exc:  # the env's own code: its traceback (formatted) says where
            hint = (
                "a rebuild probes with its first slot's seed and options"
                if when == REBUILD
                else "a pipeline probes with its first tasks' seeds and options in turn; hud-pipelines serve takes "
                "them as --probe-seed and --probe-options"
            )
            raise EnvFault(
                Phase.RESET,
                f"the probe reset {when}, {probe}, which samples one observation to derive the contract, raised "
                f"{type(exc).__name__}: {exc} ({hint})",
                slot=None,
                formatted=traceback.format_exc(),
            ) from exc

    @abstractmethod
    def reset(self, seeds: list[int | None], options: list[dict[str, Any] | None], out: ObservationBuffer) -> Started:
        """Reset every slot, fill ``out``; the prompt each env offers (``None`` if none) and per-slot faults."""

    @abstractmethod
    def step(self, actions: Any, active: npt.NDArray[np.bool_], out: ObservationBuffer) -> Tick:
        """Step the slots; only ``active`` rows of ``out`` are written."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def idle_hook(self) -> Any:
        """The env's own ``idle_hook`` callable, if it offers one."""

    def write(self, out: ObservationBuffer, flat: dict[str, npt.NDArray[Any]], rows: slice | int, where: str) -> None:
        assert self.contract is not None, "the bridge sets the contract before the first reset"
        write_rows(out, self.names, self.contract, flat, rows, where)

    def write_slot(self, out: ObservationBuffer, observation: object, slot: int, phase: str) -> None:
        """One slot's observation into ``out``. A bare array of the contract's one feature's shape and dtype, the
        usual step of a state env, is copied at once: the checks of :meth:`write` hold for it, and their cost
        (flattening, the message's text) is per slot and per step."""
        key = self.names.get("") if len(self.names) == 1 else None
        if key is None or not copied_bare(out[key], observation, slot):
            self.write(out, flatten_observation(observation), slot, phase)  # the bridge names the seed and step


# ---------------------------------------------------------------------------------------------
# helpers shared by both backends


def prompt_of(env: Any) -> str | None:
    """The task description an env offers, if any (``task_description``, ``instruction``, ``prompt``)."""
    for holder in (env, getattr(env, "unwrapped", None)):
        for attribute in ("task_description", "instruction", "prompt"):
            value = getattr(holder, attribute, None)
            if callable(value):
                value = value()
            if isinstance(value, str) and value:
                return value
    return None


def torch_device_of(env: Any, sample: object) -> Any:
    """The device of a torch-native env, else ``None``.

    An env counts as torch-native when its observations are tensors; its ``device`` attribute wins
    over the tensors' own device.
    """
    tensors = [leaf for leaf in leaves(sample) if hasattr(leaf, "detach")]
    if not tensors:
        return None
    for holder in (env, getattr(env, "unwrapped", None)):
        device = getattr(holder, "device", None)
        if device is not None:
            return device
    return getattr(tensors[0], "device", None)


def to_env_action(action: Any, device: Any) -> Any:
    """Hand a numpy action to a torch-native env as a tensor on its device."""
    if device is None:
        return action
    import torch  # the env itself imported torch already

    return torch.as_tensor(action, device=device)


def _idle_hook_of(*holders: Any) -> Any:
    for holder in holders:
        hook = getattr(holder, IDLE_HOOK, None)
        if callable(hook):
            return hook
    return None


# ---------------------------------------------------------------------------------------------
# backends


class ReplicatedEnvs(SlotEnvs):
    """N copies of a single env in this process; ``N = 1`` is the plain single-env case.

    A copy whose ``reset`` or ``step`` raised is built anew (``build_one``) before its slot's next reset: it may be
    broken for good (gymnasium's env checker, whose first reset raised, refuses the first step after), and a slot's
    next episode must start as it would on any other slot of any split, never from another episode's wreck.
    """

    def __init__(self, envs: list[Any], build_one: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self.envs = envs
        self.build_one = build_one
        self.spoilt: set[int] = set()
        """Slots whose env raised: built anew at their next reset."""
        self.num_slots = len(envs)
        first = envs[0]
        self.source = first
        self.single_observation_space = getattr(first, "observation_space", None)
        self.single_action_space = first.action_space

    def idle_hook(self) -> Any:
        first = self.envs[0]
        return _idle_hook_of(first, getattr(first, "unwrapped", None))

    def sample_observation(self, probe: ProbeReset) -> object:
        observation = reset_observation(self.envs[0].reset(seed=probe.seed, options=probe.options))
        self.device = torch_device_of(self.envs[0], observation)
        return observation

    def reset(self, seeds: list[int | None], options: list[dict[str, Any] | None], out: ObservationBuffer) -> Started:
        started = Started(prompts=[None] * self.num_slots)
        for slot in range(self.num_slots):
            try:
                env = self._fresh(slot)
            except ENV_FAILURES:  # still spoilt: built anew again at the slot's next reset
                started.errors[slot] = traceback.format_exc()
                started.unbuilt.add(slot)
                continue
            try:
                observation = reset_observation(env.reset(seed=seeds[slot], options=options[slot]))
                self.write_slot(out, observation, slot, "reset")
            except ENV_FAILURES:  # this slot's env failed (or returned what the contract refuses): it errors alone
                started.errors[slot] = traceback.format_exc()
                self.spoilt.add(slot)
                continue
            started.prompts[slot] = prompt_of(env)
        return started

    def _fresh(self, slot: int) -> Any:
        """Slot ``slot``'s env, built anew first when it raised."""
        if slot in self.spoilt and self.build_one is not None:
            built = self.build_one()
            close_env(self.envs[slot])
            self.envs[slot] = built
            self.spoilt.discard(slot)
        return self.envs[slot]

    def step(self, actions: Any, active: npt.NDArray[np.bool_], out: ObservationBuffer) -> Tick:
        tick = Tick.empty(self.num_slots)
        for slot in np.flatnonzero(active).tolist():
            try:
                observation, reward, terminated, truncated, info = step_returns(
                    self.envs[slot].step(to_env_action(actions[slot], self.device))
                )
                self.write_slot(out, observation, slot, "step")
                tick.reward[slot] = reward_of(reward)
                tick.terminated[slot] = flag(terminated, "terminated")
                tick.truncated[slot] = flag(truncated, "truncated")
                tick.success[slot] = success_of(info)
            except ENV_FAILURES:  # the env's own code failed: report it against this slot, keep the others
                tick.errors[slot] = traceback.format_exc()
                self.spoilt.add(slot)
        return tick

    def close(self) -> None:
        for env in self.envs:
            close_env(env)


class VectorEnvs(SlotEnvs):
    """One gymnasium-style vector env serving every slot."""

    def __init__(self, vector_env: Any, *, per_slot_seeds: bool = False) -> None:
        super().__init__()
        self.env = vector_env
        self.source = vector_env
        self.num_slots = int(vector_env.num_envs)
        self.single_observation_space = getattr(vector_env, "single_observation_space", None)
        self.single_action_space = vector_env.single_action_space
        self.per_slot_seeds = takes_seed_list(vector_env, default=per_slot_seeds)
        """Whether ``reset`` takes a list of seeds; otherwise one seed seeds the whole batch."""
        self._scratch: ObservationBuffer = {}

    def idle_hook(self) -> Any:
        return _idle_hook_of(self.env, getattr(self.env, "unwrapped", None))

    def sample_observation(self, probe: ProbeReset) -> object:
        seeds = [probe.seed] * self.num_slots
        observation = reset_observation(self.env.reset(seed=self._seed_argument(seeds), options=probe.options))
        self.device = torch_device_of(self.env, observation)
        return observation_row(observation, 0)

    def _seed_argument(self, seeds: list[int | None]) -> int | list[int | None] | None:
        """What ``reset(seed=...)`` gets; the bridge refuses distinct seeds for a one-seed env beforehand."""
        if all(seed is None for seed in seeds):
            return None
        if self.per_slot_seeds:
            return seeds
        assert len(set(seeds)) == 1, "the bridge refuses distinct per-slot seeds for a one-seed vector env"
        return seeds[0]

    def reset(self, seeds: list[int | None], options: list[dict[str, Any] | None], out: ObservationBuffer) -> Started:
        if len({repr(o) for o in options}) > 1:
            raise TaskArgumentError(
                "a vector env takes one options dict for all slots; the tasks of this reset differ in 'options'"
            )
        observation = reset_observation(self.env.reset(seed=self._seed_argument(seeds), options=options[0]))
        self.write(out, flatten_observation(observation), slice(None), "reset")
        return Started(prompts=[prompt_of(self.env)] * self.num_slots)

    def step(self, actions: Any, active: npt.NDArray[np.bool_], out: ObservationBuffer) -> Tick:
        observation, reward, terminated, truncated, info = step_returns(
            self.env.step(to_env_action(actions, self.device))
        )
        flat = flatten_observation(observation)
        if every(active):
            self.write(out, flat, slice(None), "step")
        else:  # finished slots keep their final observation: autoreset data never reaches them
            if not self._scratch:
                self._scratch = {k: np.empty_like(v) for k, v in out.items()}
            self.write(self._scratch, flat, slice(None), "step")
            for key, rows in self._scratch.items():
                out[key][active] = rows[active]
        return Tick(
            reward=to_numpy(reward).astype(np.float64).reshape(self.num_slots),
            terminated=flags(terminated, "terminated").reshape(self.num_slots),
            truncated=flags(truncated, "truncated").reshape(self.num_slots),
            success=vector_success(info, self.num_slots),
        )

    def close(self) -> None:
        close_env(self.env)


def close_env(env: Any) -> None:
    """Close one env; its own failure to (``sys.exit()`` in a pygame teardown too) is logged and left at that: a
    close must neither end the sim nor fail the rebuild that follows it."""
    try:
        env.close()
    except ENV_FAILURES:
        log.warning("closing %s raised; going on without it", type(env).__name__, exc_info=True)


def takes_seed_list(vector_env: Any, *, default: bool) -> bool:
    """Whether a vector env's ``reset`` seeds each slot from its own entry of a list of seeds.

    An env says so itself with a ``per_slot_seeds`` attribute; gymnasium's ``SyncVectorEnv`` and
    ``AsyncVectorEnv`` do; for any other env ``default`` decides (the bridge passes true for a
    project factory, which the gymnasium vector API allows a list, and false for a registry id's
    ``vector_entry_point``, whose envs take one int).
    """
    for holder in (vector_env, getattr(vector_env, "unwrapped", None)):
        declared = getattr(holder, "per_slot_seeds", None)
        if isinstance(declared, bool):
            return declared
        if isinstance(holder, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv):
            return True
    return default
