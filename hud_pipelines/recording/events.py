"""What a rollout hands to whoever records it: episode keys, frames, outcomes, and the sink seam.

The agent loop (and ``wrap(env)`` for user-owned loops) reports every slot's episode to one or more
:class:`EpisodeSink` objects: the trace recorder writes JSON lines, the dataset writer writes a
LeRobot dataset. A sink hears of each slot's episode through ``begin`` / ``add_frames`` / ``end``,
the frames of a tick's slots arriving together (one :class:`FrameBatch`); episodes of different
slots interleave. ``end`` carries the final status: a sink commits a
finished episode whole and may drop an errored one.

A :class:`Frame` follows the LeRobot convention: the observation the action was chosen from, the
action, and what came *next* (reward, done flags, success).
"""

from __future__ import annotations

import functools
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

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


class EpisodeEnd(StrEnum):
    """How an answered episode came to its end: what a failure was, the task's own end or the clock's."""

    TERMINATED = "terminated"
    """The env ended it (the task's end: the goal reached, a fall, an object off the table)."""
    TRUNCATED = "truncated"
    """Time ran out: the env's time limit, or the pipeline's ``max_steps``."""


@dataclass(frozen=True)
class EpisodeKey:
    """Identifies one slot's episode within a job; ``trace_id`` is deterministic from it."""

    job: str
    task: int
    instance: int
    slot: int
    episode: int
    seed: int | None
    task_name: str = ""
    """The task's name in the pipeline (a matrix value's names its axis and value): what a dataset's
    ``hud_episodes.jsonl`` tells its episodes apart by where the tasks share one prompt. Not part of
    ``trace_id``."""
    paired_task: str = ""
    """The task this episode pairs with: its own name, or a matrix arm's control. A stochastic policy's random
    stream is named by it (:attr:`stream_task`) and the seed, so the arms of a matrix draw their control's
    noise, and a task inserted before this one moves nothing. Not part of ``trace_id``."""

    @functools.cached_property
    def stream_task(self) -> int:
        """The task's part of the policy's random stream: a digest of :attr:`paired_task` (its index, for keys
        of a caller that names no tasks)."""
        if not self.paired_task:
            return self.task
        return int.from_bytes(hashlib.sha256(self.paired_task.encode()).digest()[:8], "big")

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
    """Whether the env reported success on this step (its word now; the episode's outcome says whether it ever did)."""

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
    success_reported: bool = False
    """Whether the env gave a success signal at any step (without one, ``success`` is never true)."""
    success_at_end: bool = False
    """Whether the env reported success on the episode's last step. ``success`` (before a grader
    decides it) is success at *any* step, as lerobot counts it; a task that must hold its goal grades
    on this one instead (``kind: success, at: end``), as ManiSkill's ``success_at_end`` does."""

    @property
    def ended(self) -> EpisodeEnd | None:
        """How the episode ended (``None`` for an errored one: a fault ended it)."""
        if self.status is EpisodeStatus.ERRORED:
            return None
        if self.terminated:  # gymnasium's rule: a step that is both is the task's end
            return EpisodeEnd.TERMINATED
        return EpisodeEnd.TRUNCATED if self.truncated else None


def errored(reason: str, steps: int, total_reward: float, fault: Fault) -> EpisodeOutcome:
    """The outcome of an episode a fault ended: no grade, no success (an error is never a failure)."""
    return EpisodeOutcome(
        status=EpisodeStatus.ERRORED,
        score=0.0,
        success=False,
        total_reward=total_reward,
        steps=steps,
        error=reason,
        fault=fault,
    )


@dataclass(frozen=True)
class FrameBatch:
    """One tick's :class:`Frame` of several slots, as columns: row ``i`` is the frame of ``keys[i]``.

    The agent loop steps its N slots together and hands every sink the tick at once, so a sink that
    can work on columns (the trace writer formats each feature's rows in one go) pays per tick what it
    would otherwise pay per slot; :class:`PerSlotSink` turns it back into frames for one that cannot.
    """

    keys: Sequence[EpisodeKey]
    index: npt.NDArray[np.int64]
    """``[n]``: each row's step index within its episode."""
    observation: dict[str, npt.NDArray[Any]]
    """``{feature: [n, ...]}``: the observation each action was chosen from."""
    action: npt.NDArray[np.float32]
    """``[n, A]``."""
    reward: npt.NDArray[np.float64]
    terminated: npt.NDArray[np.bool_]
    truncated: npt.NDArray[np.bool_]
    success: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.keys)

    def frame(self, row: int) -> Frame:
        return Frame(
            index=int(self.index[row]),
            observation={name: values[row] for name, values in self.observation.items()},
            action=self.action[row],
            reward=float(self.reward[row]),
            terminated=bool(self.terminated[row]),
            truncated=bool(self.truncated[row]),
            success=bool(self.success[row]),
        )

    @classmethod
    def of(cls, key: EpisodeKey, frame: Frame) -> FrameBatch:
        """A batch of one (a user-owned loop's step, a test)."""
        return cls(
            keys=[key],
            index=np.array([frame.index], dtype=np.int64),
            observation={name: np.asarray(values)[None] for name, values in frame.observation.items()},
            action=np.asarray(frame.action)[None],
            reward=np.array([frame.reward], dtype=np.float64),
            terminated=np.array([frame.terminated]),
            truncated=np.array([frame.truncated]),
            success=np.array([frame.success]),
        )


@dataclass(frozen=True)
class InferenceBatch:
    """One forward's :class:`Inference` records for the slots it refilled: row ``i`` is ``keys[i]``'s."""

    keys: Sequence[EpisodeKey]
    step: npt.NDArray[np.int64]
    """``[n]``: the step of each slot's episode the chunk starts at."""
    chunk: npt.NDArray[np.float32]
    """``[n, T, A]``."""
    latency_s: float
    batch_size: int

    def __len__(self) -> int:
        return len(self.keys)

    def __post_init__(self) -> None:
        if np.ndim(self.chunk) != 3:
            raise ValueError(f"an inference batch's chunk is [n, T, A]; got shape {list(np.shape(self.chunk))}")

    def record(self, row: int) -> Inference:
        return Inference(
            step=int(self.step[row]), chunk=self.chunk[row], latency_s=self.latency_s, batch_size=self.batch_size
        )

    @classmethod
    def of(cls, key: EpisodeKey, record: Inference) -> InferenceBatch:
        return cls(
            keys=[key],
            step=np.array([record.step], dtype=np.int64),
            chunk=np.asarray(record.chunk)[None],
            latency_s=record.latency_s,
            batch_size=record.batch_size,
        )


@runtime_checkable
class EpisodeSink(Protocol):
    """Receives episodes as they happen; implementations must tolerate interleaved slots.

    Frames and inference records come a tick at a time (:class:`FrameBatch`, :class:`InferenceBatch`);
    subclass :class:`PerSlotSink` to receive them one slot at a time instead.
    """

    def begin(self, key: EpisodeKey, prompt: str) -> None: ...

    def add_frames(self, batch: FrameBatch) -> None: ...

    def add_inferences(self, batch: InferenceBatch) -> None: ...

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None: ...

    def close(self) -> None:
        """Flush and finalize; called exactly once, also after a fault or cancellation."""
        ...


class PerSlotSink(ABC):
    """An :class:`EpisodeSink` that takes each slot's frame on its own (``add``), in batch order.

    Inference records are ignored unless :meth:`inference` is overridden.
    """

    @abstractmethod
    def add(self, key: EpisodeKey, frame: Frame) -> None: ...

    def inference(self, key: EpisodeKey, record: Inference) -> None:
        """One slot's inference record (nothing by default)."""
        del key, record

    def add_frames(self, batch: FrameBatch) -> None:
        for row, key in enumerate(batch.keys):
            self.add(key, batch.frame(row))

    def add_inferences(self, batch: InferenceBatch) -> None:
        for row, key in enumerate(batch.keys):
            self.inference(key, batch.record(row))


def checked_sinks(sinks: Sequence[object]) -> list[EpisodeSink]:
    """``sinks`` as a list, refusing at once (not at the first step) an object that is not an :class:`EpisodeSink`."""
    checked: list[EpisodeSink] = []
    for sink in sinks:
        if not isinstance(sink, EpisodeSink):
            missing = [m for m in ("begin", "add_frames", "add_inferences", "end", "close") if not hasattr(sink, m)]
            raise TypeError(
                f"{type(sink).__name__} is not an EpisodeSink: it has no {', '.join(missing)}. A sink that takes "
                "one slot's frame at a time subclasses hud_pipelines.recording.events.PerSlotSink and defines add()"
            )
        checked.append(sink)
    return checked
