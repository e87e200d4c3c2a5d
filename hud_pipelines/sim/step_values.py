"""What an env's ``step`` returns besides the observation, read strictly: the reward, the done flags and the
success signal in ``info``.

Python's truthiness would read ``"no"``, ``"False"`` and NaN as true, ending an episode or counting a success
the env never gave; each reader here takes the values that mean what they say and names anything else as the
env's error (its slot errors, never fails). Both backends (:mod:`hud_pipelines.sim.envs`) and ``wrap()`` read
through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract.observations import is_mapping, is_tuple, to_numpy

_NUMBERS = (float, int)
SUCCESS_KEYS = ("is_success", "success", "task_success")
"""``info`` keys probed for a success signal, in this order (also inside ``final_info``)."""


def success_of(info: Mapping[str, Any]) -> int:
    """-1 if ``info`` reports no success signal (none of :data:`SUCCESS_KEYS`, or ``None`` there), else 0/1."""
    if not info:  # the usual info of a state env, read for every slot of every step
        return -1
    for key in SUCCESS_KEYS:
        if key in info:
            signal = _signal(info[key], key)
            return -1 if signal is None else int(bool(signal.any()))
    final = info.get("final_info")
    if is_mapping(final):
        return success_of(final)
    return -1


def vector_success(info: Mapping[str, Any], num_slots: int) -> npt.NDArray[np.int8]:
    """Per-slot success from a vector env's info (arrays with ``_key`` masks), ``final_info`` included."""
    result = np.full(num_slots, -1, dtype=np.int8)
    for key in reversed(SUCCESS_KEYS):  # first key in SUCCESS_KEYS wins
        if key in info:
            mask = np.asarray(info.get(f"_{key}", np.ones(num_slots, dtype=np.bool_)), dtype=np.bool_)
            values = np.asarray(info[key]).reshape(num_slots, -1)
            if values.dtype == object:  # gymnasium keeps np.bool_ and None values in an object array: slot by slot
                for slot in np.flatnonzero(mask).tolist():
                    signal = _signal(values[slot, 0] if values.shape[1] == 1 else values[slot], key, given=info[key])
                    result[slot] = -1 if signal is None else int(bool(signal.any()))
                continue
            signal = _signal(values[mask], key, given=info[key])
            if signal is not None:
                result[mask] = signal.any(axis=1)
    final: object = info.get("final_info")
    if is_mapping(final):  # gymnasium 1.x, same-step autoreset
        final_mask = np.asarray(info.get("_final_info", np.ones(num_slots, dtype=np.bool_)), dtype=np.bool_)
        inner = vector_success(final, num_slots)
        use = final_mask & (inner >= 0)
        result[use] = inner[use]
    elif final is not None:  # gymnasium 0.29: an object array of per-slot dicts (None where not done)
        per_slot: list[object] = list(np.asarray(final, dtype=object).reshape(-1))
        for slot, slot_info in enumerate(per_slot):
            if is_mapping(slot_info):
                signal = success_of(slot_info)
                if signal >= 0:
                    result[slot] = signal
    return result


def _signal(value: object, key: str, given: object = None) -> npt.NDArray[np.bool_] | None:
    """A success signal as booleans (``None``: the env gave none this step). A NaN, a string or an object is
    the env's error: ``bool(float("nan"))`` and ``bool("False")`` are true, and would count as successes."""
    if value is None:
        return None
    array = np.asarray(to_numpy(value))
    if array.dtype == np.bool_:
        return array
    if array.dtype.kind in "iu" or (array.dtype.kind == "f" and np.isfinite(array).all()):
        return array != 0
    shown = value if given is None else given  # what the env put in its info (a vector env's: every slot's)
    raise TypeError(
        f"env info[{key!r}]={shown!r:.80} ({type(shown).__name__}): a success signal must be a bool or a finite number"
    )


def reward_of(value: object) -> float:
    """One slot's reward as a float; anything but one number is the env's error, said naming the reward."""
    if isinstance(value, _NUMBERS):  # the usual cases, first: this runs for every slot of every step
        return float(value)
    array = np.asarray(to_numpy(value))
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise TypeError(f"env.step returned reward={value!r:.80} ({type(value).__name__}): it must be one number")
    return float(array.reshape(()))


def flag(value: object, name: str) -> bool:
    """One slot's ``terminated`` or ``truncated``: a bool (or a 0/1 integer, or a tensor of one)."""
    kind = type(value)
    if kind is bool or kind is np.bool_:  # the usual cases, first: this runs for every slot of every step
        return bool(value)
    return bool(flags(value, name).reshape(()))


def flags(value: object, name: str) -> npt.NDArray[np.bool_]:
    """``terminated`` or ``truncated`` as booleans; anything else (``"no"``, ``0.5``, ``None``) is the env's
    error: ``bool("no")`` is true, and would end an episode as if the env had said so."""
    array = np.asarray(to_numpy(value))
    if array.dtype == np.bool_:
        return array
    if array.dtype.kind in "iuf" and np.isin(array, (0, 1)).all():  # 0 or 1 (float dones, as Brax gives)
        return array.astype(np.bool_)
    raise TypeError(f"env.step returned {name}={value!r:.80} ({type(value).__name__}): it must be a bool")


def reset_observation(returned: object) -> Any:
    """The observation of what ``env.reset`` returned, which gymnasium's API makes ``(observation, info)``.

    An old gym-style ``reset`` returns the observation alone: unpacked as a pair, a 2-vector became an
    observation of its first value and an ``info`` of its second, and the run went on with them.
    """
    if is_tuple(returned) and len(returned) == 2 and is_mapping(returned[1]):
        return returned[0]
    raise TypeError(
        f"env.reset must return (observation, info), as gymnasium's API says; it returned {_shown(returned)}"
    )


def step_returns(returned: object) -> tuple[Any, Any, Any, Any, Mapping[Any, object]]:
    """``(observation, reward, terminated, truncated, info)`` of what ``env.step`` returned, or an error saying what
    came instead (an old gym-style ``step`` returns four values, with one ``done``)."""
    if is_tuple(returned) and len(returned) == 5 and is_mapping(info := returned[4]):
        observation, reward, terminated, truncated = returned[:4]
        return observation, reward, terminated, truncated, info
    raise TypeError(
        "env.step must return (observation, reward, terminated, truncated, info), as gymnasium's API says; it "
        f"returned {_shown(returned)}"
    )


def _shown(value: object) -> str:
    if is_tuple(value):
        return f"a tuple of {len(value)}: ({', '.join(_shown(item) for item in value)})"
    array = to_numpy(value) if hasattr(value, "shape") and hasattr(value, "dtype") else None  # numpy's or torch's
    return type(value).__name__ if array is None else f"an array {array.dtype}{list(array.shape)}"
