"""The two ways N slots are backed by envs, behind one batched interface.

- :class:`ReplicatedEnvs`: N independent ``gym.Env`` copies in this process (``N = 1`` is a plain
  single env). A finished slot is simply not stepped again.
- :class:`VectorEnvs`: one gymnasium-style vector env (a factory with ``num_envs`` in its signature,
  or ``gym.make_vec`` for a registry id). Every slot is stepped every tick, so finished slots get
  the hold action and whatever the vector env does afterwards (autoreset) is discarded by the
  caller's mask.

Both write the observations of the slots they stepped into a caller-owned batch buffer (one array
per flattened feature, ``[N, ...]``) after checking each against the contract, and return rewards,
done flags and a per-slot success signal (-1 where the env reported none).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract, flatten_observation, to_numpy
from hud_pipelines.errors import ContractError, TaskArgumentError

SUCCESS_KEYS = ("is_success", "success", "task_success")
"""``info`` keys probed for a success signal, in this order (also inside ``final_info``)."""

ObservationBuffer = dict[str, npt.NDArray[Any]]


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


class SlotEnvs(Protocol):
    """N slots' worth of envs; every method is called on the sim's main thread."""

    num_slots: int
    single_observation_space: gym.Space[Any] | None
    single_action_space: gym.Space[Any]
    metadata: Mapping[str, Any]

    def sample_observation(self) -> tuple[object, list[str]]:
        """One unbatched observation (after a reset) and the per-slot prompts the env offers."""
        ...

    def reset(
        self,
        seeds: list[int | None],
        options: list[dict[str, Any] | None],
        out: ObservationBuffer,
        names: dict[str, str],
    ) -> list[str | None]:
        """Reset every slot, fill ``out``; returns the prompt each env offers (``None`` if none)."""
        ...

    def step(
        self, actions: list[Any] | Any, active: npt.NDArray[np.bool_], out: ObservationBuffer, names: dict[str, str]
    ) -> Tick: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# helpers shared by both backends


def success_of(info: Mapping[str, Any]) -> int:
    """-1 if ``info`` reports no success signal, else 0/1."""
    for key in SUCCESS_KEYS:
        if key in info:
            return int(bool(np.asarray(info[key]).any()))
    return -1


def vector_success(info: Mapping[str, Any], num_slots: int) -> npt.NDArray[np.int8]:
    """Per-slot success from a vector env's info (arrays with ``_key`` masks), ``final_info`` included."""
    result = np.full(num_slots, -1, dtype=np.int8)
    for key in reversed(SUCCESS_KEYS):  # first key in SUCCESS_KEYS wins
        if key in info:
            values = np.asarray(info[key]).reshape(num_slots, -1).any(axis=1)
            mask = np.asarray(info.get(f"_{key}", np.ones(num_slots, dtype=np.bool_)), dtype=np.bool_)
            result[mask] = values[mask]
    final = info.get("final_info")
    if isinstance(final, Mapping):  # gymnasium 1.x, same-step autoreset
        final_mask = np.asarray(info.get("_final_info", np.ones(num_slots, dtype=np.bool_)), dtype=np.bool_)
        inner = vector_success(final, num_slots)  # pyright: ignore[reportUnknownArgumentType]
        use = final_mask & (inner >= 0)
        result[use] = inner[use]
    elif final is not None:  # gymnasium 0.29: an object array of per-slot dicts (None where not done)
        for slot, slot_info in enumerate(list(final)):  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
            if isinstance(slot_info, Mapping):
                signal = success_of(slot_info)  # pyright: ignore[reportUnknownArgumentType]
                if signal >= 0:
                    result[slot] = signal
    return result


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


def write_rows(
    out: ObservationBuffer,
    names: dict[str, str],
    contract: Contract,
    flat: dict[str, npt.NDArray[Any]],
    rows: slice | int | npt.NDArray[np.bool_],
    where: str,
) -> None:
    """Check a flattened observation against the contract and copy it into ``out[key][rows]``."""
    if flat.keys() != names.keys():
        raise ContractError(
            f"{where}: the env returned observation keys {sorted(flat)}, the contract has {sorted(names)}"
        )
    for name, array in flat.items():
        key = names[name]
        feature = contract.features[key]
        expected = out[key][rows].shape
        if array.shape != expected and array.size == int(np.prod(expected)) and array.ndim <= 1:
            array = array.reshape(expected)  # a scalar observation (e.g. Discrete) becomes shape (1,)
        if array.shape != expected or array.dtype != np.dtype(feature.dtype):
            raise ContractError(
                f"{where}: observation {key!r} is {array.dtype}{list(array.shape)}, the contract says "
                f"{feature.dtype}{list(expected)}"
            )
        out[key][rows] = array


def _torch_device(env: Any, sample: object) -> Any:
    """The device of a torch-native env, else ``None``.

    An env counts as torch-native when its observations are tensors; its ``device`` attribute wins
    over the tensors' own device.
    """
    tensors = [leaf for leaf in flatten_observation_raw(sample) if hasattr(leaf, "detach")]
    if not tensors:
        return None
    for holder in (env, getattr(env, "unwrapped", None)):
        device = getattr(holder, "device", None)
        if device is not None:
            return device
    return getattr(tensors[0], "device", None)


def flatten_observation_raw(observation: object) -> list[object]:
    if isinstance(observation, Mapping):
        return [x for v in observation.values() for x in flatten_observation_raw(v)]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(observation, tuple):
        return [x for v in observation for x in flatten_observation_raw(v)]  # pyright: ignore[reportUnknownVariableType]
    return [observation]


def to_env_action(action: Any, device: Any) -> Any:
    """Hand a numpy action to a torch-native env as a tensor on its device."""
    if device is None:
        return action
    import torch  # the env itself imported torch already

    return torch.as_tensor(action, device=device)


# ---------------------------------------------------------------------------------------------
# backends


class ReplicatedEnvs:
    """N copies of a single env in this process; ``N = 1`` is the plain single-env case."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = envs
        self.num_slots = len(envs)
        first = envs[0]
        self.single_observation_space = getattr(first, "observation_space", None)
        self.single_action_space = first.action_space
        self.metadata = getattr(first, "metadata", None) or {}
        self.contract: Contract | None = None
        self._device: Any = None

    def sample_observation(self) -> tuple[object, list[str]]:
        observation, _ = self.envs[0].reset()
        self._device = _torch_device(self.envs[0], observation)
        return observation, []

    def reset(
        self,
        seeds: list[int | None],
        options: list[dict[str, Any] | None],
        out: ObservationBuffer,
        names: dict[str, str],
    ) -> list[str | None]:
        assert self.contract is not None
        for slot, env in enumerate(self.envs):
            observation, _ = env.reset(seed=seeds[slot], options=options[slot])
            write_rows(out, names, self.contract, flatten_observation(observation), slot, f"slot {slot} reset")
        return [prompt_of(env) for env in self.envs]

    def step(
        self, actions: list[Any] | Any, active: npt.NDArray[np.bool_], out: ObservationBuffer, names: dict[str, str]
    ) -> Tick:
        assert self.contract is not None
        tick = Tick.empty(self.num_slots)
        for slot in np.flatnonzero(active):
            try:
                observation, reward, terminated, truncated, info = self.envs[slot].step(
                    to_env_action(actions[slot], self._device)
                )
                write_rows(out, names, self.contract, flatten_observation(observation), int(slot), f"slot {slot} step")
            except Exception:  # the env's own code failed: report it against this slot, keep the others
                tick.errors[int(slot)] = traceback.format_exc()
                continue
            tick.reward[slot] = float(to_numpy(reward))
            tick.terminated[slot] = bool(to_numpy(terminated))
            tick.truncated[slot] = bool(to_numpy(truncated))
            tick.success[slot] = success_of(info)
        return tick

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VectorEnvs:
    """One gymnasium-style vector env serving every slot."""

    def __init__(self, vector_env: Any) -> None:
        self.env = vector_env
        self.num_slots = int(vector_env.num_envs)
        self.single_observation_space = getattr(vector_env, "single_observation_space", None)
        self.single_action_space = vector_env.single_action_space
        self.metadata = getattr(vector_env, "metadata", None) or {}
        self.contract: Contract | None = None
        self._device: Any = None
        self._seed_list = isinstance(vector_env, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv) or bool(
            getattr(vector_env, "per_slot_seeds", False)
        )

    def sample_observation(self) -> tuple[object, list[str]]:
        observation, _ = self.env.reset()
        self._device = _torch_device(self.env, observation)
        first = flatten_observation(observation)
        return _unflatten_row(observation, 0, first), []

    def _seed_argument(self, seeds: list[int | None]) -> int | list[int | None] | None:
        if self._seed_list:
            return seeds
        # A vector env that takes one seed draws every slot from it: slot 0's seed stands for the batch.
        return seeds[0]

    def reset(
        self,
        seeds: list[int | None],
        options: list[dict[str, Any] | None],
        out: ObservationBuffer,
        names: dict[str, str],
    ) -> list[str | None]:
        assert self.contract is not None
        distinct = {repr(o) for o in options}
        if len(distinct) > 1:
            raise TaskArgumentError(
                "a vector env takes one options dict for all slots; the tasks of this reset differ in 'options'"
            )
        observation, _ = self.env.reset(seed=self._seed_argument(seeds), options=options[0])
        write_rows(out, names, self.contract, flatten_observation(observation), slice(None), "reset")
        return [prompt_of(self.env)] * self.num_slots

    def step(
        self, actions: list[Any] | Any, active: npt.NDArray[np.bool_], out: ObservationBuffer, names: dict[str, str]
    ) -> Tick:
        assert self.contract is not None
        observation, reward, terminated, truncated, info = self.env.step(to_env_action(actions, self._device))
        flat = flatten_observation(observation)
        scratch = {k: np.empty_like(v) for k, v in out.items()}
        write_rows(scratch, names, self.contract, flat, slice(None), "step")
        for key, rows in scratch.items():
            out[key][active] = rows[active]
        return Tick(
            reward=to_numpy(reward).astype(np.float64).reshape(self.num_slots),
            terminated=to_numpy(terminated).astype(np.bool_).reshape(self.num_slots),
            truncated=to_numpy(truncated).astype(np.bool_).reshape(self.num_slots),
            success=vector_success(info, self.num_slots),
        )

    def close(self) -> None:
        self.env.close()


def _unflatten_row(observation: object, row: int, flat: dict[str, npt.NDArray[Any]]) -> object:
    """Row ``row`` of a batched observation, keeping its dict nesting (for contract derivation)."""
    if isinstance(observation, Mapping):
        return {k: _unflatten_row(v, row, flat) for k, v in observation.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(observation, tuple):
        return tuple(_unflatten_row(v, row, flat) for v in observation)  # pyright: ignore[reportUnknownVariableType]
    return to_numpy(observation)[row]
