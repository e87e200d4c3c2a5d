"""Sans-I/O lockstep bookkeeping for the N slots of one sim.

This module knows nothing about envs or sockets: it is fed per-slot rewards and done flags and keeps
each slot's episode record. Its rules are the ones a batch of slots must never break:

- a batched reset starts every slot together; there is no way to add a slot to a batch that has
  already stepped (no late joiners);
- only ``RUNNING`` slots accumulate anything: once a slot is ``DONE`` or ``ERRORED`` nothing that
  happens to it afterwards (hold actions, vector-env autoresets) reaches its episode record;
- success is sticky within an episode: once seen it stays true until the next reset;
- an illegal transition raises :class:`SlotStateError` naming the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import SlotStateError


class SlotState(StrEnum):
    IDLE = "idle"
    """Never reset."""
    RUNNING = "running"
    DONE = "done"
    """The episode terminated or was truncated."""
    ERRORED = "errored"
    """The episode ended on a fault (sim exception, disconnect); never counted as a failure."""


@dataclass
class SlotRecord:
    """One slot's current episode."""

    state: SlotState = SlotState.IDLE
    episode: int = -1
    seed: int | None = None
    total_reward: float = 0.0
    steps: int = 0
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    success_reported: bool = False
    """Whether the env ever reported a success signal; decides what the score means."""
    error: str | None = None

    @property
    def score(self) -> float:
        """Success (1/0) when the env reports success, otherwise the episode return."""
        return float(self.success) if self.success_reported else self.total_reward

    def as_dict(self, slot: int) -> dict[str, Any]:
        return {
            "slot": slot,
            "episode": self.episode,
            "seed": self.seed,
            "status": self.state.value,
            "score": self.score,
            "success": self.success,
            "total_reward": self.total_reward,
            "steps": self.steps,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "error": self.error,
        }


class SlotBatch:
    """Episode records of ``num_slots`` slots that step in lockstep."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.records = [SlotRecord() for _ in range(num_slots)]

    def __len__(self) -> int:
        return len(self.records)

    @property
    def states(self) -> list[SlotState]:
        return [r.state for r in self.records]

    def running(self) -> npt.NDArray[np.bool_]:
        return np.array([r.state is SlotState.RUNNING for r in self.records], dtype=np.bool_)

    def begin(self, seeds: list[int | None]) -> None:
        """Start a new episode in every slot at once (a batched reset)."""
        if len(seeds) != len(self.records):
            raise SlotStateError(f"a reset must start all {len(self.records)} slots together, got {len(seeds)} tasks")
        for record, seed in zip(self.records, seeds, strict=True):
            episode = record.episode + 1
            record.__init__(state=SlotState.RUNNING, episode=episode, seed=seed)

    def require_running(self) -> None:
        """Refuse a step when no slot can use it (before the first reset, or after all finished)."""
        if not any(r.state is SlotState.RUNNING for r in self.records):
            states = sorted({r.state.value for r in self.records})
            raise SlotStateError(f"cannot step: no slot is running (slot states: {', '.join(states)}); reset first")

    def record_step(
        self,
        reward: npt.NDArray[np.floating[Any]],
        terminated: npt.NDArray[np.bool_],
        truncated: npt.NDArray[np.bool_],
        success: npt.NDArray[np.int8],
    ) -> npt.NDArray[np.bool_]:
        """Account one lockstep tick; returns the mask of slots that were running during it.

        ``success`` holds -1 where the env reported nothing for the slot, else 0/1.
        """
        was_running = self.running()
        for slot in np.flatnonzero(was_running):
            record = self.records[slot]
            record.total_reward += float(reward[slot])
            record.steps += 1
            if success[slot] >= 0:
                record.success_reported = True
                record.success = record.success or bool(success[slot])
            if terminated[slot] or truncated[slot]:
                record.terminated = bool(terminated[slot])
                record.truncated = bool(truncated[slot])
                record.state = SlotState.DONE
        return was_running

    def fail(self, slot: int, reason: str) -> None:
        """End ``slot``'s running episode as errored."""
        record = self.records[slot]
        if record.state is not SlotState.RUNNING:
            raise SlotStateError(f"slot {slot} is {record.state.value}, only a running slot can fail")
        record.state = SlotState.ERRORED
        record.error = reason

    def fail_running(self, reason: str) -> list[int]:
        """End every running episode as errored (a fault that hit the whole batch)."""
        slots = [i for i, r in enumerate(self.records) if r.state is SlotState.RUNNING]
        for slot in slots:
            self.fail(slot, reason)
        return slots

    def result(self) -> dict[str, Any]:
        """``{score, success, slots}``: mean score, whether every slot succeeded, one dict per slot."""
        slots = [r.as_dict(i) for i, r in enumerate(self.records)]
        return {
            "score": float(np.mean([r.score for r in self.records])),
            "success": all(r.success for r in self.records),
            "slots": slots,
        }
