"""Action frames: validation against the contract, hold actions, conversion to the env's space.

An action frame is ``[N, A]`` (one flat row of ``A`` values per slot). A frame of the wrong shape or
dtype is refused whole. For every *running* slot the row must be finite and, where the space says
so, in range; a row that is not is refused alone: that slot's episode ends as errored and the
other slots step. Rows of finished slots are ignored and replaced by the hold action, so a client
may send anything there (zeros, its last action, even NaN).

Bounds:

- ``Box`` spaces: out-of-bounds values are clipped into ``[low, high]`` by default
  (:attr:`BoundsMode.CLIP`); :attr:`BoundsMode.ERROR` refuses the row instead.
- ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` spaces: values are rounded to the nearest
  integer; a value outside the space is always an error (clipping an index would hide a bug).

Hold actions (what a finished slot receives while the others keep stepping):

- :attr:`HoldMode.LAST` (default): the slot's last applied action, which is the safe choice for
  absolute-pose control where "zero" means "jump to the origin";
- :attr:`HoldMode.ZERO`: zeros, clipped into the bounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Feature
from hud_pipelines.errors import ActionError, ContractError
from hud_pipelines.sim.slots import every
from hud_pipelines.wire.codec import is_array


class HoldMode(StrEnum):
    """What a finished slot receives while the others keep stepping."""

    LAST = "last"
    """Its last action (the default: zero can be unsafe for absolute-pose control)."""
    ZERO = "zero"


class BoundsMode(StrEnum):
    """What happens to a continuous action outside the contract's bounds."""

    CLIP = "clip"
    """It is clipped to the bounds."""
    ERROR = "error"
    """Its slot ends as errored, naming the action and the bounds."""


@dataclasses.dataclass(eq=False, repr=False)
class ActionAdapter:
    """Turns ``[N, A]`` action frames into what the env's action space expects."""

    feature: Feature
    space: gym.Space[Any]
    num_slots: int
    _: dataclasses.KW_ONLY
    hold: HoldMode = HoldMode.LAST
    bounds: BoundsMode = BoundsMode.CLIP

    def __post_init__(self) -> None:
        feature, space = self.feature, self.space
        self.width = math.prod(feature.shape)
        self.discrete = not isinstance(space, gym.spaces.Box)
        low = np.asarray(feature.low, dtype=np.float64) if feature.low is not None else np.full(self.width, -np.inf)
        high = np.asarray(feature.high, dtype=np.float64) if feature.high is not None else np.full(self.width, np.inf)
        self.low, self.high = low, high
        self._kinds = "biuf" if isinstance(space, gym.spaces.MultiBinary) else "iuf"
        """Accepted action dtype kinds: numbers; bools only for a MultiBinary space."""
        self._zero = np.clip(np.zeros(self.width), low, high)
        self.last = np.tile(self._zero, (self.num_slots, 1))

    def restart(self) -> None:
        """Forget the last actions at a new episode (a slot that never acted holds zeros)."""
        self.last = np.tile(self._zero, (self.num_slots, 1))

    def spec(self, *, scalar: bool = False) -> str:
        """What a valid frame looks like, in the client's framing, for error messages."""
        if scalar:
            return f"expected {self.feature.dtype}[A={self.width}] (names {self.feature.names})"
        return f"expected {self.feature.dtype}[N={self.num_slots}, A={self.width}] (names {self.feature.names})"

    def row_spec(self) -> str:
        """What one slot's row must be: dtype, width, names and, where bounded, the bounds."""
        spec = f"{self.feature.dtype}[A={self.width}] (names {self.feature.names})"
        if np.isfinite(self.low).any() or np.isfinite(self.high).any():
            spec += f" within low {self.low.tolist()}, high {self.high.tolist()}"
        return spec

    def validate(
        self, action: object, running: npt.NDArray[np.bool_], where: Callable[[int], str], *, scalar: bool = False
    ) -> tuple[npt.NDArray[np.float64], dict[int, str]]:
        """Check a frame; returns the ``[N, A]`` rows to apply and the running slots whose row is refused.

        A frame of the wrong type, shape or dtype is refused whole (:class:`ActionError`); a running
        slot's row that is not finite or out of range is refused alone, with the reason: that slot
        gets the hold action like a finished one, and the caller ends its episode. ``scalar`` words
        the errors in scalar framing (no slot axis), as the client sent the frame. ``where(slot)`` names a
        refused row's episode (``seed 5, step 3``): the same episode is refused in the same words whichever
        slot ``num_envs`` put it in.
        """
        frame = self._frame(action, scalar)
        rows = frame.astype(np.float64)
        if self.discrete:
            np.rint(rows, out=rows)
        if self._all_valid(rows, running):  # the usual frame: every slot runs and every row is fine
            if not self.discrete:
                np.clip(rows, self.low, self.high, out=rows)
            self.last = rows
            return rows, {}
        refused: dict[int, str] = {}
        finite: npt.NDArray[np.bool_] = np.all(np.isfinite(rows), axis=1)
        if not finite[running].all():
            for slot in np.flatnonzero(running & ~finite).tolist():
                refused[slot] = f"action {frame[slot].tolist()} is not finite ({where(slot)}); {self._expected()}"
        checked = running & finite
        if self.discrete:
            for slot in self._outside(rows, checked):
                refused[slot] = (
                    f"action {frame[slot].tolist()} is outside the discrete range ({where(slot)}); {self._expected()}"
                )
        else:
            if self.bounds is BoundsMode.ERROR:
                for slot in self._outside(rows, checked):
                    refused[slot] = (
                        f"action {frame[slot].tolist()} is out of bounds ({where(slot)}); {self._expected()}"
                    )
            np.clip(rows, self.low, self.high, out=rows)
        applied = running.copy()
        applied[list(refused)] = False
        if not applied.all():
            held = self.last if self.hold is HoldMode.LAST else np.broadcast_to(self._zero, rows.shape)
            rows = np.where(applied[:, None], rows, held)
        self.last = rows
        return rows, refused

    def _all_valid(self, rows: npt.NDArray[np.float64], running: npt.NDArray[np.bool_]) -> bool:
        """Whether every slot runs and no row needs refusing: two whole-frame checks instead of per-slot masks.

        Discrete rows (already rounded) and rows under :attr:`BoundsMode.ERROR` must lie within the
        bounds (which a NaN never does); clipped continuous rows need only be finite.
        """
        if not every(running):
            return False
        if self.discrete or self.bounds is BoundsMode.ERROR:
            return every((rows >= self.low) & (rows <= self.high))
        return every(np.isfinite(rows))

    def _frame(self, action: object, scalar: bool) -> npt.NDArray[Any]:
        """The frame as ``[N, A]``, or an :class:`ActionError` naming what the client sent and what is expected."""
        if not is_array(action):
            raise ActionError(f"the action must be an array, got {type(action).__name__}; {self.spec(scalar=scalar)}")
        frame = action
        if frame.ndim == 1 and self.width == 1 and frame.shape[0] == self.num_slots:
            frame = frame.reshape(self.num_slots, 1)
        if frame.shape != (self.num_slots, self.width):
            sent = list(frame.shape[1:]) if scalar and frame.ndim >= 1 else list(frame.shape)
            raise ActionError(f"action has shape {sent}, {self.spec(scalar=scalar)}")
        if frame.dtype.kind not in self._kinds:
            raise ActionError(f"action has dtype {frame.dtype}, {self.spec(scalar=scalar)}")
        return frame

    def _expected(self) -> str:
        return f"expected a finite {self.row_spec()}"

    def _outside(self, rows: npt.NDArray[np.float64], checked: npt.NDArray[np.bool_]) -> list[int]:
        """The ``checked`` slots with a value outside ``[low, high]``."""
        outside = checked & ((rows < self.low) | (rows > self.high)).any(axis=1)
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
        elif _is_box(space):
            batch = rows.astype(space.dtype).reshape((self.num_slots, *space.shape))
        else:  # the contract refused any other space already
            raise ContractError(f"unsupported action space {space!r}: use Box, Discrete, MultiDiscrete or MultiBinary")
        if batched:
            return batch
        return list(batch)


def _is_box(space: object) -> TypeGuard[gym.spaces.Box]:
    """A ``Box`` space (gymnasium leaves the dtype and shape of a narrowed space partly untyped)."""
    return isinstance(space, gym.spaces.Box)
