"""The agent loop: N slots of one sim, one loop, batched first (``N = 1`` is a batch of one).

Every slot has an open-loop queue of actions. On each tick:

1. the slots that are still running and whose queue ran dry are refilled by **one** ``infer`` over
   exactly those rows (slots with actions left are not asked);
2. each refilled slot's chunk is cut to the horizon and converted by ``adapt_chunk(chunk, obs)``
   against that slot's own observation (e.g. deltas to absolute targets);
3. every running slot pops its next action (through ``adapt_action(action, obs)`` when set);
   finished slots repeat their last row, which the sim replaces by its hold action;
4. one ``[N, A]`` step; running slots report a frame to every sink, and a slot whose episode ended
   clears its queue and records nothing more.

With a served sim the steps are pipelined: while every running slot still has queued actions (and
no ``adapt_action`` needs the observation), up to ``send_ahead`` later ticks' steps are sent before
this tick's observation is read, so the sim steps while replies cross the wire and the agent
records frames. The actions, episodes and records are exactly those of the unpipelined loop: a
slot that ends ignores the rows already sent for it (the sim holds finished slots), and steps sent
for ticks that never come (every slot ended) are refused by the sim ("no slot is running") and
dropped. ``send_ahead=0`` waits for every reply.

The loop ends when no slot is running or after ``max_steps`` ticks; slots still running then end as
failed with ``truncated=True``. An error from the sim (a :class:`~hud_pipelines.errors.SimError`
from a served sim, or any :class:`~hud_pipelines.errors.HudPipelinesError` an in-process bridge
raises) or a policy failure ends the running slots as errored with the reason, finished slots keep
their outcome, and ``run`` returns normally: every slot always gets exactly one outcome.

Scores come from the sim's own grade (``sim.result()``, read once on every tick where slots ended):
only the sim knows whether the env reports success at all, which decides whether the score is
success or the return. Sinks hear ``end`` on the tick the episode ended, with that grade.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from hud_pipelines.agent.policy import BasePolicy, Policy, PolicyBatch, as_base_policy, as_chunks
from hud_pipelines.contract import Contract
from hud_pipelines.errors import (
    Fault,
    HudPipelinesError,
    PolicyTimeoutError,
    RemoteError,
    RolloutTimeoutError,
    RunAborted,
    fault_of,
)
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame, Inference
from hud_pipelines.spec.agent import DEFAULT_SEND_AHEAD
from hud_pipelines.wire.messages import Observation

log = logging.getLogger(__name__)
_RUN_NUMBERS = itertools.count(1)

ObservationRow = dict[str, npt.NDArray[Any]]
ChunkAdapter = Callable[[npt.NDArray[np.float32], ObservationRow], npt.NDArray[Any]]
"""``adapt_chunk(chunk [T, A], slot_observation) -> chunk [T', A]``"""
ActionAdapter = Callable[[npt.NDArray[np.float32], ObservationRow], npt.NDArray[Any]]
"""``adapt_action(action [A], slot_observation) -> action [A]``"""
EpisodeKeyFactory = Callable[[int, int | None], EpisodeKey]
"""``key(slot, seed) -> EpisodeKey``"""
OutcomeGrader = Callable[[EpisodeKey, EpisodeOutcome], EpisodeOutcome]
"""``grade(key, outcome) -> outcome``: the pipeline's verdict on an episode that produced an answer."""
StopCause = Callable[[], "tuple[str, Fault] | None"]
"""``cause() -> (reason, fault)`` when the caller itself stopped the sim or the policy (a deadline)."""


class Sim(Protocol):
    """What the loop needs from a sim: ``SimClient`` (served) and ``GymBridge`` (in-process) both fit."""

    @property
    def contract(self) -> Contract: ...

    @property
    def num_envs(self) -> int: ...

    def reset(self, tasks: list[dict[str, Any]]) -> Observation: ...

    def step(self, action: npt.NDArray[Any]) -> Observation: ...


@runtime_checkable
class PipelinedSim(Sim, Protocol):
    """A sim whose steps can be sent before the previous reply is read (``SimClient``)."""

    def send_step(self, action: npt.NDArray[Any]) -> int: ...

    def receive_step(self, seq: int) -> Observation: ...


@dataclass(frozen=True)
class EpisodeKeys:
    """Keys of one run's episodes: ``(job, task, instance, slot, episode, seed)``."""

    job: str
    task: int = 0
    instance: int = 0
    episode: int = 0

    def __call__(self, slot: int, seed: int | None) -> EpisodeKey:
        return EpisodeKey(self.job, self.task, self.instance, slot, self.episode, seed)


@dataclass
class RunStats:
    """Counters of the last ``run`` (for benchmarks and tests)."""

    ticks: int = 0
    env_steps: int = 0
    """Slot-steps of running slots (hold steps of finished slots are not counted)."""
    forwards: int = 0
    """``infer`` calls made by this loop (one per refill tick)."""
    rows_inferred: int = 0
    refill_rows: list[int] = field(default_factory=list[int])
    """Rows of every ``infer`` call, in order."""
    sent_ahead: int = 0
    """Ticks whose step was sent before the previous tick's observation was read."""
    infer_s: float = 0.0
    step_s: float = 0.0
    """Seconds spent waiting for the sim's replies."""
    wall_s: float = 0.0


class _Slots:
    """Per-slot bookkeeping of one run, vectorised over the N slots where the loop is hot."""

    def __init__(self, num_slots: int, width: int) -> None:
        self.running = np.zeros(num_slots, dtype=np.bool_)
        self.queue = np.zeros((num_slots, 1, width), dtype=np.float32)
        self.cursor = np.zeros(num_slots, dtype=np.intp)
        self.length = np.zeros(num_slots, dtype=np.intp)
        self.steps = np.zeros(num_slots, dtype=np.int64)
        self.total_reward = np.zeros(num_slots, dtype=np.float64)
        self.success = np.zeros(num_slots, dtype=np.bool_)
        self.action = np.zeros((num_slots, width), dtype=np.float32)
        self.outcomes: list[EpisodeOutcome | None] = [None] * num_slots

    def load(self, slot: int, chunk: npt.NDArray[np.float32]) -> None:
        if chunk.shape[0] > self.queue.shape[1]:
            grown = np.zeros((self.queue.shape[0], chunk.shape[0], self.queue.shape[2]), dtype=np.float32)
            grown[:, : self.queue.shape[1]] = self.queue
            self.queue = grown
        self.queue[slot, : chunk.shape[0]] = chunk
        self.cursor[slot] = 0
        self.length[slot] = chunk.shape[0]

    def finish(self, slot: int, outcome: EpisodeOutcome) -> None:
        self.running[slot] = False
        self.length[slot] = 0
        self.cursor[slot] = 0
        self.outcomes[slot] = outcome


class RobotAgent:
    """Drives every slot of a sim with one policy (see the module docstring for the loop)."""

    def __init__(
        self,
        policy: Policy | BasePolicy,
        contract: Contract,
        *,
        horizon: int | None = None,
        adapt_chunk: ChunkAdapter | None = None,
        adapt_action: ActionAdapter | None = None,
        send_ahead: int = DEFAULT_SEND_AHEAD,
    ) -> None:
        if horizon is not None and horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if send_ahead < 0:
            raise ValueError(f"send_ahead must be >= 0, got {send_ahead}")
        self.policy = as_base_policy(policy)
        self.contract = contract
        self.horizon = horizon if horizon is not None else self.policy.horizon
        self.adapt_chunk = adapt_chunk
        self.adapt_action = adapt_action
        self.send_ahead = send_ahead
        """Steps a served sim may be sent ahead of the observation (see the module docstring)."""
        self.width = contract.action.size
        self.observation_steps = self.policy.observation_steps
        self.last_run = RunStats()
        self._episodes: dict[tuple[str, int, int], int] = {}

    # -- public ----------------------------------------------------------------------------------------

    def run(
        self,
        sim: Sim,
        tasks: list[dict[str, Any]],
        *,
        max_steps: int,
        key: EpisodeKeyFactory | tuple[str, int, int],
        sinks: Sequence[EpisodeSink] = (),
        prompts: list[str] | None = None,
        grade: OutcomeGrader | None = None,
        stop_cause: StopCause | None = None,
    ) -> list[EpisodeOutcome]:
        """Run one episode in every slot of ``sim``; returns one outcome per slot.

        ``key`` is an :data:`EpisodeKeyFactory` or ``(job, task, instance)``; with the tuple, the
        episode number counts the runs this agent made under that triple. ``prompts`` (one per
        slot) override the prompts the sim offers at reset. ``grade`` turns each answered episode's
        outcome into the pipeline's verdict *before* the sinks hear of it, so traces, datasets and
        grades carry one success. ``stop_cause`` explains a sim or policy failure that the caller
        caused on purpose (an instance deadline that killed the sim): the slots then end with that
        reason and fault instead of the crash it provoked.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        num_slots = sim.num_envs
        if len(tasks) != num_slots:
            raise ValueError(f"run needs one task per slot: the sim has {num_slots} slots, {len(tasks)} tasks given")
        if prompts is not None and len(prompts) != num_slots:
            raise ValueError(f"prompts must have one entry per slot ({num_slots}), got {len(prompts)}")
        keys = self._keys(key, tasks)
        stats = self.last_run = RunStats()
        started = time.perf_counter()
        try:
            run = _Run(self, sim, keys, list(sinks), stats, grade=grade, stop_cause=stop_cause)
            return run.execute(tasks, max_steps, prompts)
        finally:
            stats.wall_s = time.perf_counter() - started

    # -- helpers ---------------------------------------------------------------------------------------

    def _keys(self, key: EpisodeKeyFactory | tuple[str, int, int], tasks: list[dict[str, Any]]) -> list[EpisodeKey]:
        if isinstance(key, tuple):
            triple = cast(tuple[str, int, int], key)
            job, task, instance = triple
            episode = self._episodes.get(triple, 0)
            self._episodes[triple] = episode + 1
            key = EpisodeKeys(job, task, instance, episode)
        return [key(slot, _seed(task)) for slot, task in enumerate(tasks)]


def _seed(task: dict[str, Any]) -> int | None:
    seed = task.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def forward_rows(policy: BasePolicy, rows: int) -> int:
    """Rows of the forward that served the last call from this thread (larger under ``BatchedModel``)."""
    value = policy.last_forward_rows()
    return value if value is not None and value >= rows else rows


class _Run:
    """One ``RobotAgent.run``: the state that lives only for its duration."""

    def __init__(
        self,
        agent: RobotAgent,
        sim: Sim,
        keys: list[EpisodeKey],
        sinks: list[EpisodeSink],
        stats: RunStats,
        *,
        grade: OutcomeGrader | None = None,
        stop_cause: StopCause | None = None,
    ) -> None:
        self.agent = agent
        self.grade = grade
        self.stop_cause = stop_cause
        self.sim = sim
        self.keys = keys
        self.sinks = sinks
        self.stats = stats
        self.slots = _Slots(len(keys), agent.width)
        run = next(_RUN_NUMBERS)
        self.episode_ids = [f"{key.trace_id}/{run}" for key in keys]
        """What the policy sees of each row's episode: unique even when a job's trace ids repeat."""
        self.forwards = np.zeros(len(keys), dtype=np.int64)
        """Policy calls made for each slot's episode so far (the last part of its random stream)."""
        self.history: dict[str, npt.NDArray[Any]] = {}
        self.unreported: list[int] = []
        """Slots that ended and whose outcome the sinks have not heard yet."""
        self.sim_healthy = True
        self.pipelined: PipelinedSim | None = (
            sim if agent.send_ahead > 0 and agent.adapt_action is None and isinstance(sim, PipelinedSim) else None
        )
        self.ahead: collections.deque[tuple[int, npt.NDArray[np.float32]]] = collections.deque()
        """Steps already sent for the next ticks, oldest first: ``seq`` and action frame."""

    def execute(self, tasks: list[dict[str, Any]], max_steps: int, prompts: list[str] | None) -> list[EpisodeOutcome]:
        slots = self.slots
        try:
            observation = self.sim.reset(tasks)
        except HudPipelinesError as exc:
            reason, fault = self._cause(f"reset failed: {exc}", fault_of(exc))
            for slot, key in enumerate(self.keys):
                self._begin(key, prompts[slot] if prompts else "")
                self._end(slot, _errored(reason, 0, 0.0, fault))
            self.sim_healthy = False
            self._report_ends()
            return self._outcomes()
        offered = observation.prompt or [""] * len(self.keys)
        self.prompts = list(prompts) if prompts is not None else [str(p) for p in offered]
        for slot, key in enumerate(self.keys):
            self._begin(key, self.prompts[slot])
        slots.running[:] = True  # until the reply says otherwise: a slot the sim errored keeps its reason
        self._apply_errors(observation)
        for slot, status in enumerate(observation.status):
            if slots.running[slot] and status != "running":
                slots.running[slot] = False
        for slot in np.flatnonzero(~slots.running):
            if slots.outcomes[slot] is None:
                self._end(int(slot), _errored(f"slot is {observation.status[slot]} after reset", 0, 0.0, Fault.ENV))
        self.agent.policy.reset()
        if self.agent.observation_steps > 1:
            self._start_history(observation)
        self._report_ends()
        try:
            while slots.running.any() and self.stats.ticks < max_steps:
                observation = self._tick(observation, max_steps)
                if self.unreported:
                    self._report_ends()
            self._drop_ahead()
        except _SimFailed as failure:
            self.sim_healthy = False
            self._fail_running(*self._cause(failure.reason, failure.fault))
        except _PolicyFailed as failure:
            self._fail_running(*self._cause(failure.reason, failure.fault))
        except BaseException:
            self.sim_healthy = False
            self._fail_running("the agent loop was interrupted", Fault.INTERRUPTED)
            self._report_ends()
            raise
        for slot in np.flatnonzero(slots.running):
            self._end(int(slot), self._graded(int(slot), truncated=True, terminated=False))
        self._report_ends()
        return self._outcomes()

    # -- one tick --------------------------------------------------------------------------------------

    def _tick(self, observation: Observation, max_steps: int) -> Observation:
        slots = self.slots
        if self.ahead:  # sent on an earlier tick; slots that ended since ignore their row
            running = np.flatnonzero(slots.running)
            seq, action = self.ahead.popleft()
        else:
            need = np.flatnonzero(slots.running & (slots.cursor >= slots.length))
            if need.size:
                self._refill(need, observation)
            running = np.flatnonzero(slots.running)  # a refill may have ended slots (a non-finite action)
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
        self._record(observation, reply, running, action)
        if self.history:
            self._push_history(reply, running)
        return reply

    def _pop(self, running: npt.NDArray[np.intp], observation: Observation) -> npt.NDArray[np.float32]:
        """The next action frame: each running slot's next queued action; finished slots repeat theirs."""
        slots = self.slots
        slots.action[running] = slots.queue[running, slots.cursor[running]]
        slots.cursor[running] += 1
        if self.agent.adapt_action is not None:
            for slot in running.tolist():
                row = self.agent.adapt_action(slots.action[slot].copy(), _row(observation, slot))
                slots.action[slot] = np.asarray(row, dtype=np.float32).reshape(self.agent.width)
        return slots.action.copy()

    def _can_send_ahead(self, running: npt.NDArray[np.intp], max_steps: int) -> bool:
        """Whether one more tick's action is already known (every running slot has one queued) and may go."""
        slots = self.slots
        return (
            self.pipelined is not None
            and len(self.ahead) < self.agent.send_ahead
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
            raise _SimFailed(f"{type(exc).__name__}: {exc}", fault_of(exc)) from exc

    def _receive(self, seq: int | None, action: npt.NDArray[np.float32]) -> Observation:
        started = time.perf_counter()
        try:
            if self.pipelined is not None and seq is not None:
                reply = self.pipelined.receive_step(seq)
            else:
                reply = self.sim.step(action)
        except HudPipelinesError as exc:  # a SimError, or a fault an in-process bridge raises directly
            raise _SimFailed(f"{type(exc).__name__}: {exc}", fault_of(exc)) from exc
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
                raise _SimFailed(f"{type(exc).__name__}: {exc}", fault_of(exc)) from exc

    def _refill(self, need: npt.NDArray[np.intp], observation: Observation) -> None:
        agent = self.agent
        batch = PolicyBatch(
            observation=self._policy_rows(observation, need),
            prompts=[self.prompts[s] for s in need],
            episodes=[self.episode_ids[s] for s in need],
            streams=[self._stream(int(s)) for s in need],
        )
        started = time.perf_counter()
        try:
            raw = agent.policy.infer(batch)
            chunks = as_chunks(raw, need.size, agent.width, source=f"policy {type(agent.policy).__name__}")
        except (PolicyTimeoutError, RolloutTimeoutError, RunAborted) as exc:
            raise _PolicyFailed(str(exc), fault_of(exc)) from exc
        except Exception as exc:
            log.exception("policy inference failed for slots %s", need.tolist())
            raise _PolicyFailed(f"policy failed: {type(exc).__name__}: {exc}", Fault.POLICY) from exc
        latency = time.perf_counter() - started
        rows = forward_rows(agent.policy, need.size)
        self.stats.infer_s += latency
        self.stats.forwards += 1
        self.stats.rows_inferred += need.size
        self.stats.refill_rows.append(int(need.size))
        refilled: list[int] = need.tolist()
        for index, slot in enumerate(refilled):
            chunk = chunks[index] if agent.horizon is None else chunks[index, : agent.horizon]
            if agent.adapt_chunk is not None:
                try:
                    adapted = agent.adapt_chunk(chunk.copy(), _row(observation, slot))
                    chunk = as_chunks(np.asarray(adapted)[None], 1, agent.width, source="adapt_chunk")[0]
                except Exception as exc:
                    raise _PolicyFailed(
                        f"adapt_chunk failed for slot {slot}: {type(exc).__name__}: {exc}", Fault.POLICY
                    ) from exc
            if not np.isfinite(chunk).all():  # never sent: this slot errors, its siblings go on
                step = int(self.slots.steps[slot])
                self._end(
                    slot,
                    _errored(
                        f"the policy returned a non-finite action at step {step}",
                        step,
                        float(self.slots.total_reward[slot]),
                        Fault.POLICY,
                    ),
                )
                continue
            self.slots.load(slot, chunk)
            record = Inference(step=int(self.slots.steps[slot]), chunk=chunk, latency_s=latency, batch_size=rows)
            for sink in self.sinks:
                sink.inference(self.keys[slot], record)

    def _stream(self, slot: int) -> tuple[int, ...]:
        """The random stream of ``slot``'s next forward: its episode's key and how many forwards it had."""
        key = self.keys[slot]
        forward = int(self.forwards[slot])
        self.forwards[slot] += 1
        return (key.task, key.instance, key.slot, key.episode, forward)

    def _policy_rows(self, observation: Observation, need: npt.NDArray[np.intp]) -> dict[str, npt.NDArray[Any]]:
        source = self.history or observation.observation
        if need.size == len(self.keys):
            return {k: v if v.flags.writeable else v.copy() for k, v in source.items()}
        return {k: v[need] for k, v in source.items()}  # fancy indexing copies

    def _record(
        self, before: Observation, reply: Observation, running: npt.NDArray[np.intp], action: npt.NDArray[np.float32]
    ) -> None:
        slots = self.slots
        slots.steps[running] += 1
        errored = self._apply_errors(reply)  # the sim ends a slot whose observation or reward is not finite
        counted = running[slots.running[running]]
        slots.total_reward[counted] += reply.reward[counted]
        slots.success[counted] |= reply.success[counted]
        stepped: list[int] = running.tolist()
        for slot in stepped:
            if slot in errored:
                continue
            if self.sinks:
                frame = Frame(
                    index=int(slots.steps[slot]) - 1,
                    observation=_row(before, slot),
                    action=action[slot],
                    reward=float(reply.reward[slot]),
                    terminated=bool(reply.terminated[slot]),
                    truncated=bool(reply.truncated[slot]),
                    success=bool(reply.success[slot]),
                )
                for sink in self.sinks:
                    sink.add(self.keys[slot], frame)
            status = reply.status[slot]
            if reply.terminated[slot] or reply.truncated[slot] or status == "done":
                terminated, truncated = bool(reply.terminated[slot]), bool(reply.truncated[slot])
                self._end(slot, self._graded(slot, terminated=terminated, truncated=truncated))

    def _apply_errors(self, reply: Observation) -> set[int]:
        """End the running slots the sim reports as errored; returns those slots."""
        slots = self.slots
        reasons = {e.slot: (e.message, _SLOT_CAUSES.get(e.cause, Fault.ENV)) for e in reply.errors}
        for slot, status in enumerate(reply.status):
            if status == "errored":
                reasons.setdefault(slot, ("the sim reports the slot as errored", Fault.ENV))
        ended: set[int] = set()
        for slot, (reason, fault) in reasons.items():
            if 0 <= slot < len(self.keys) and slots.running[slot]:
                self._end(slot, _errored(reason, int(slots.steps[slot]), float(slots.total_reward[slot]), fault))
                ended.add(slot)
        return ended

    # -- observation history (policies with n_obs_steps > 1) ----------------------------------------

    def _start_history(self, observation: Observation) -> None:
        steps = self.agent.observation_steps
        self.history = {k: np.repeat(v[:, None], steps, axis=1) for k, v in observation.observation.items()}

    def _push_history(self, reply: Observation, running: npt.NDArray[np.intp]) -> None:
        for name, buffer in self.history.items():
            buffer[running, :-1] = buffer[running, 1:]
            buffer[running, -1] = reply.observation[name][running]

    # -- episode ends ---------------------------------------------------------------------------------

    def _graded(self, slot: int, *, terminated: bool, truncated: bool) -> EpisodeOutcome:
        slots = self.slots
        success = bool(slots.success[slot])
        total = float(slots.total_reward[slot])
        return EpisodeOutcome(
            status=EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED,
            score=float(success) if success else total,
            success=success,
            total_reward=total,
            steps=int(slots.steps[slot]),
            terminated=terminated,
            truncated=truncated,
        )

    def _cause(self, reason: str, fault: Fault) -> tuple[str, Fault]:
        """The caller's own reason when it stopped the run on purpose, else the failure as seen."""
        cause = self.stop_cause() if self.stop_cause is not None else None
        return cause if cause is not None else (reason, fault)

    def _fail_running(self, reason: str, fault: Fault) -> None:
        slots = self.slots
        for slot in np.flatnonzero(slots.running).tolist():
            self._end(slot, _errored(reason, int(slots.steps[slot]), float(slots.total_reward[slot]), fault))

    def _grade_from_sim(self, slots: list[int]) -> None:
        """Take the score of each of ``slots`` from the sim's own grade (success, or the return).

        Only the sim knows whether the env reports a success signal at all, which decides what the
        score means; when the sim cannot answer, the agent's own reading stays.
        """
        if not self.sim_healthy:
            return
        grades = _sim_grades(self.sim)
        if grades is None:
            return
        for slot in slots:
            outcome = self.slots.outcomes[slot]
            grade = grades[slot] if slot < len(grades) else None
            if outcome is None or grade is None or outcome.status is EpisodeStatus.ERRORED:
                continue
            score = grade.get("score")
            if isinstance(score, int | float):
                self.slots.outcomes[slot] = _replace(outcome, score=float(score))

    def _begin(self, key: EpisodeKey, prompt: str) -> None:
        for sink in self.sinks:
            sink.begin(key, prompt)

    def _end(self, slot: int, outcome: EpisodeOutcome) -> None:
        """Stop the slot now; the sinks hear of it in :meth:`_report_ends`, once graded."""
        self.slots.finish(slot, outcome)
        self.unreported.append(slot)

    def _report_ends(self) -> None:
        """Grade the slots that ended since the last call (one ``result()`` for all) and tell the sinks."""
        if not self.unreported:
            return
        ended, self.unreported = self.unreported, []
        graded = [
            s for s in ended if (o := self.slots.outcomes[s]) is not None and o.status is not EpisodeStatus.ERRORED
        ]
        if graded:
            self._grade_from_sim(graded)
            if self.grade is not None:
                for slot in graded:
                    outcome = self.slots.outcomes[slot]
                    assert outcome is not None
                    try:
                        self.slots.outcomes[slot] = self.grade(self.keys[slot], outcome)
                    except Exception as exc:  # a callable grader's bug errors its episode, not the run
                        reason = f"grading failed: {type(exc).__name__}: {exc}"
                        self.slots.outcomes[slot] = _errored(reason, outcome.steps, outcome.total_reward, Fault.GRADER)
        for slot in ended:
            outcome = self.slots.outcomes[slot]
            assert outcome is not None
            for sink in self.sinks:
                sink.end(self.keys[slot], outcome)

    def _outcomes(self) -> list[EpisodeOutcome]:
        missing = [slot for slot, outcome in enumerate(self.slots.outcomes) if outcome is None]
        if missing:
            raise AssertionError(f"slots {missing} ended without an outcome")
        return [outcome for outcome in self.slots.outcomes if outcome is not None]


_SLOT_CAUSES = {"env": Fault.ENV, "action": Fault.ACTION, "nonfinite": Fault.NONFINITE}
"""The wire's ``errors[].cause`` as a fault."""


class _PolicyFailed(Exception):
    def __init__(self, reason: str, fault: Fault) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fault = fault


class _SimFailed(Exception):
    def __init__(self, reason: str, fault: Fault) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fault = fault


def _row(observation: Observation, slot: int) -> ObservationRow:
    return {k: v[slot] for k, v in observation.observation.items()}


def _errored(reason: str, steps: int, total_reward: float, fault: Fault) -> EpisodeOutcome:
    return EpisodeOutcome(
        status=EpisodeStatus.ERRORED,
        score=0.0,
        success=False,
        total_reward=total_reward,
        steps=steps,
        error=reason,
        fault=fault,
    )


def _replace(outcome: EpisodeOutcome, **changes: Any) -> EpisodeOutcome:
    import dataclasses

    return dataclasses.replace(outcome, **changes)


def _sim_grades(sim: object) -> list[dict[str, Any]] | None:
    """Per-slot grade dicts from ``sim.result()`` when the sim offers one and it answers."""
    result = getattr(sim, "result", None)
    if not callable(result):
        return None
    try:
        graded: Any = result()
    except HudPipelinesError as exc:
        log.warning("could not read the sim's grades, keeping the agent's own: %s", exc)
        return None
    slots: Any = (
        cast(dict[str, Any], graded).get("slots") if isinstance(graded, dict) else getattr(graded, "slots", None)
    )
    return cast(list[dict[str, Any]], slots) if isinstance(slots, list) else None
