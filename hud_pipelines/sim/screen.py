"""Non-finite screening: a slot whose observation or reward holds NaN or infinity ends as errored.

Such a value is passed on as it came (flagged on the wire), and the slot's episode ends at once,
naming the feature (or the reward), the seed and the step, while the other slots go on. Only float features
can hold one; the check costs one ``isfinite`` per float feature per frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.sim.slots import every


@dataclass
class NonFinite:
    """What one frame's screening found."""

    flagged: npt.NDArray[np.bool_]
    """Slots whose observation holds NaN or infinity."""
    reasons: dict[int, str] = field(default_factory=dict[int, str])
    """Each slot to end, and why (the first non-finite feature, else its reward)."""


def all_finite(
    observation: Mapping[str, npt.NDArray[Any]], float_features: list[str], reward: npt.NDArray[Any] | None
) -> bool:
    """Whether every float feature and the whole reward (``None``: a reset) are finite: the usual
    frame, which then needs no screening slot by slot."""
    if reward is not None and not every(np.isfinite(reward)):
        return False
    return all(every(np.isfinite(observation[key])) for key in float_features)


def screen_nonfinite(
    observation: Mapping[str, npt.NDArray[Any]],
    float_features: list[str],
    rows: npt.NDArray[np.bool_],
    reward: npt.NDArray[np.float64] | None,
    where: Callable[[int], str],
) -> NonFinite:
    """Screen the slots among ``rows`` of a batched frame; ``reward`` is ``None`` for a reset.

    ``where(slot)`` names the slot's episode (``seed 7, step 2``), not the slot: which slot a seed runs in
    depends on ``num_envs``, and the words of an episode's end must not.
    """
    num_slots = len(rows)
    found = NonFinite(flagged=np.zeros(num_slots, dtype=np.bool_))

    def when(slot: int) -> str:
        return f"at reset ({where(slot)})" if reward is None else f"({where(slot)})"

    for key in float_features:
        values = observation[key].reshape(num_slots, -1)
        if np.isfinite(values).all():
            continue
        bad = rows & ~np.isfinite(values).all(axis=1)
        found.flagged |= bad
        for slot in np.flatnonzero(bad).tolist():
            found.reasons.setdefault(slot, f"observation {key!r} is not finite {when(slot)}")
    if reward is not None and not np.isfinite(reward[rows]).all():
        for slot in np.flatnonzero(rows & ~np.isfinite(reward)).tolist():
            found.reasons.setdefault(slot, f"reward {reward[slot]} is not finite {when(slot)}")
    return found
