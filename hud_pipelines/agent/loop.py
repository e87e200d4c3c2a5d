"""The lockstep loop of one ``RobotAgent.run``: ticks, refills, steps sent ahead, observation history.

See :mod:`hud_pipelines.agent.runner` for what a tick does. This module is the state that lives only
for one run; the episodes themselves (counters, ends, sinks) are :class:`~hud_pipelines.agent.episodes.SlotEpisodes`.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from hud_pipelines.agent.episodes import ObservationRow, OutcomeGrader, SlotEpisodes, row
from hud_pipelines.agent.policy import SEEDED_STREAM, BasePolicy, Forwards, PolicyBatch, RandomStream, as_chunks
from hud_pipelines.agent.run_failures import (
    CODE_FAILURES,
    RunFailed,
    SimFailed,
    code_failed,
    policy_failure,
    raised_by_its_rows,
    say_once,
)
from hud_pipelines.contract import Contract
from hud_pipelines.errors import Fault, HudPipelinesError, RemoteError
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, errored
from hud_pipelines.sim.slots import some
from hud_pipelines.wire.messages import Observation

_RUN_NUMBERS = itertools.count(1)

ChunkAdapter = Callable[[npt.NDArray[np.float32], ObservationRow], npt.NDArray[Any]]
"""``adapt_chunk(chunk [T, A], slot_observation) -> chunk [T', A]``"""
ActionAdapter = Callable[[npt.NDArray[np.float32], ObservationRow], npt.NDArray[Any]]
"""``adapt_action(action [A], slot_observation) -> action [A]``"""
StopCause = Callable[[], "tuple[str, Fault] | None"]
"""``cause() -> (reason, fault)`` when the caller itself stopped the sim or the policy (a deadline)."""


@runtime_checkable
class Sim(Protocol):
    """What the agent needs of a sim: a ``SimClient``, or an in-process ``GymBridge``."""

    @property
    def contract(self) -> Contract: ...
    @property
    def num_envs(self) -> int: ...

    def reset(self, tasks: list[dict[str, Any]]) -> Observation: ...

    def step(self, action: npt.NDArray[Any]) -> Observation: ...


@runtime_checkable
class PipelinedSim(Sim, Protocol):
    """A sim that takes a step before the reply to the previous one is read (``SimClient``)."""

    def send_step(self, action: npt.NDArray[Any]) -> int: ...

    def receive_step(self, seq: int) -> Observation: ...


@dataclass
class RunStats:
    """Counters of the last ``run`` (for benchmarks and tests)."""

    ticks: int = 0
    env_steps: int = 0
    """Slot-steps of running slots (hold steps of finished slots are not counted)."""
    infer: Forwards = field(default_factory=Forwards)
    """``infer`` calls made by this loop that returned (one per refill tick, one per row where a forward raised
    and its rows were run apart), with the slots each refilled."""
    sent_ahead: int = 0
    """Ticks whose step was sent before the previous tick's observation was read."""
    step_s: float = 0.0
    """Seconds spent waiting for the sim's replies."""
    wall_s: float = 0.0


@dataclass(frozen=True)
class LoopSettings:
    """How the agent drives its slots (the ``RobotAgent``'s settings, fixed for a run)."""

    policy: BasePolicy
    width: int
    horizon: int | None
    send_ahead: int
    observation_steps: int
    adapt_chunk: ChunkAdapter | None = None
    adapt_action: ActionAdapter | None = None


def forward_rows(policy: BasePolicy, rows: int) -> int:
    """Rows of the forward that served the last call from this thread (larger under ``BatchedModel``)."""
    value = policy.last_forward_rows()
    return value if value is not None and value >= rows else rows


@dataclass(eq=False, repr=False)
class LockstepRun:
    """One ``RobotAgent.run``: the state that lives only for its duration."""

    settings: LoopSettings
    sim: Sim
    keys: list[EpisodeKey]
    sinks: InitVar[list[EpisodeSink]]
    stats: RunStats
    _: KW_ONLY
    grade: InitVar[OutcomeGrader | None] = None
    stop_cause: StopCause | None = None

    def __post_init__(self, sinks: list[EpisodeSink], grade: OutcomeGrader | None) -> None:
        keys, settings, sim = self.keys, self.settings, self.sim
        self.slots = SlotEpisodes(keys, settings.width, sinks, grade=grade, action_names=sim.contract.action.names)
        run = next(_RUN_NUMBERS)
        self.episode_ids = [f"{key.trace_id}/{run}" for key in keys]
        """What the policy sees of each row's episode: unique even when a job's trace ids repeat."""
        self.forwards = np.zeros(len(keys), dtype=np.int64)
        """Policy calls made for each slot's episode so far (the last part of its random stream)."""
        self.streams: list[RandomStream] = [stream_of(key) for key in keys]
        """Each slot's random stream but for its forward count (:func:`stream_of`)."""
        self.history: dict[str, npt.NDArray[Any]] = {}
        self.prompts: list[str] = [""] * len(keys)
        self.pipelined: PipelinedSim | None = (
            sim if settings.send_ahead > 0 and settings.adapt_action is None and isinstance(sim, PipelinedSim) else None
        )
        self.ahead: collections.deque[tuple[int, npt.NDArray[np.float32]]] = collections.deque()
        """Steps already sent for the next ticks, oldest first: ``seq`` and action frame."""

    def execute(self, tasks: list[dict[str, Any]], max_steps: int, prompts: list[str] | None) -> list[EpisodeOutcome]:
        slots = self.slots
        try:
            observation = self.sim.reset(tasks)
        except HudPipelinesError as exc:
            reason, fault = self._cause(*SimFailed.of_reset(exc))
            slots.begin(prompts or [""] * len(self.keys))
            for slot in range(len(self.keys)):
                slots.end(slot, errored(reason, 0, 0.0, fault))
            slots.report_ends()
            return slots.final()
        offered = observation.prompt or [""] * len(self.keys)
        self.prompts = list(prompts) if prompts is not None else [str(p) for p in offered]
        slots.begin(self.prompts)
        slots.running[:] = True  # until the reply says otherwise: a slot the sim errored keeps its reason
        slots.apply_errors(observation)
        slots.running &= np.array([status == "running" for status in observation.status], dtype=bool)
        for slot in np.flatnonzero(~slots.running):
            if slots.outcomes[slot] is None:
                slots.end(int(slot), errored(f"slot is {observation.status[slot]} after reset", 0, 0.0, Fault.ENV))
        if self.settings.observation_steps > 1:
            self._start_history(observation)
        slots.report_ends()
        try:
            if slots.running.any():  # no episode started: nothing for the policy to begin, nor to fail
                self._reset_policy()
            while some(slots.running) and self.stats.ticks < max_steps:
                observation = self._tick(observation, max_steps)
                slots.report_ends()
            self._drop_ahead()
        except RunFailed as failure:
            slots.error_running(*self._cause(failure.reason, failure.fault))
        except BaseException:
            slots.error_running("the agent loop was interrupted", Fault.INTERRUPTED)
            slots.report_ends()
            raise
        for slot in np.flatnonzero(slots.running).tolist():
            at_end = bool(observation.success_now[slot])
            slots.end(slot, slots.answered(slot, truncated=True, terminated=False, at_end=at_end))
        slots.report_ends()
        return slots.final()

    # -- one tick --------------------------------------------------------------------------------------

    def _tick(self, observation: Observation, max_steps: int) -> Observation:
        slots = self.slots
        if self.ahead:  # sent on an earlier tick; slots that ended since ignore their row
            running = slots.running.nonzero()[0]
            seq, action = self.ahead.popleft()
        else:
            need = (slots.running & (slots.cursor >= slots.length)).nonzero()[0]
            if need.size:
                self._refill(need, observation)
            running = slots.running.nonzero()[0]  # a refill may have ended slots (a non-finite action)
            if not running.size:
                return observation
            action = self._pop(running, observation)
            seq = self._send(action)
        while self._can_send_ahead(running, max_steps):
            assert self.pipelined is not None
            following = self._pop(running, observation)
            self.ahead.append((self._post(self.pipelined, following), following))
            self.stats.sent_ahead += 1
        reply = self._receive(seq, action)
        self.stats.ticks += 1
        self.stats.env_steps += running.size
        slots.record(observation, reply, running, action, cutoff=self.stats.ticks >= max_steps)
        if self.history:
            self._push_history(reply, running)
        return reply

    def _pop(self, running: npt.NDArray[np.intp], observation: Observation) -> npt.NDArray[np.float32]:
        """The next action frame: each running slot's next queued action; finished slots repeat theirs."""
        slots = self.slots
        slots.action[running] = slots.queue[running, slots.cursor[running]]
        slots.cursor[running] += 1
        adapt = self.settings.adapt_action
        if adapt is not None:
            for slot in running.tolist():
                adapted = adapt(slots.action[slot].copy(), row(observation, slot))
                slots.action[slot] = np.asarray(adapted, dtype=np.float32).reshape(self.settings.width)
        return slots.action.copy()

    # -- steps sent ahead ------------------------------------------------------------------------------

    def _can_send_ahead(self, running: npt.NDArray[np.intp], max_steps: int) -> bool:
        """Whether one more tick's action is already known (every running slot has one queued) and may go."""
        slots = self.slots
        return (
            self.pipelined is not None
            and len(self.ahead) < self.settings.send_ahead
            and self.stats.ticks + 1 + len(self.ahead) < max_steps
            and running.size > 0
            and bool((slots.cursor[running] < slots.length[running]).all())
        )

    def _send(self, action: npt.NDArray[np.float32]) -> int | None:
        """Send the step now when the sim pipelines (its ``seq``); else it is sent by :meth:`_receive`."""
        return None if self.pipelined is None else self._post(self.pipelined, action)

    @staticmethod
    def _post(sim: PipelinedSim, action: npt.NDArray[np.float32]) -> int:
        try:
            return sim.send_step(action)
        except HudPipelinesError as exc:
            raise SimFailed.of(exc) from exc

    def _receive(self, seq: int | None, action: npt.NDArray[np.float32]) -> Observation:
        started = time.perf_counter()
        try:
            if self.pipelined is not None and seq is not None:
                reply = self.pipelined.receive_step(seq)
            else:
                reply = self.sim.step(action)
        except HudPipelinesError as exc:
            raise SimFailed.of(exc) from exc
        self.stats.step_s += time.perf_counter() - started
        return reply

    def _drop_ahead(self) -> None:
        """Read and drop the replies to steps sent ahead for ticks that never came (every slot ended)."""
        while self.ahead and self.pipelined is not None:
            seq, _ = self.ahead.popleft()
            try:
                self.pipelined.receive_step(seq)
            except RemoteError:
                pass  # refused: no slot was running when it arrived
            except HudPipelinesError as exc:
                raise SimFailed.of(exc) from exc

    # -- refills ---------------------------------------------------------------------------------------

    def _reset_policy(self) -> None:
        """The policy's ``reset`` before the episodes; what it raises ends them as the policy's fault, named."""
        try:
            self.settings.policy.reset()
        except CODE_FAILURES as exc:  # sys.exit() in the user's code is its failure, never the run's end
            if not code_failed(exc):
                raise
            raise policy_failure(
                self.settings.policy, "policy reset failed", exc, np.flatnonzero(self.slots.running)
            ) from exc

    def _refill(self, need: npt.NDArray[np.intp], observation: Observation) -> None:
        """One forward for the slots in ``need``, their chunks queued (:meth:`_forward`); each row draws from its
        episode's stream at the forwards it had so far (:data:`~.policy.RandomStream`)."""
        slots: list[int] = need.tolist()
        done: list[int] = self.forwards[need].tolist()
        self.forwards[need] += 1
        streams = [(*self.streams[slot], forward) for slot, forward in zip(slots, done, strict=True)]
        self._forward(need, streams, observation)

    def _forward(self, need: npt.NDArray[np.intp], streams: list[RandomStream], observation: Observation) -> None:
        """One forward for ``need``, its chunks queued. When the policy's own code raised, each row is forwarded
        again alone, with the random stream it had, so that only the rows that raise end (as with
        ``num_envs: 1``) and every other row gets the chunk it gets in any batch; else (a deadline, a lost
        server) the instance ends (:mod:`~hud_pipelines.agent.run_failures`)."""
        try:
            forward = self._infer(need, streams, observation)
        except CODE_FAILURES as exc:  # sys.exit() in the policy's code: its failure, not an interrupt
            if not code_failed(exc):
                raise
            if not raised_by_its_rows(exc):
                raise policy_failure(self.settings.policy, "policy failed", exc, need) from exc
            if need.size == 1:
                failure = policy_failure(self.settings.policy, "policy failed", exc, need)
                self.slots.error(int(need[0]), failure.reason, failure.fault)
                return
            running = int(np.count_nonzero(self.slots.running[need]))
            for index in range(need.size):
                self._forward(need[index : index + 1], streams[index : index + 1], observation)
            if np.count_nonzero(self.slots.running[need]) == running:  # the batch raised, no row alone: a batch limit
                what = f"policy failed on a forward of {need.size} rows, on none of them alone (each was run apart)"
                say_once(self.settings.policy, f"{what}: {type(exc).__name__}: {exc}", exc, need)
            return
        self._queue(need, observation, *forward)

    def _infer(
        self, need: npt.NDArray[np.intp], streams: list[RandomStream], observation: Observation
    ) -> tuple[npt.NDArray[np.float32], float, int]:
        """The policy's chunks for the rows of ``need`` (cut to the horizon), the forward's seconds and rows."""
        settings, rows = self.settings, need.tolist()
        batch = PolicyBatch(
            observation=self._policy_rows(observation, need),
            prompts=[self.prompts[s] for s in rows],
            episodes=[self.episode_ids[s] for s in rows],
            streams=streams,
        )
        started = time.perf_counter()
        raw = settings.policy.infer(batch)
        chunks = as_chunks(raw, need.size, settings.width, source=f"policy {type(settings.policy).__name__}")
        latency = time.perf_counter() - started
        self.stats.infer.add(int(need.size), latency)
        if settings.horizon is not None:
            chunks = chunks[:, : settings.horizon]
        return chunks, latency, forward_rows(settings.policy, need.size)

    def _queue(
        self,
        need: npt.NDArray[np.intp],
        observation: Observation,
        chunks: npt.NDArray[np.float32],
        latency: float,
        rows: int,
    ) -> None:
        if self.settings.adapt_chunk is None:
            self.slots.queue_chunks(need, chunks, latency, rows)
            return
        for index, slot in enumerate(need.tolist()):  # each slot's own chunk, maybe of its own length
            adapted = self._adapted(chunks[index], slot, observation)
            if adapted is not None:
                self.slots.queue_chunks(need[index : index + 1], adapted[None], latency, rows)

    def _adapted(
        self, chunk: npt.NDArray[np.float32], slot: int, observation: Observation
    ) -> npt.NDArray[np.float32] | None:
        """``chunk`` through ``adapt_chunk``, which sees the slot's observation row; ``None`` when it raised,
        which ends that slot alone."""
        adapt = self.settings.adapt_chunk
        assert adapt is not None
        try:
            adapted = adapt(chunk.copy(), row(observation, slot))
            return as_chunks(np.asarray(adapted)[None], 1, self.settings.width, source="adapt_chunk")[0]
        except CODE_FAILURES as exc:
            if not code_failed(exc):
                raise
            self.slots.error(slot, f"adapt_chunk raised {type(exc).__name__}: {exc}", Fault.POLICY)
            return None

    def _policy_rows(self, observation: Observation, need: npt.NDArray[np.intp]) -> dict[str, npt.NDArray[Any]]:
        source = self.history or observation.observation
        if need.size == len(self.keys):
            return {k: v if v.flags.writeable else v.copy() for k, v in source.items()}
        return {k: v[need] for k, v in source.items()}  # fancy indexing copies

    # -- observation history (policies with n_obs_steps > 1) ----------------------------------------

    def _start_history(self, observation: Observation) -> None:
        steps = self.settings.observation_steps
        self.history = {k: np.repeat(v[:, None], steps, axis=1) for k, v in observation.observation.items()}

    def _push_history(self, reply: Observation, running: npt.NDArray[np.intp]) -> None:
        for name, buffer in self.history.items():
            buffer[running, :-1] = buffer[running, 1:]
            buffer[running, -1] = reply.observation[name][running]

    def _cause(self, reason: str, fault: Fault) -> tuple[str, Fault]:
        """The caller's own reason when it stopped the run on purpose, else the failure as seen."""
        cause = self.stop_cause() if self.stop_cause is not None else None
        return cause if cause is not None else (reason, fault)


def stream_of(key: EpisodeKey) -> tuple[int, ...]:
    """The random stream of ``key``'s episode but for the forward count that ends it: by task and seed where it has
    one (wherever ``num_envs`` placed it and whatever tasks come before it), else by its place in the job."""
    if key.seed is None:
        return (key.stream_task, key.instance, key.slot, key.episode)
    return (SEEDED_STREAM, key.stream_task, key.seed, key.episode)
