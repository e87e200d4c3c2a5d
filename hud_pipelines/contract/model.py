"""The contract's model: named features (role, type, dtype, shape, names, bounds), the control rate, the robot type.

A contract is what the sim, the agent and the dataset agree on. It is frozen: deriving
(:mod:`.derive`) and the editable file (:mod:`.file`) build new ones.

Feature naming:

- a ``Dict`` (or ``Tuple``) observation is flattened, nested keys joined with ``/``;
- a bare observation is called ``image`` when it looks like a camera, else ``state``;
- the action is always the single feature ``action``, a flat vector of ``A`` values;
- per-dimension names default to ``<feature>_<i>`` (``state_0``, ``robot/joints_2``, ``action_1``).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CONTRACT_VERSION = 1
ACTION = "action"
CAMERA_NAMES = ["height", "width", "channel"]


class FeatureType(StrEnum):
    """What a feature holds; the camera types tell consumers how to read the pixels."""

    STATE = "state"
    RGB = "rgb"
    BGR = "bgr"
    GRAY = "gray"
    DEPTH = "depth"

    @property
    def is_camera(self) -> bool:
        return self is not FeatureType.STATE


class Feature(BaseModel):
    """One named array of the contract, without the batch axis."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")  # unbounded: Infinity

    role: Literal["observation", "action"]
    type: FeatureType = FeatureType.STATE
    dtype: str = Field(description="numpy dtype name, e.g. float32, uint8, int64, bool")
    shape: tuple[int, ...]
    names: list[str] | None = Field(
        default=None,
        description="one name per element for vectors; ['height', 'width', 'channel'] for cameras",
    )
    description: str | None = None
    low: list[float] | None = Field(default=None, description="flat lower bounds, when known")
    high: list[float] | None = Field(default=None, description="flat upper bounds, when known")

    @field_validator("shape")
    @classmethod
    def _holds_values(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(axis < 1 for axis in shape):
            raise ValueError(f"every axis of a feature's shape is at least 1: {list(shape)} holds no value")
        return shape

    @field_validator("dtype")
    @classmethod
    def _numpy_dtype(cls, dtype: str) -> str:
        try:
            np.dtype(dtype)
        except TypeError:
            raise ValueError(f"{dtype!r} is not a numpy dtype (float32, float64, uint8, int64, bool ...)") from None
        return dtype

    @model_validator(mode="after")
    def _bounds_fit(self) -> Feature:
        """Bounds are what the sim clips actions into and the dataset's stats start from: one per value, never
        NaN, and a low above its high is a typo (clipping into it would silently send the high)."""
        for side, bounds in (("low", self.low), ("high", self.high)):
            if bounds is not None and len(bounds) != self.size:
                raise ValueError(f"{len(bounds)} {side} bounds for {self.size} values (shape {list(self.shape)})")
            nan = next((i for i, bound in enumerate(bounds or []) if math.isnan(bound)), None)
            if nan is not None:
                raise ValueError(f"{side} bound [{nan}] is NaN (an unbounded value is -Infinity or Infinity)")
        if self.low is not None and self.high is not None:
            crossed = [i for i, (low, high) in enumerate(zip(self.low, self.high, strict=True)) if low > high]
            if crossed:
                i = crossed[0]
                more = f" (and {len(crossed) - 1} more)" if len(crossed) > 1 else ""
                raise ValueError(f"low [{i}] {self.low[i]:g} is above high [{i}] {self.high[i]:g}{more}")
        if self.names is not None and not self.is_camera and len(set(self.names)) != len(self.names):
            twice = sorted({name for name in self.names if self.names.count(name) > 1})
            raise ValueError(f"names {twice} stand twice: each value needs a name of its own")
        return self

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_camera(self) -> bool:
        return self.type.is_camera


class Contract(BaseModel):
    """Observation and action features, control rate and robot type of one sim."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")  # unbounded: Infinity

    version: int = CONTRACT_VERSION
    control_rate: float = Field(gt=0, description="steps per second of simulated time (Hz)")
    robot_type: str = "unknown"
    features: dict[str, Feature]

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != CONTRACT_VERSION:
            raise ValueError(f"version {version} is not one this hud-pipelines reads (it reads {CONTRACT_VERSION})")
        return version

    @property
    def action(self) -> Feature:
        return self.features[ACTION]

    @property
    def observation_features(self) -> dict[str, Feature]:
        return {k: f for k, f in self.features.items() if f.role == "observation"}

    @property
    def cameras(self) -> dict[str, Feature]:
        return {k: f for k, f in self.observation_features.items() if f.is_camera}

    @property
    def state_features(self) -> dict[str, Feature]:
        return {k: f for k, f in self.observation_features.items() if not f.is_camera}

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True) + "\n"
