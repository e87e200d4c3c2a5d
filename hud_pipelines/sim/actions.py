"""Action frames: validation against the contract, hold actions, conversion to the env's space.

An action frame is ``[N, A]`` (one flat row of ``A`` values per slot). For every *running* slot the
row must be finite; rows of finished slots are ignored and replaced by the hold action, so a client
may send anything there (zeros, its last action, even NaN).

Bounds:

- ``Box`` spaces: out-of-bounds values are clipped into ``[low, high]`` by default
  (:attr:`BoundsMode.CLIP`); :attr:`BoundsMode.ERROR` refuses them instead.
- ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` spaces: values are rounded to the nearest
  integer; a value outside the space is always an error (clipping an index would hide a bug).

Hold actions (what a finished slot receives while the others keep stepping):

- :attr:`HoldMode.LAST` (default): the slot's last applied action, which is the safe choice for
  absolute-pose control where "zero" means "jump to the origin";
- :attr:`HoldMode.ZERO`: zeros, clipped into the bounds.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Feature
from hud_pipelines.errors import ActionError


class HoldMode(StrEnum):
    LAST = "last"
    ZERO = "zero"


class BoundsMode(StrEnum):
    CLIP = "clip"
    ERROR = "error"


class ActionAdapter:
    """Turns ``[N, A]`` action frames into what the env's action space expects."""

    def __init__(
        self,
        feature: Feature,
        space: gym.Space[Any],
        num_slots: int,
        *,
        hold: HoldMode = HoldMode.LAST,
        bounds: BoundsMode = BoundsMode.CLIP,
    ) -> None:
        self.feature = feature
        self.space = space
        self.num_slots = num_slots
        self.hold = hold
        self.bounds = bounds
        self.width = math.prod(feature.shape)
        self.discrete = not isinstance(space, gym.spaces.Box)
        low = np.asarray(feature.low, dtype=np.float64) if feature.low is not None else np.full(self.width, -np.inf)
        high = np.asarray(feature.high, dtype=np.float64) if feature.high is not None else np.full(self.width, np.inf)
        self.low, self.high = low, high
        self._kinds = "biuf" if isinstance(space, gym.spaces.MultiBinary) else "iuf"
        """Accepted action dtype kinds: numbers; bools only for a MultiBinary space."""
        self._zero = np.clip(np.zeros(self.width), low, high)
        self.last = np.tile(self._zero, (num_slots, 1))

    def restart(self) -> None:
        """Forget the last actions at a new episode (a slot that never acted holds zeros)."""
        self.last = np.tile(self._zero, (self.num_slots, 1))

    def spec(self) -> str:
        """What a valid frame looks like, for error messages."""
        return f"expected {self.feature.dtype}[N={self.num_slots}, A={self.width}] (names {self.feature.names})"

    def validate(self, action: object, running: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        """Check a frame and return the ``[N, A]`` rows to apply (hold rows for finished slots)."""
        if not isinstance(action, np.ndarray):
            raise ActionError(f"the action must be an array, got {type(action).__name__}; {self.spec()}")
        frame = cast("npt.NDArray[Any]", action)
        if frame.ndim == 1 and self.width == 1 and frame.shape[0] == self.num_slots:
            frame = frame.reshape(self.num_slots, 1)
        if frame.shape != (self.num_slots, self.width):
            raise ActionError(f"action has shape {list(frame.shape)}, {self.spec()}")
        if frame.dtype.kind not in self._kinds:
            raise ActionError(f"action has dtype {frame.dtype}, {self.spec()}")
        rows = frame.astype(np.float64)
        every_slot = bool(running.all())
        live = rows if every_slot else rows[running]
        if not np.isfinite(live).all():  # the checks below name the slots only when something is wrong
            bad = np.flatnonzero(running)[~np.isfinite(live).all(axis=1)].tolist()
            raise ActionError(f"non-finite action (NaN or inf) for slot(s) {bad}; {self.spec()}, finite")
        if self.discrete:
            np.rint(rows, out=rows)
            live = rows if every_slot else rows[running]
            if (live < self.low).any() or (live > self.high).any():
                raise ActionError(
                    f"action out of the discrete range [{self.low.tolist()}, {self.high.tolist()}] for slot(s) "
                    f"{self._outside(rows, running)}"
                )
        else:
            if self.bounds is BoundsMode.ERROR and ((live < self.low).any() or (live > self.high).any()):
                raise ActionError(
                    f"action out of bounds for slot(s) {self._outside(rows, running)}: low {self.low.tolist()}, "
                    f"high {self.high.tolist()}"
                )
            np.clip(rows, self.low, self.high, out=rows)
        if not every_slot:
            held = self.last if self.hold is HoldMode.LAST else np.broadcast_to(self._zero, rows.shape)
            rows = np.where(running[:, None], rows, held)
        self.last = rows
        return rows

    def _outside(self, rows: npt.NDArray[np.float64], running: npt.NDArray[np.bool_]) -> list[int]:
        """The running slots with a value outside ``[low, high]``."""
        outside = running & ((rows < self.low) | (rows > self.high)).any(axis=1)
        return np.flatnonzero(outside).tolist()

    def to_env(self, rows: npt.NDArray[np.float64], *, batched: bool) -> Any:
        """Reshape and cast rows for the env: one array for a vector env, a list of per-slot actions otherwise."""
        space = self.space
        if isinstance(space, gym.spaces.Discrete):
            batch: npt.NDArray[Any] = rows[:, 0].astype(np.int64)
        elif isinstance(space, gym.spaces.MultiBinary):
            batch = rows.astype(np.int8).reshape((self.num_slots, *space.shape))
        elif isinstance(space, gym.spaces.MultiDiscrete):
            batch = rows.astype(np.int64).reshape((self.num_slots, *space.shape))
        else:
            dtype = cast("np.dtype[Any]", space.dtype)
            batch = rows.astype(dtype).reshape((self.num_slots, *cast("tuple[int, ...]", space.shape)))
        if batched:
            return batch
        return list(batch)
