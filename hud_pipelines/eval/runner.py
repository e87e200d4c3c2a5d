"""Run the instances of one eval: ``group`` instances per task, each one sim of ``num_envs`` slots.

An *instance* (a Dagster partition) is the unit of work and of failure: one sim, one
:class:`~hud_pipelines.agent.runner.RobotAgent` run over its ``num_envs`` slots, one graded row per
slot. Instances run on worker threads, at most ``max_concurrent`` at once, and share one policy
through :class:`~hud_pipelines.agent.batching.BatchedModel`, so k concurrent sims cost one forward
per lockstep tick rather than k.

Faults stay where they happen, each with its :class:`~hud_pipelines.errors.Fault` kind:

- a slot whose env raised, whose observation or reward was not finite, or whose action the policy
  could not give ends errored; its instance goes on;
- an instance whose sim could not start, died, hung past ``step_timeout_s``, whose policy forward
  ran past ``agent.forward_timeout_s``, or that ran past ``rollout_timeout_s`` (its sim is killed and
  the forward it waits on abandoned) *fails*: its running slots end errored with that reason, its
  result says why, and the other instances finish and keep their results.

Episodes are graded as they end, before any sink hears of them, so traces, the dataset and the
grades carry one verdict per episode.

Nothing here knows Dagster; the Dagster assets and the plain Python API call :class:`EvalRunner`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hud_pipelines.agent.run_failures import CODE_FAILURES, build_failure, code_failed
from hud_pipelines.contract import Contract
from hud_pipelines.errors import (
    Fault,
    GraderError,
    HudPipelinesError,
    SimContractError,
    SimError,
    SimStartError,
    fault_of,
)
from hud_pipelines.eval.graders import Grader, build_graders
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.heap import release_free_heap
from hud_pipelines.eval.results import InstanceResult, unreached_result, unreached_rows
from hud_pipelines.recording.contained import ContainedSink
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus
from hud_pipelines.sim.pool import LiveSim, SimPool
from hud_pipelines.sim.settings import SimSettings
from hud_pipelines.spec.fleet import attached_servers
from hud_pipelines.spec.models import Partition, PipelineSpec
from hud_pipelines.spec.sim_section import probe_resets

log = logging.getLogger(__name__)
METRICS, BY_SIGNAL = "metrics", "success_by_signal"
"""Keys in :attr:`EpisodeOutcome.extra`: the grader metrics after the first; whether the env's signal decided."""

SinkFactory = Callable[[Partition, Contract], Sequence[EpisodeSink]]
"""Builds the sinks of one instance (traces, a dataset shard); the runner closes them."""
ResultCallback = Callable[[InstanceResult], None]


def sim_settings(spec: PipelineSpec, *, cwd: Path | None = None) -> SimSettings:
    """How the pipeline's sims are started (or attached to). How a registry id is vectorized (one env per slot by
    default: each slot keeps its own seed) is the sim's: ``serve`` and a pipeline build it the same way."""
    sim = spec.sim
    probes = probe_resets([(task.seed, task.options) for task in spec.tasks], spec.group * sim.num_envs)
    return SimSettings(
        factory=spec.factory,
        build_args=dict(sim.args),
        num_envs=sim.num_envs,
        contract_path=spec.contract_path,
        startup_timeout_s=sim.startup_timeout_s,
        step_timeout_s=sim.step_timeout_s,
        busy_timeout_s=sim.busy_timeout_s,
        options=tuple(sim.serve_options(probes)) if sim.spawned else (),
        servers=tuple(attached_servers(spec)),
        cwd=cwd,
        python=None if sim.python is None else spec.resolve_path(sim.python),
        shards=sim.shards,
        max_frame_bytes=sim.max_frame_bytes,
    )


@dataclass
class EvalRunner:
    """Runs instances of ``spec`` with sims from ``pool``; see the module docstring."""

    spec: PipelineSpec
    pool: SimPool
    job: str
    run_id: str = ""
    sinks: SinkFactory | None = None
    on_result: ResultCallback | None = None
    checkpoint: str | None = None
    """The label of the sweep member ``spec`` is: its instances are named ``<label>|<instance>`` in the log."""
    on_policy: Callable[[object], None] | None = None  # given the policy once built, before any instance runs
    _graders: list[Grader] = field(default_factory=list[Grader], init=False)
    _said: dict[tuple[Fault, str], str] = field(default_factory=dict[tuple[Fault, str], str], init=False)
    _details: dict[str, str] = field(default_factory=dict[str, str], init=False)  # below a headline: a stderr tail
    _saying: threading.Lock = field(default_factory=threading.Lock, init=False)
    _contract: Contract | None = field(default=None, init=False)
    _interrupted: bool = field(default=False, init=False)

    def contract(self) -> Contract:
        """The sim's contract (starts a sim that the first instance then reuses)."""
        if self._contract is None:
            self._contract = self.pool.contract()
        return self._contract

    def run(self, partitions: Sequence[Partition]) -> list[InstanceResult]:
        """Run ``partitions`` (at most ``max_concurrent`` at once); one result per partition, in order."""
        from hud_pipelines.agent.batching import BatchedModel
        from hud_pipelines.agent.factory import build_policy

        if not partitions:
            return []
        try:
            contract = self.contract()
        except HudPipelinesError as exc:  # no sim: every instance errors with the sim's own reason
            reason, fault = self._failure(exc)
            tried = exc.server if isinstance(exc, SimError) else None
            return [self._unstarted(partition, reason, fault, server=tried) for partition in partitions]
        agent = self.spec.resolved_agent()
        try:
            self._graders = build_graders(self.spec.resolved_graders(), base_dir=self.spec.base_dir)
        except HudPipelinesError as exc:  # no graders: every instance errors with the reason
            return [self._unstarted(partition, str(exc), Fault.SETUP) for partition in partitions]
        try:
            policy = build_policy(
                agent.policy,
                contract,
                base_dir=self.spec.base_dir,
                torch_threads=agent.torch_threads,
                lockstep_threads=agent.lockstep_threads,
            )
            if self.on_policy is not None:
                self.on_policy(policy)
        except CODE_FAILURES as exc:  # no policy: every instance errors with the reason
            if not code_failed(exc):  # a worker's shutdown goes on up
                raise
            of = f"{self.spec.name} (checkpoint {self.checkpoint})" if self.checkpoint else self.spec.name
            reason, fault = build_failure(exc, of)
            return [self._unstarted(partition, reason, fault) for partition in partitions]
        workers = min(self.spec.max_concurrent, len(partitions))
        model = BatchedModel.from_config(
            policy, agent.batching, expected_callers=workers, forward_timeout_s=agent.forward_timeout_s
        )
        remaining = [len(partitions)]
        lock = threading.Lock()

        def one(partition: Partition) -> InstanceResult:
            try:
                return self._run_instance(partition, model, contract)
            finally:
                with lock:  # fewer instances left than workers: stop waiting for callers that will not come
                    remaining[0] -= 1
                    if remaining[0] < workers:
                        model.leave()

        results: dict[Partition, InstanceResult] = {}
        with model, ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"hud-{self.spec.name}") as pool:
            futures = {pool.submit(one, partition): partition for partition in partitions}
            try:
                for future in as_completed(futures):
                    result = future.result()
                    results[futures[future]] = result
                    if self.on_result is not None:
                        self.on_result(result)
            except BaseException:  # cancellation: kill the sims and wake the policy's callers so workers return
                self._interrupted = True  # what the in-flight instances then meet is the interrupt, not a crash
                for future in futures:
                    future.cancel()
                model.abort("the run was interrupted")
                self.pool.close(grace_s=0)
                self._report_cut_short([f for f, p in futures.items() if p not in results])
                raise
        return [results[p] for p in partitions]

    def _report_cut_short(self, futures: list[Future[InstanceResult]]) -> None:
        """Hand on the results of the instances the interrupt cut short, once their workers return (their sims
        are gone, their policy calls woken: at once): the episodes that had ended keep their grades."""
        if self.on_result is None:
            return
        wait(futures)
        for future in futures:
            if not future.cancelled() and future.exception() is None:
                self.on_result(future.result())

    # -- one instance ----------------------------------------------------------------------------------

    def _run_instance(self, partition: Partition, model: Any, contract: Contract) -> InstanceResult:
        from hud_pipelines.agent.runner import RobotAgent

        spec = self.spec
        key = spec.partition_key(*partition)
        task = spec.tasks[partition.task_index]
        started = time.monotonic()
        sinks = list(self.sinks(partition, contract)) if self.sinks is not None else []
        outcomes: list[EpisodeOutcome] | None = None
        keys: list[EpisodeKey] = []
        failure: tuple[str, Fault] | None = None
        env_steps = 0
        server: str | None = None
        try:
            with (
                self.pool.sim() as live,
                _deadline(live, spec.rollout_timeout_s) as expired,
                model.caller_deadline(spec.rollout_timeout_s),
            ):
                server = live.server
                agent = RobotAgent(model, contract, horizon=spec.agent.horizon, send_ahead=spec.agent.send_ahead)
                tasks = spec.slot_tasks(*partition)
                keys = [
                    EpisodeKey(self.job, *partition, s, 0, t.get("seed"), task.name, task.control)
                    for s, t in enumerate(tasks)
                ]
                prompts = [task.prompt] * len(tasks) if task.prompt is not None else None

                def stop_cause() -> tuple[str, Fault] | None:
                    if self._interrupted:  # its sim is stopped by the interrupt: its traces say so, as its rows do
                        return f"the run was interrupted before instance {key} finished", Fault.INTERRUPTED
                    timeout = f"rollout_timeout_s={spec.rollout_timeout_s:g} exceeded: the instance's sim was stopped"
                    return (timeout, Fault.ROLLOUT_TIMEOUT) if expired.is_set() else None

                outcomes = agent.run(
                    live.client,
                    tasks,
                    max_steps=spec.max_steps,
                    key=lambda slot, seed: keys[slot],
                    sinks=sinks,
                    prompts=prompts,
                    grade=self._grade,
                    stop_cause=stop_cause,
                )
                env_steps = agent.last_run.env_steps
                failure = stop_cause() or _instance_failure(outcomes)
                if failure is None and not live.process.alive():
                    failure = ("the sim process died", Fault.SIM_CRASHED)
                if failure is not None and failure[1] not in (Fault.POLICY_TIMEOUT, Fault.POLICY_LINK):
                    live.healthy = False  # a late or lost policy leaves the sim sound; any other fault does not
                    live.hung = failure[1] is Fault.SIM_HUNG
        except (SimError, HudPipelinesError) as exc:
            failure = self._failure(exc)
            if isinstance(exc, SimError) and exc.server is not None:
                server = exc.server  # the served sim it tried, though it never got it
        finally:
            for sink in sinks:
                with contextlib.suppress(Exception):
                    sink.close()
            release_free_heap()  # the instance's buffers are free now: give their pages back
        wall = time.monotonic() - started
        named = failure is not None and failure[0].startswith(f"served sim {server}: ")  # by the pool already
        if failure is not None and server is not None and not named:  # which machine of a fleet it was
            failure = (f"served sim {server}: {failure[0]}", failure[1])
        if outcomes is None:
            reason, fault = failure or ("the instance did not run", Fault.NOT_RUN)
            rows = unreached_rows(spec, partition, reason, fault, run_id=self.run_id)
        else:
            rows = [self._row(partition, slot, keys[slot], outcome) for slot, outcome in enumerate(outcomes)]
        if failure is not None and self._interrupted:  # its sim was stopped by the interrupt: recorded as such
            log.info("instance %s of %s stopped by the interrupt (%s)", key, spec.name, failure[0])
            failure = (f"the run was interrupted before instance {key} finished", Fault.INTERRUPTED)
            rows = [_interrupted(row, failure[0]) for row in rows]
        elif failure is not None:
            self._say_failed(key, failure[1], failure[0])
        stopped = [f"{sink.what}: {sink.failure}" for sink in sinks if isinstance(sink, ContainedSink) and sink.failure]
        result = InstanceResult.of(
            spec, partition, rows, failure=failure, run_id=self.run_id, wall_s=wall, env_steps=env_steps, server=server
        )
        return dataclasses.replace(result, recording=tuple(stopped)) if stopped else result

    def _failure(self, exc: BaseException) -> tuple[str, Fault]:
        """Why an instance failed, in a line, and its fault; a contract file the env outgrew says how to refresh it."""
        reason, fault = _first_line(exc), fault_of(exc)
        contract = self.spec.contract_path
        sims_own = isinstance(exc, SimContractError)  # its frames broke the contract it announced: no file fixes it
        if fault is Fault.CONTRACT and not sims_own and contract is not None and contract.is_file():
            from hud_pipelines.spec.loader import refresh_hint

            reason = f"{reason}; {refresh_hint(contract)}"
        if detail := str(exc).strip().partition("\n")[2]:
            self._details.setdefault(reason, detail[-20_000:])  # a stderr tail's last lines hold its stacks
        return reason, fault

    def _unstarted(self, partition: Partition, reason: str, fault: Fault, server: str | None = None) -> InstanceResult:
        """The result of an instance whose sim or policy could not be had (reported like any other result)."""
        result = unreached_result(self.spec, partition, reason, fault, run_id=self.run_id, server=server)
        self._say_failed(self.spec.partition_key(*partition), fault, reason)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _say_failed(self, key: str, fault: Fault, reason: str) -> None:
        """A line per failed instance; one that failed as an earlier one did points at it (a policy that cannot
        be built, a sim that is down, fails every instance alike: the reason once, not once per instance)."""
        named = f"{self.checkpoint}|{key}" if self.checkpoint else key
        with self._saying:  # the first instance's line, with the reason, comes before those that point at it
            first = self._said.setdefault((fault, reason), named)
            detail = self._details.get(reason)  # the first line with the reason says the rest of it too
            said = f"as instance {first}" if first != named else f"{reason}\n{detail}" if detail else reason
            log.error("instance %s of %s failed (%s): %s", named, self.spec.name, fault.value, said)

    def _grade(self, key: EpisodeKey, outcome: EpisodeOutcome) -> EpisodeOutcome:
        """The pipeline's verdict on an answered episode: the first grader decides, the others add metrics."""
        graded = [(grader.name, grader.grade(outcome, key)) for grader in self._graders]
        for name, grade in graded:  # never a number in the grades, whichever grader: the episode errors
            if not math.isfinite(grade.score):
                raise GraderError(f"grader {name!r} gave a score that is not finite: {grade.score}")
        (_, verdict), *others = graded
        metrics: dict[str, float | bool] = {}
        for name, grade in others:
            metrics[f"{name}_score"] = grade.score
            metrics[f"{name}_success"] = grade.success
        return dataclasses.replace(
            outcome,
            status=EpisodeStatus.SUCCEEDED if verdict.success else EpisodeStatus.FAILED,
            score=verdict.score,
            success=verdict.success,
            extra={**outcome.extra, METRICS: metrics, BY_SIGNAL: verdict.by_signal},
        )

    def _row(self, partition: Partition, slot: int, key: EpisodeKey, outcome: EpisodeOutcome) -> GradeRow:
        """The grade row of a slot whose outcome :meth:`_grade` (or the fault that ended it) decided."""
        spec = self.spec
        errored = outcome.status is EpisodeStatus.ERRORED
        metrics: dict[str, float | bool] = outcome.extra.get(METRICS, {})
        return GradeRow(
            pipeline=spec.name,
            task=spec.tasks[partition.task_index].name,
            task_index=partition.task_index,
            instance=partition.instance,
            group_id=spec.partition_key(*partition),
            slot=slot,
            seed=key.seed,
            status=outcome.status,
            score=0.0 if errored else outcome.score,
            success=outcome.success and not errored,
            total_reward=outcome.total_reward,
            steps=outcome.steps,
            error=outcome.error,
            trace_id=key.trace_id,
            metrics=dict(metrics),
            fault=outcome.fault if errored else None,
            run_id=self.run_id,
            success_reported=outcome.success_reported,
            success_by_signal=None if errored else outcome.extra.get(BY_SIGNAL),
            ended=outcome.ended,
        )


@contextlib.contextmanager
def _deadline(live: LiveSim, seconds: float) -> Generator[threading.Event]:
    """Stop ``live`` when the block runs longer than ``seconds``; the event tells whether it fired."""
    expired = threading.Event()

    def fire() -> None:
        expired.set()
        log.warning("rollout deadline of %.0f s reached; stopping the sim", seconds)
        live.kill()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield expired
    finally:
        timer.cancel()


def _interrupted(row: GradeRow, reason: str) -> GradeRow:
    """A row as the interrupt left it: one its stop ended is ``interrupted``; one that ended before keeps its grade."""
    if row.fault is None or not row.fault.ends_instance:
        return row
    return dataclasses.replace(row, error=reason, fault=Fault.INTERRUPTED)


def _instance_failure(outcomes: Sequence[EpisodeOutcome]) -> tuple[str, Fault] | None:
    """The reason and fault of an errored slot whose fault ended the whole instance, if any."""
    for outcome in outcomes:
        if outcome.fault is not None and outcome.fault.ends_instance:
            return outcome.error or outcome.fault.value, outcome.fault
    return None


def _first_line(exc: BaseException) -> str:
    """The headline of an error (its first line); one a sim that did not start reported itself says so first."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__  # a sim's: with its hint (what to install)
    return f"the sim did not start: {first}" if isinstance(exc, SimStartError) and exc.child_error else first


__all__ = ["EvalRunner", "sim_settings"]
