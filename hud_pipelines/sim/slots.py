"""Sans-I/O lockstep bookkeeping for the N slots of one sim.

This module knows nothing about envs or sockets: it is fed per-slot rewards and done flags and keeps
each slot's episode record. Its rules are the ones a batch of slots must never break:

- a batched reset starts every slot together; there is no way to add a slot to a batch that has
  already stepped (no late joiners);
- only ``RUNNING`` slots accumulate anything: once a slot is ``DONE`` or ``ERRORED`` nothing that
  happens to it afterwards (hold actions, vector-env autoresets) reaches its episode record;
- success is sticky within an episode: once seen it stays true until the next reset; whether the env
  reported success on the slot's latest step is kept beside it (success at the end, once done);
- an illegal transition raises :class:`SlotStateError` naming the state.

The records are kept as per-slot numpy columns so that one lockstep tick of 64 slots costs a few
vectorised operations rather than a Python loop; :attr:`SlotBatch.records` gives per-slot snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import SlotStateError


def episode_score(success: bool, success_reported: bool, total_reward: float) -> float:
    """An episode's score: success (1/0) when the env reports success at all, otherwise its return.

    The one scoring rule: the sim applies it (it alone sees whether the env ever reported a success
    signal) and the agent's provisional score before the sim's grade arrives does too.
    """
    return float(success) if success_reported else total_reward


def seed_named(seed: int | None) -> str:
    """An episode as messages and reports name it, by its seed (``seed 7``; ``unseeded``: no seed repeats it), never
    by the slot it ran in, which ``num_envs`` decides."""
    return "unseeded" if seed is None else f"seed {seed}"


def every(mask: npt.NDArray[np.bool_]) -> bool:
    """``mask.all()`` for the per-tick path: ``count_nonzero`` skips numpy's Python-level reduction
    wrapper, a third of the cost on the small masks every tick checks several times."""
    return int(np.count_nonzero(mask)) == mask.size


def some(mask: npt.NDArray[np.bool_]) -> bool:
    """``mask.any()`` for the per-tick path (see :func:`every`)."""
    return int(np.count_nonzero(mask)) > 0


class EpisodeCounts:
    """What the current episodes of N slots have counted so far: steps, return, and success.

    The one set of per-episode counters: the sim keeps it (:class:`SlotBatch`) and so does the agent
    (:class:`~hud_pipelines.agent.episodes.SlotEpisodes`, which sees only the frames), and both score an
    episode from it by :func:`episode_score`.
    """

    def __init__(self, num_slots: int) -> None:
        self.steps = np.zeros(num_slots, dtype=np.int64)
        self.total_reward = np.zeros(num_slots, dtype=np.float64)
        self.success = np.zeros(num_slots, dtype=np.bool_)
        """Sticky: once the env reports success in an episode, it holds until the episode ends."""
        self.success_reported = np.zeros(num_slots, dtype=np.bool_)
        """Whether the slot's env gave a success signal this episode; decides what the score means."""

    def clear(self) -> None:
        """Zero every slot's counters (a batched reset starts every episode afresh)."""
        for column in (self.steps, self.total_reward, self.success, self.success_reported):
            column[:] = 0

    def score(self, slot: int) -> float:
        reported, total = bool(self.success_reported[slot]), float(self.total_reward[slot])
        return episode_score(bool(self.success[slot]), reported, total)


class SlotState(StrEnum):
    """A slot's lifecycle: ``IDLE -> RUNNING -> DONE | ERRORED``, and back to ``RUNNING`` on reset."""

    IDLE = "idle"
    """Never reset."""
    RUNNING = "running"
    DONE = "done"
    """The episode terminated or was truncated."""
    ERRORED = "errored"
    """The episode ended on a fault (sim exception, disconnect); never counted as a failure."""


class SlotEnds(TypedDict):
    """How each slot's episode stands after a tick, as ``[N]`` masks (the reply's fields of the same names)."""

    terminated: npt.NDArray[np.bool_]
    truncated: npt.NDArray[np.bool_]
    success: npt.NDArray[np.bool_]
    success_reported: npt.NDArray[np.bool_]
    success_now: npt.NDArray[np.bool_]
    """Whether the env reported success on the slot's latest counted step (not sticky)."""


_STATES: tuple[SlotState, ...] = tuple(SlotState)
_VALUES: tuple[str, ...] = tuple(state.value for state in _STATES)
_CODE = {state: code for code, state in enumerate(_STATES)}
_RUNNING = _CODE[SlotState.RUNNING]


@dataclass(frozen=True)
class SlotRecord:
    """A snapshot of one slot's current episode."""

    state: SlotState = SlotState.IDLE
    episode: int = -1
    """Episodes this slot started, minus one (``-1`` before the first reset)."""
    seed: int | None = None
    total_reward: float = 0.0
    steps: int = 0
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    success_reported: bool = False
    """Whether the env ever reported a success signal; decides what the score means."""
    success_now: bool = False
    """Whether the env reported success on the episode's latest step (at its end, once it ended)."""
    nonfinite_steps: int = 0
    """Steps whose observation held NaN or infinity (0 or 1: such a step ends the episode as errored)."""
    error: str | None = None

    @property
    def score(self) -> float:
        return episode_score(self.success, self.success_reported, self.total_reward)

    def as_dict(self, slot: int) -> dict[str, Any]:
        return {
            "slot": slot,
            "episode": self.episode,
            "seed": self.seed,
            "status": self.state.value,
            "score": self.score,
            "success": self.success,
            "success_at_end": self.success_now,
            "total_reward": self.total_reward,
            "steps": self.steps,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "nonfinite_steps": self.nonfinite_steps,
            "error": self.error,
        }


class SlotBatch:
    """Episode records of ``num_slots`` slots that step in lockstep."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._state = np.full(num_slots, _CODE[SlotState.IDLE], dtype=np.int8)
        self._episode = np.full(num_slots, -1, dtype=np.int64)
        self._seeds: list[int | None] = [None] * num_slots
        self._counts = EpisodeCounts(num_slots)
        self._terminated = np.zeros(num_slots, dtype=np.bool_)
        self._truncated = np.zeros(num_slots, dtype=np.bool_)
        self._success_now = np.zeros(num_slots, dtype=np.bool_)
        self._nonfinite_steps = np.zeros(num_slots, dtype=np.int64)
        self._errors: list[str | None] = [None] * num_slots

    def __len__(self) -> int:
        return self.num_slots

    # -- views -------------------------------------------------------------------------------------

    @property
    def states(self) -> list[SlotState]:
        return [_STATES[code] for code in self._state.tolist()]

    @property
    def status(self) -> list[str]:
        """Each slot's state as its wire string (``running``, ``done``, ...)."""
        return [_VALUES[code] for code in self._state.tolist()]

    def state(self, slot: int) -> SlotState:
        return _STATES[int(self._state[slot])]

    def running(self) -> npt.NDArray[np.bool_]:
        """A fresh ``[N]`` mask of the slots whose episode is running."""
        return self._state == _RUNNING

    def ends(self) -> SlotEnds:
        """A copy of how each slot's episode stands: the flags a reply to the agent carries."""
        return SlotEnds(
            terminated=self._terminated.copy(),
            truncated=self._truncated.copy(),
            success=self._counts.success.copy(),
            success_reported=self._counts.success_reported.copy(),
            success_now=self._success_now.copy(),
        )

    @property
    def steps(self) -> npt.NDArray[np.int64]:
        """Steps each slot's current episode has run (a copy)."""
        return self._counts.steps.copy()

    def record(self, slot: int) -> SlotRecord:
        return SlotRecord(
            state=self.state(slot),
            episode=int(self._episode[slot]),
            seed=self._seeds[slot],
            total_reward=float(self._counts.total_reward[slot]),
            steps=int(self._counts.steps[slot]),
            terminated=bool(self._terminated[slot]),
            truncated=bool(self._truncated[slot]),
            success=bool(self._counts.success[slot]),
            success_reported=bool(self._counts.success_reported[slot]),
            success_now=bool(self._success_now[slot]),
            nonfinite_steps=int(self._nonfinite_steps[slot]),
            error=self._errors[slot],
        )

    @property
    def records(self) -> list[SlotRecord]:
        return [self.record(slot) for slot in range(self.num_slots)]

    # -- transitions -------------------------------------------------------------------------------

    def begin(self, seeds: list[int | None]) -> None:
        """Start a new episode in every slot at once (a batched reset)."""
        if len(seeds) != self.num_slots:
            raise SlotStateError(f"a reset must start all {self.num_slots} slots together, got {len(seeds)} tasks")
        self._state[:] = _RUNNING
        self._episode += 1
        self._seeds = list(seeds)
        self._counts.clear()
        for column in (self._nonfinite_steps, self._terminated, self._truncated, self._success_now):
            column[:] = 0
        self._errors = [None] * self.num_slots

    def require_running(self) -> None:
        """Refuse a step when no slot can use it (before the first reset, or after all finished)."""
        if not some(self._state == _RUNNING):
            states = sorted({state.value for state in self.states})
            raise SlotStateError(f"cannot step: no slot is running (slot states: {', '.join(states)}); reset first")

    def record_step(
        self,
        reward: npt.NDArray[np.floating[Any]],
        terminated: npt.NDArray[np.bool_],
        truncated: npt.NDArray[np.bool_],
        success: npt.NDArray[np.int8],
        stepped: npt.NDArray[np.bool_] | None = None,
    ) -> npt.NDArray[np.bool_]:
        """Account one lockstep tick for the running slots; returns the mask of slots it counted.

        ``success`` holds -1 where the env reported nothing for the slot, else 0/1. ``stepped``
        narrows the tick to the slots whose env actually produced data (default: all running).
        """
        counted = self.running() if stepped is None else self.running() & stepped
        if every(counted):  # the usual tick: no mask to apply
            self._counts.total_reward += reward
            self._counts.steps += 1
            reported = success >= 0
            now = success > 0
            self._success_now[:] = now
        else:
            self._counts.total_reward += np.where(counted, reward, 0.0)
            self._counts.steps += counted
            reported = counted & (success >= 0)
            now = reported & (success > 0)
            self._success_now[counted] = now[counted]
        if some(reported):
            self._counts.success_reported |= reported
            self._counts.success |= now
        done = counted & (terminated | truncated)
        if some(done):
            self._terminated[done] = terminated[done]
            self._truncated[done] = truncated[done]
            self._state[done] = _CODE[SlotState.DONE]
        return counted

    def flag_nonfinite(self, slots: npt.NDArray[np.bool_]) -> None:
        """Count a step with a non-finite observation against each flagged slot."""
        self._nonfinite_steps[slots] += 1

    def fail(self, slot: int, reason: str) -> None:
        """End ``slot``'s running episode as errored."""
        state = self.state(slot)
        if state is not SlotState.RUNNING:
            raise SlotStateError(f"slot {slot} is {state.value}, only a running slot can fail")
        self._state[slot] = _CODE[SlotState.ERRORED]
        self._errors[slot] = reason

    def fail_running(self, reason: str) -> list[int]:
        """End every running episode as errored (a fault that hit the whole batch)."""
        slots = np.flatnonzero(self.running()).tolist()
        for slot in slots:
            self.fail(slot, reason)
        return slots

    def result(self) -> dict[str, Any]:
        """``{score, success, slots}``: mean score, whether every slot succeeded, one dict per slot."""
        records = self.records
        return {
            "score": float(np.mean([r.score for r in records])),
            "success": all(r.success for r in records),
            "slots": [r.as_dict(i) for i, r in enumerate(records)],
        }
