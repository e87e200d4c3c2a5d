"""Run the instances of one eval: ``group`` instances per task, each one sim of ``num_envs`` slots.

An *instance* (a Dagster partition) is the unit of work and of failure: one sim, one
:class:`~hud_pipelines.agent.runner.RobotAgent` run over its ``num_envs`` slots, one graded row per
slot. Instances run on worker threads, at most ``max_concurrent`` at once, and share one policy
through :class:`~hud_pipelines.agent.batching.BatchedModel`, so k concurrent sims cost one forward
per lockstep tick rather than k.

Faults stay where they happen:

- a slot whose env raised ends errored; its instance goes on;
- an instance whose sim could not start, died, hung past ``step_timeout_s`` or ran past
  ``rollout_timeout_s`` (its sim is killed) *fails*: its running slots end errored, its result says
  why, and the other instances finish and keep their results.

Nothing here knows Dagster; the Dagster assets and the plain Python API call :class:`EvalRunner`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hud_pipelines.contract import Contract
from hud_pipelines.errors import HudPipelinesError, SimError
from hud_pipelines.graders import Grader, build_graders
from hud_pipelines.grading import GradeRow
from hud_pipelines.recording import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus
from hud_pipelines.sim.factory import VECTORIZATION_MODE
from hud_pipelines.simpool import LiveSim, SimPool, SimSettings
from hud_pipelines.spec.models import Partition, PipelineSpec

log = logging.getLogger(__name__)

SinkFactory = Callable[[Partition, Contract], Sequence[EpisodeSink]]
"""Builds the sinks of one instance (traces, a dataset shard); the runner closes them."""
ResultCallback = Callable[["InstanceResult"], None]


@dataclass(frozen=True)
class InstanceResult:
    """What one instance produced: a graded row per slot, and why it failed if it did."""

    pipeline: str
    key: str
    task_index: int
    instance: int
    rows: list[GradeRow]
    wall_s: float
    env_steps: int
    error: str | None = None
    rollout_hash: str = ""
    """The pipeline's :attr:`~PipelineSpec.rollout_hash` when the instance ran."""

    @property
    def failed(self) -> bool:
        return self.error is not None

    def counts(self) -> dict[str, int]:
        return {status.value: sum(r.status is status for r in self.rows) for status in EpisodeStatus}

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "key": self.key,
            "task_index": self.task_index,
            "instance": self.instance,
            "rows": [r.as_dict() for r in self.rows],
            "wall_s": self.wall_s,
            "env_steps": self.env_steps,
            "error": self.error,
            "rollout_hash": self.rollout_hash,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InstanceResult:
        return cls(
            pipeline=data["pipeline"],
            key=data["key"],
            task_index=data["task_index"],
            instance=data["instance"],
            rows=[GradeRow.from_dict(r) for r in data["rows"]],
            wall_s=data["wall_s"],
            env_steps=data["env_steps"],
            error=data["error"],
            rollout_hash=data.get("rollout_hash", ""),
        )

    def write(self, path: Path) -> None:
        """Write as JSON, atomically (a reader never sees half a result)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(self.as_dict(), indent=1))
        partial.replace(path)

    @classmethod
    def read(cls, path: Path) -> InstanceResult:
        return cls.from_dict(json.loads(path.read_text()))


def sim_settings(spec: PipelineSpec, *, cwd: Path | None = None) -> SimSettings:
    """How the pipeline's sims are started (or attached to).

    A registry id with several slots is vectorized with gymnasium's ``sync`` mode unless the
    pipeline picks a ``vectorization_mode``: only then does every slot get its own seed (a native
    ``vector_entry_point`` env such as CartPole's takes one seed for the whole batch), so a slot's
    episode does not depend on ``num_envs``.
    """
    sim = spec.sim
    build_args = dict(sim.args)
    registry_id = spec.factory is not None and ":" not in spec.factory
    if registry_id and sim.num_envs > 1:
        build_args.setdefault(VECTORIZATION_MODE, "sync")
    return SimSettings(
        factory=spec.factory,
        build_args=build_args,
        num_envs=sim.num_envs,
        contract_path=spec.contract_path,
        startup_timeout_s=sim.startup_timeout_s,
        step_timeout_s=sim.step_timeout_s,
        options=tuple(sim.serve_options()) if sim.spawned else (),
        url=sim.url,
        token=None if sim.token is None else sim.token.get_secret_value(),
        cwd=cwd,
    )


def unreached_rows(spec: PipelineSpec, partition: Partition, reason: str) -> list[GradeRow]:
    """Errored rows for every slot of an instance that produced no result of its own."""
    task = spec.tasks[partition.task_index]
    key = spec.partition_key(*partition)
    return [
        GradeRow(
            pipeline=spec.name,
            task=task.name,
            task_index=partition.task_index,
            instance=partition.instance,
            group_id=key,
            slot=slot,
            seed=seed,
            status=EpisodeStatus.ERRORED,
            score=0.0,
            success=False,
            total_reward=0.0,
            steps=0,
            error=reason,
        )
        for slot, seed in enumerate(spec.seeds_for(*partition))
    ]


@dataclass
class EvalRunner:
    """Runs instances of ``spec`` with sims from ``pool``; see the module docstring."""

    spec: PipelineSpec
    pool: SimPool
    job: str
    sinks: SinkFactory | None = None
    on_result: ResultCallback | None = None
    _graders: list[Grader] = field(init=False)
    _contract: Contract | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._graders = build_graders(self.spec.resolved_graders(), base_dir=self.spec.base_dir)

    def contract(self) -> Contract:
        """The sim's contract (starts a sim that the first instance then reuses)."""
        if self._contract is None:
            with self.pool.sim() as live:
                self._contract = live.client.contract
        return self._contract

    def run(self, partitions: Sequence[Partition]) -> list[InstanceResult]:
        """Run ``partitions`` (at most ``max_concurrent`` at once); one result per partition, in order."""
        from hud_pipelines.agent.batching import BatchedModel
        from hud_pipelines.agent.policy import build_policy

        if not partitions:
            return []
        contract = self.contract()
        agent = self.spec.resolved_agent()
        policy = build_policy(
            agent.policy,
            contract,
            base_dir=self.spec.base_dir,
            torch_threads=agent.torch_threads,
            lockstep_threads=agent.lockstep_threads,
        )
        workers = min(self.spec.max_concurrent, len(partitions))
        model = BatchedModel(
            policy,
            max_wait_s=agent.batching.max_wait_ms / 1000,
            batch_size=agent.batching.batch_size,
            expected_callers=workers,
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
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"hud-{self.spec.name}") as pool:
            futures = {pool.submit(one, partition): partition for partition in partitions}
            try:
                for future in as_completed(futures):
                    result = future.result()
                    results[futures[future]] = result
                    if self.on_result is not None:
                        self.on_result(result)
            except BaseException:  # cancellation: kill the sims so the workers return at once
                for future in futures:
                    future.cancel()
                self.pool.close(grace_s=0)
                raise
        return [results[p] for p in partitions]

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
        error: str | None = None
        env_steps = 0
        try:
            with self.pool.sim() as live, _deadline(live, spec.rollout_timeout_s) as expired:
                agent = RobotAgent(model, contract, horizon=spec.agent.horizon, send_ahead=spec.agent.send_ahead)
                tasks = spec.slot_tasks(*partition)
                keys = [
                    EpisodeKey(self.job, partition.task_index, partition.instance, s, 0, t.get("seed"))
                    for s, t in enumerate(tasks)
                ]
                prompts = [task.prompt] * len(tasks) if task.prompt is not None else None
                outcomes = agent.run(
                    live.client,
                    tasks,
                    max_steps=spec.max_steps,
                    key=lambda slot, seed: keys[slot],
                    sinks=sinks,
                    prompts=prompts,
                )
                env_steps = agent.last_run.env_steps
                if expired.is_set():
                    error = f"rollout_timeout_s={spec.rollout_timeout_s:g} exceeded: the instance's sim was stopped"
                elif not live.process.alive() or _sim_fault(outcomes):
                    error = _sim_fault(outcomes) or "the sim process died"
                if error is not None:
                    live.healthy = False
        except (SimError, HudPipelinesError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            for sink in sinks:
                with contextlib.suppress(Exception):
                    sink.close()
        wall = time.monotonic() - started
        if outcomes is None:
            rows = unreached_rows(spec, partition, error or "the instance did not run")
        else:
            rows = [self._row(partition, slot, keys[slot], outcome) for slot, outcome in enumerate(outcomes)]
        if error is not None:
            log.error("instance %s of %s failed: %s", key, spec.name, error)
        return InstanceResult(
            spec.name, key, partition.task_index, partition.instance, rows, wall, env_steps, error, spec.rollout_hash
        )

    def _row(self, partition: Partition, slot: int, key: EpisodeKey, outcome: EpisodeOutcome) -> GradeRow:
        spec = self.spec
        primary, *others = self._graders
        score, success = primary.grade(outcome, key)
        status = outcome.status
        if status is not EpisodeStatus.ERRORED:
            status = EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED
        metrics: dict[str, float | bool] = {}
        for grader in others:
            extra_score, extra_success = grader.grade(outcome, key)
            metrics[f"{grader.name}_score"] = extra_score
            metrics[f"{grader.name}_success"] = extra_success
        return GradeRow(
            pipeline=spec.name,
            task=spec.tasks[partition.task_index].name,
            task_index=partition.task_index,
            instance=partition.instance,
            group_id=spec.partition_key(*partition),
            slot=slot,
            seed=key.seed,
            status=status,
            score=score if status is not EpisodeStatus.ERRORED else 0.0,
            success=success and status is EpisodeStatus.SUCCEEDED,
            total_reward=outcome.total_reward,
            steps=outcome.steps,
            error=outcome.error,
            trace_id=key.trace_id,
            metrics=metrics,
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


_SIM_FAULTS = ("SimCrashedError", "SimTimeoutError", "SimError", "RemoteError", "WireError")


def _sim_fault(outcomes: Sequence[EpisodeOutcome]) -> str | None:
    """The reason of an errored slot that the sim link (not the slot's own env) caused, if any."""
    for outcome in outcomes:
        if outcome.status is EpisodeStatus.ERRORED and outcome.error and outcome.error.startswith(_SIM_FAULTS):
            return outcome.error
    return None
