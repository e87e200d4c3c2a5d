"""Non-finite screening: a slot whose observation or reward holds NaN or infinity ends as errored.

Such a value is passed on as it came (flagged on the wire), and the slot's episode ends at once,
naming the feature (or the reward) and the step, while the other slots go on. Only float features
can hold one; the check costs one ``isfinite`` per float feature per frame.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    steps: npt.NDArray[np.int64],
) -> NonFinite:
    """Screen the slots among ``rows`` of a batched frame; ``reward`` is ``None`` for a reset.

    ``steps`` are the steps each slot's episode has counted before this frame (steps count from 1).
    """
    num_slots = len(rows)
    found = NonFinite(flagged=np.zeros(num_slots, dtype=np.bool_))

    def when(slot: int) -> str:
        return "at reset" if reward is None else f"at step {int(steps[slot]) + 1}"

    for key in float_features:
        values = observation[key].reshape(num_slots, -1)
        if np.isfinite(values).all():
            continue
        bad = rows & ~np.isfinite(values).all(axis=1)
        found.flagged |= bad
        for slot in np.flatnonzero(bad).tolist():
            found.reasons.setdefault(slot, f"observation {key!r} is not finite {when(slot)} (slot {slot})")
    if reward is not None and not np.isfinite(reward[rows]).all():
        for slot in np.flatnonzero(rows & ~np.isfinite(reward)).tolist():
            found.reasons.setdefault(slot, f"reward {reward[slot]} is not finite {when(slot)} (slot {slot})")
    return found
