"""The episodes of one run's slots: their counters, how each ends, and what the sinks hear.

The loop (:mod:`hud_pipelines.agent.loop`) decides *when* a slot's episode ends; this module keeps
*what* it was (steps, return, success) vectorised over the N slots, turns an end into an
:class:`~hud_pipelines.recording.events.EpisodeOutcome`, and tells the sinks. Ends are collected
and graded together (:meth:`SlotEpisodes.report_ends`, once per tick where slots ended): the score
by the one scoring rule from what every frame says (success, and whether the env reports success at
all), then the pipeline's grader, then ``end`` to every sink, so traces, datasets and grades carry
one verdict and no extra round trip to the sim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import Fault
from hud_pipelines.recording.events import (
    EpisodeKey,
    EpisodeOutcome,
    EpisodeSink,
    EpisodeStatus,
    FrameBatch,
    InferenceBatch,
    checked_sinks,
    errored,
)
from hud_pipelines.sim.slots import EpisodeCounts, every, some
from hud_pipelines.wire.messages import Observation

ObservationRow = dict[str, npt.NDArray[Any]]
OutcomeGrader = Callable[[EpisodeKey, EpisodeOutcome], EpisodeOutcome]
"""``grade(key, outcome) -> outcome``: the pipeline's verdict on an episode that produced an answer."""
SLOT_CAUSES = {"env": Fault.ENV, "action": Fault.ACTION, "nonfinite": Fault.NONFINITE}
"""The wire's ``errors[].cause`` as a fault."""


class SlotEpisodes:
    """One run's episodes, one per slot: counters, action queues, outcomes and the sinks that hear of them."""

    def __init__(
        self,
        keys: Sequence[EpisodeKey],
        width: int,
        sinks: Sequence[EpisodeSink],
        *,
        grade: OutcomeGrader | None = None,
        action_names: Sequence[str] | None = None,
    ) -> None:
        num_slots = len(keys)
        self.keys = list(keys)
        self.action_names = action_names
        """The contract's names of the action's values, for errors that point at one."""
        self.sinks = checked_sinks(sinks)
        self.grade = grade
        self.running = np.zeros(num_slots, dtype=np.bool_)
        self.queue = np.zeros((num_slots, 1, width), dtype=np.float32)
        self.cursor = np.zeros(num_slots, dtype=np.intp)
        self.length = np.zeros(num_slots, dtype=np.intp)
        self.counts = EpisodeCounts(num_slots)
        """Counted from the frames; the sim's sticky success and its "reported" flag come in every one."""
        self.action = np.zeros((num_slots, width), dtype=np.float32)
        self.outcomes: list[EpisodeOutcome | None] = [None] * num_slots
        self.unreported: list[int] = []
        """Slots that ended and whose outcome the sinks have not heard yet."""

    # -- action queues ----------------------------------------------------------------------------

    def load(self, slot: int, chunk: npt.NDArray[np.float32]) -> None:
        """Queue ``chunk`` as the slot's next actions (the queue grows to the longest chunk)."""
        self.load_many(np.array([slot], dtype=np.intp), chunk[None])

    def load_many(self, slots: npt.NDArray[np.intp], chunks: npt.NDArray[np.float32]) -> None:
        """Queue ``chunks[i]`` (``[n, T, A]``) as the next actions of ``slots[i]``, in one write."""
        length = chunks.shape[1]
        if length > self.queue.shape[1]:
            grown = np.zeros((self.queue.shape[0], length, self.queue.shape[2]), dtype=np.float32)
            grown[:, : self.queue.shape[1]] = self.queue
            self.queue = grown
        self.queue[slots, :length] = chunks
        self.cursor[slots] = 0
        self.length[slots] = length

    def queue_chunks(
        self, slots: npt.NDArray[np.intp], chunks: npt.NDArray[np.float32], latency_s: float, rows: int
    ) -> None:
        """Queue each slot's chunk of one forward in one batched write and tell the sinks; a slot whose chunk is not
        finite errors instead (it is never sent, and its siblings go on)."""
        if np.isfinite(np.add.reduce(chunks, axis=None)):  # a sum is finite only if every value is: the usual case
            self.load_many(slots, chunks)
            self.inferences(slots, chunks, latency_s, rows)
            return
        finite = np.isfinite(chunks).reshape(slots.size, -1).all(axis=1)
        for index in np.flatnonzero(~finite).tolist():
            slot = int(slots[index])
            why = non_finite_action(chunks[index], int(self.counts.steps[slot]), self.action_names)
            self.error(slot, why, Fault.POLICY)
        loaded, kept = slots[finite], chunks[finite]
        self.load_many(loaded, kept)
        self.inferences(loaded, kept, latency_s, rows)

    # -- what the sinks hear ----------------------------------------------------------------------

    def begin(self, prompts: Sequence[str]) -> None:
        for key, prompt in zip(self.keys, prompts, strict=True):
            for sink in self.sinks:
                sink.begin(key, prompt)

    def keys_of(self, slots: npt.NDArray[np.intp]) -> list[EpisodeKey]:
        indices: list[int] = slots.tolist()
        return [self.keys[slot] for slot in indices]

    def inferences(
        self, slots: npt.NDArray[np.intp], chunks: npt.NDArray[np.float32], latency_s: float, rows: int
    ) -> None:
        """Tell the sinks the chunks one forward gave ``slots`` (each starts at the slot's current step)."""
        if not self.sinks or not slots.size:
            return
        batch = InferenceBatch(
            keys=self.keys_of(slots),
            step=self.counts.steps[slots],
            chunk=chunks,
            latency_s=latency_s,
            batch_size=rows,
        )
        for sink in self.sinks:
            sink.add_inferences(batch)

    def record(
        self,
        before: Observation,
        reply: Observation,
        running: npt.NDArray[np.intp],
        action: npt.NDArray[np.float32],
        *,
        cutoff: bool = False,
    ) -> None:
        """Count one step of the ``running`` slots, tell the sinks its frames, and end the episodes it ended.

        ``cutoff``: this is the last step ``max_steps`` allows, so every slot it stepped is truncated here
        (one that terminated on this step too, as gymnasium's ``TimeLimit`` says), and its last frame says
        so (``next.done``).
        """
        errored = self.apply_errors(reply)  # ended with the steps they completed, as the sim counts them
        stepped = running if not errored else np.array([s for s in running.tolist() if s not in errored], np.intp)
        counts = self.counts
        if stepped.size == self.running.size and every(self.running):  # the usual tick: every slot counts it
            counts.steps += 1
            counts.total_reward += reply.reward
            counts.success |= reply.success
            counts.success_reported |= reply.success_reported
        else:
            counts.steps[stepped] += 1
            counted = stepped[self.running[stepped]]
            counts.total_reward[counted] += reply.reward[counted]
            counts.success[counted] |= reply.success[counted]
            counts.success_reported[counted] |= reply.success_reported[counted]
        if not stepped.size:
            return
        truncated = reply.truncated[stepped] | cutoff
        ended = reply.terminated[stepped] | truncated
        status = reply.status
        if some(ended) or "done" in status:  # else no episode ended on this tick
            for slot, done, cut in zip(stepped.tolist(), ended.tolist(), truncated.tolist(), strict=True):
                if done or status[slot] == "done":  # heard by the sinks after this tick's frames (report_ends)
                    terminated, at_end = bool(reply.terminated[slot]), bool(reply.success_now[slot])
                    self.end(slot, self.answered(slot, terminated=terminated, truncated=cut, at_end=at_end))
        if self.sinks:
            whole = stepped.size == before.num_slots  # the usual tick: the rows as they came, no copy of a camera
            batch = FrameBatch(
                keys=self.keys_of(stepped),
                index=counts.steps[stepped] - 1,
                observation=dict(before.observation)
                if whole
                else {k: v[stepped] for k, v in before.observation.items()},
                action=action[stepped],
                reward=reply.reward[stepped].astype(np.float64, copy=False),
                terminated=reply.terminated[stepped],
                truncated=truncated,
                success=reply.success_now[stepped],  # the env's word on this step (not the sticky one)
            )
            for sink in self.sinks:
                sink.add_frames(batch)

    def apply_errors(self, reply: Observation) -> set[int]:
        """End the running slots the sim reports as errored; returns those slots."""
        if not reply.errors and "errored" not in reply.status:  # the usual tick
            return set()
        reasons = {e.slot: (e.message, SLOT_CAUSES.get(e.cause, Fault.ENV)) for e in reply.errors}
        for slot, status in enumerate(reply.status):
            if status == "errored":
                reasons.setdefault(slot, ("the sim reports the slot as errored", Fault.ENV))
        ended: set[int] = set()
        for slot, (reason, fault) in reasons.items():
            if 0 <= slot < len(self.keys) and self.running[slot]:
                self.error(slot, reason, fault)
                ended.add(slot)
        return ended

    # -- episode ends -----------------------------------------------------------------------------

    def answered(self, slot: int, *, terminated: bool, truncated: bool, at_end: bool) -> EpisodeOutcome:
        """The outcome of a slot whose episode produced an answer (succeeded or failed), as counted so far.

        ``at_end``: whether the env reported success on the slot's last step (the frame's ``success_now``).
        """
        counts = self.counts
        success = bool(counts.success[slot])
        return EpisodeOutcome(
            status=EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED,
            score=counts.score(slot),
            success=success,
            total_reward=float(counts.total_reward[slot]),
            steps=int(counts.steps[slot]),
            terminated=terminated,
            truncated=truncated,
            success_reported=bool(counts.success_reported[slot]),
            success_at_end=at_end,
        )

    def error(self, slot: int, reason: str, fault: Fault) -> None:
        """End the slot as errored with ``reason``, keeping the steps and return it got to."""
        counts = self.counts
        self.end(slot, errored(reason, int(counts.steps[slot]), float(counts.total_reward[slot]), fault))

    def error_running(self, reason: str, fault: Fault) -> None:
        for slot in np.flatnonzero(self.running).tolist():
            self.error(slot, reason, fault)

    def end(self, slot: int, outcome: EpisodeOutcome) -> None:
        """Stop the slot now; the sinks hear of it in :meth:`report_ends`, once graded."""
        self.running[slot] = False
        self.length[slot] = 0
        self.cursor[slot] = 0
        self.outcomes[slot] = outcome
        self.unreported.append(slot)

    def report_ends(self) -> None:
        """Grade the slots that ended since the last call and tell the sinks."""
        if not self.unreported:
            return
        ended, self.unreported = self.unreported, []
        if self.grade is not None:
            for slot in ended:
                outcome = self.outcomes[slot]
                assert outcome is not None
                if outcome.status is EpisodeStatus.ERRORED:
                    continue
                try:
                    self.outcomes[slot] = self.grade(self.keys[slot], outcome)
                except Exception as exc:  # a callable grader's bug errors its episode, not the run
                    reason = f"grading failed: {type(exc).__name__}: {exc}"
                    self.outcomes[slot] = errored(reason, outcome.steps, outcome.total_reward, Fault.GRADER)
        for slot in ended:
            outcome = self.outcomes[slot]
            assert outcome is not None
            for sink in self.sinks:
                sink.end(self.keys[slot], outcome)

    def final(self) -> list[EpisodeOutcome]:
        """Every slot's outcome (each slot ends exactly once)."""
        missing = [slot for slot, outcome in enumerate(self.outcomes) if outcome is None]
        if missing:
            raise AssertionError(f"slots {missing} ended without an outcome")
        return [outcome for outcome in self.outcomes if outcome is not None]


def row(observation: Observation, slot: int) -> ObservationRow:
    """One slot's row of a batched observation."""
    return {k: v[slot] for k, v in observation.observation.items()}


def non_finite_action(chunk: npt.NDArray[np.float32], steps_done: int, names: Sequence[str] | None) -> str:
    """Why a slot's ``[T, A]`` chunk is refused: the step of its first non-finite action, counted from 1 as an env's
    faults are, and which of that action's values are not finite, by the contract's names (``action_<i>`` without
    them), so that a NaN out of one head of a policy is found without a debugger."""
    finite = np.isfinite(chunk)
    first = int(np.argmin(finite.all(axis=-1)))
    bad = np.flatnonzero(~finite[first]).tolist()
    width = chunk.shape[-1]
    label = list(names) if names is not None and len(names) == width else [f"action_{i}" for i in range(width)]
    values = ", ".join(f"{label[i]} = {float(chunk[first, i])}" for i in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    count = f" ({len(bad)} of its {width} values)" if width > 1 else ""
    return f"the policy returned a non-finite action for step {steps_done + 1 + first}: {values}{more}{count}"
