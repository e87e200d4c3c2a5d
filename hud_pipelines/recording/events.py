"""What a rollout hands to whoever records it: episode keys, frames, outcomes, and the sink seam.

The agent loop (and ``wrap(env)`` for user-owned loops) reports every slot's episode to one or more
:class:`EpisodeSink` objects: the trace recorder writes JSON lines, the dataset writer writes a
LeRobot dataset. A sink sees one slot's episode at a time through ``begin`` / ``add`` / ``end``;
episodes of different slots interleave. ``end`` carries the final status: a sink commits a
finished episode whole and may drop an errored one.

A :class:`Frame` follows the LeRobot convention: the observation the action was chosen from, the
action, and what came *next* (reward, done flags, success).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import Fault


class EpisodeStatus(StrEnum):
    """How an episode ended; ``errored`` is never counted as a failure."""

    SUCCEEDED = "succeeded"
    """Ended with success (sticky: once reported, it holds until the episode ends)."""
    FAILED = "failed"
    """Ended (terminated, truncated or ``max_steps``) without success."""
    ERRORED = "errored"
    """Ended on a fault (the outcome's ``fault`` says which); it has no grade."""


@dataclass(frozen=True)
class EpisodeKey:
    """Identifies one slot's episode within a job; ``trace_id`` is deterministic from it."""

    job: str
    task: int
    instance: int
    slot: int
    episode: int
    seed: int | None

    @functools.cached_property
    def trace_id(self) -> str:  # cached: every trace line of the episode is filed under it
        text = f"{self.job}/{self.task}/{self.instance}/{self.slot}/{self.episode}/{self.seed}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Frame:
    """One step of one slot: ``observation`` -> ``action`` -> ``reward`` and done flags."""

    index: int
    observation: dict[str, npt.NDArray[Any]]
    action: npt.NDArray[np.float32]
    reward: float
    terminated: bool
    truncated: bool
    success: bool

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class Inference:
    """One policy forward as seen by one slot: the chunk it received and how long the forward took."""

    step: int
    chunk: npt.NDArray[np.float32]
    """``[T, A]`` actions in contract order."""
    latency_s: float
    batch_size: int


@dataclass(frozen=True)
class EpisodeOutcome:
    """The grade of one finished episode."""

    status: EpisodeStatus
    score: float
    success: bool
    total_reward: float
    steps: int
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    fault: Fault | None = None
    """Why an errored episode errored (``None`` for episodes that produced an answer)."""
    extra: dict[str, Any] = field(default_factory=dict[str, Any])


class EpisodeSink(Protocol):
    """Receives episodes as they happen; implementations must tolerate interleaved slots."""

    def begin(self, key: EpisodeKey, prompt: str) -> None: ...

    def add(self, key: EpisodeKey, frame: Frame) -> None: ...

    def inference(self, key: EpisodeKey, record: Inference) -> None: ...

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None: ...

    def close(self) -> None:
        """Flush and finalize; called exactly once, also after a fault or cancellation."""
        ...
