"""What one instance produced in one run, and how it is kept: ``outputs/<name>/rollouts/<partition>.json``.

A result carries its rows (one per slot), whether the instance failed and why (its fault), the run
that produced it and the rollout hash it ran under, so the grades can tell current results from
stale ones. An instance that never reached its episodes still has a result: errored rows saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import write_atomically
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.models import Partition, PipelineSpec


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
    """Its task's :meth:`~PipelineSpec.task_rollout_hash` when the instance ran (the pipeline's
    :attr:`~PipelineSpec.rollout_hash` in results recorded before tasks were hashed alone)."""
    fault: Fault | None = None
    """Why the instance failed (``None`` when it ran to the end, whatever its episodes scored)."""
    run_id: str = ""
    """The run that produced this result."""
    server: str | None = None
    """The served sim it ran on (``None`` for a spawned sim)."""
    provenance: dict[str, Any] = field(default_factory=dict[str, Any])
    """Where it came from (:mod:`hud_pipelines.eval.provenance`): code, packages, sim, policy, seeds."""
    recording: tuple[str, ...] = ()
    """Why a recorder of it stopped (its traces, or its dataset shard): they hold only part of its episodes,
    whose grades stand (:mod:`hud_pipelines.recording.contained`)."""

    @classmethod
    def of(
        cls,
        spec: PipelineSpec,
        partition: Partition,
        rows: list[GradeRow],
        *,
        failure: tuple[str, Fault] | None,
        run_id: str,
        wall_s: float = 0.0,
        env_steps: int = 0,
        server: str | None = None,
    ) -> InstanceResult:
        """The result of ``partition`` of ``spec``: its rows and, if it failed, why (reason and fault)."""
        return cls(
            spec.name,
            spec.partition_key(*partition),
            partition.task_index,
            partition.instance,
            rows,
            wall_s,
            env_steps,
            None if failure is None else failure[0],
            spec.task_rollout_hash(partition.task_index),
            fault=None if failure is None else failure[1],
            run_id=run_id,
            server=server,
        )

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
            "fault": None if self.fault is None else self.fault.value,
            "run_id": self.run_id,
            "server": self.server,
            "provenance": self.provenance,
            **({"recording": list(self.recording)} if self.recording else {}),
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
            fault=Fault(data["fault"]) if data.get("fault") else None,
            run_id=data.get("run_id", ""),
            server=data.get("server"),
            provenance=dict(data.get("provenance") or {}),
            recording=tuple(data.get("recording") or ()),
        )

    def write(self, path: Path) -> None:
        """Write as JSON, atomically (a reader never sees half a result)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(self.as_dict(), indent=1))

    @classmethod
    def read(cls, path: Path) -> InstanceResult:
        return cls.from_dict(json.loads(path.read_text()))


def unreached_rows(
    spec: PipelineSpec, partition: Partition, reason: str, fault: Fault, *, run_id: str = ""
) -> list[GradeRow]:
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
            fault=fault,
            run_id=run_id,
        )
        for slot, seed in enumerate(spec.seeds_for(*partition))
    ]


def unreached_result(
    spec: PipelineSpec, partition: Partition, reason: str, fault: Fault, *, run_id: str, server: str | None = None
) -> InstanceResult:
    """The result of an instance that ended before any episode ran (errored rows, the instance failed);
    ``server``: the served sim it tried, if any."""
    rows = unreached_rows(spec, partition, reason, fault, run_id=run_id)
    return InstanceResult.of(spec, partition, rows, failure=(reason, fault), run_id=run_id, server=server)


def recording_warning(results: Iterable[InstanceResult]) -> str | None:
    """A warning naming the instances whose traces or dataset shard a failed recorder left partial."""
    stopped = [f"{result.key}: {'; '.join(result.recording)}" for result in results if result.recording]
    if not stopped:
        return None
    return f"recording stopped in {len(stopped)} instance(s), whose grades stand: {' | '.join(stopped)}"
