"""One attempt of a unit on a Celery worker: what it runs, what it reports, and what a lost worker leaves.

A unit runs one instance (of the pipeline, or of a sweep's checkpoint) with its own sim set. Each
attempt reports its partition with its worker; an attempt after the last retry records the
instance as lost, unless what it would replace stands (:func:`record_lost`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import OpExecutionContext

from hud_pipelines.dagster.metadata import instance_metadata
from hud_pipelines.dagster.unit_tags import RESULT_METADATA
from hud_pipelines.dataset.shards import ShardStore
from hud_pipelines.errors import Fault
from hud_pipelines.eval.kept import kept_result
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.runner import InstanceResult, unreached_result
from hud_pipelines.spec.models import Partition, PipelineSpec


@dataclass(frozen=True)
class Unit:
    """One unit of a run: which instance of which eval (a sweep member's, or the pipeline's) it runs."""

    spec: PipelineSpec
    outputs: EvalOutputs
    partition: Partition
    partition_key: str
    """The unit's Dagster partition: ``<task>-i<k>``, or ``<label>|<task>-i<k>`` in a sweep."""
    checkpoint: str | None = None
    """The sweep member's label (None outside a sweep)."""

    @property
    def result_path(self) -> Path:
        return self.outputs.result(self.spec.partition_key(*self.partition))


def record_lost(context: OpExecutionContext, unit: Unit, lost: int, rollouts_key: dg.AssetKey) -> InstanceResult:
    """Record the unit's instance as failed: its worker was lost ``lost`` time(s), no retry is left, and the lost
    attempt wrote no result of it (:func:`stands_after_the_loss`, asked first).

    Unless an earlier run of the same configuration completed it: that result stays, as it stays when a sim
    dies under an instance (:data:`~hud_pipelines.eval.kept.KEEPS_EARLIER`), and the finish step fails the
    run saying so. What the lost attempt staged of its shard is left: its worker may only be cut off and run on
    (its result and shard then stand as any attempt's); a later run's commit of the instance clears it.
    """
    run_id = context.run.run_id
    reason = (
        f"the worker running instance {unit.partition_key} was lost {lost} time(s) "
        f"({_last_loss(context) or 'its lease expired'}); not retried again"
    )
    result = unreached_result(unit.spec, unit.partition, reason, Fault.WORKER_LOST, run_id=run_id)
    with unit.outputs.instance_lock(result.key):  # a run of it ending meanwhile puts its result in place first
        if kept_result(result, unit.outputs) is None:  # an earlier complete result of the same configuration stays
            result.write(unit.result_path)
    context.log.error(reason)
    report_attempt(context, unit, result, rollouts_key, lost)
    return result


def stands_after_the_loss(
    context: OpExecutionContext, unit: Unit, lost: int, rollouts_key: dg.AssetKey
) -> InstanceResult | None:
    """The result a lost attempt had written of its instance, which stands (reported for this attempt): the
    attempt after a loss, a retry or the last one, does not run the instance again or record it as lost."""
    run_id = context.run.run_id
    shards = ShardStore(unit.outputs, unit.spec, run_id=run_id) if unit.spec.dataset_enabled else None
    finished = finished_before_the_loss(unit, run_id, shards)
    if finished is not None:
        context.log.warning(f"{unit.partition_key}: the lost worker had ended the instance: its result stands")
        report_attempt(context, unit, finished, rollouts_key, lost)
    return finished


def finished_before_the_loss(unit: Unit, run_id: str, shards: ShardStore | None) -> InstanceResult | None:
    """This run's result of the unit's instance, with its committed shard, if the lost attempt wrote them before
    its worker went (the lease is dropped only after the step reports): what it measured, complete or not
    (a sim that crashed under it), but not a cut short attempt's ``interrupted``."""
    try:
        written = InstanceResult.read(unit.result_path)
    except (OSError, ValueError, KeyError):
        return None
    if written.run_id != run_id or written.fault is Fault.INTERRUPTED:
        return None
    return written if shards is None or shards.written_by(unit.spec.partition_key(*unit.partition), run_id) else None


def _last_loss(context: OpExecutionContext) -> str | None:
    """Why the previous attempt of this step ended, as the run recorded it (the worker and its lease)."""
    mapping = context.get_mapping_key()
    step_key = f"{context.op_handle}[{mapping}]" if mapping else str(context.op_handle)
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY
    ).records
    for record in reversed(records):
        event = record.event_log_entry.dagster_event
        if event is not None and event.step_key == step_key:
            return event.step_retry_data.error.message
    return None


def report_attempt(
    context: OpExecutionContext, unit: Unit, result: InstanceResult, rollouts_key: dg.AssetKey, attempt: int
) -> None:
    """The unit's partition: observed with its figures and its worker, materialized if the instance completed."""
    metadata: dict[str, Any] = {
        **instance_metadata(result),
        "worker": _worker(),
        "worker_pid": os.getpid(),
        "attempt": attempt + 1,
        RESULT_METADATA: dg.MetadataValue.path(str(unit.result_path)),
    }
    if unit.checkpoint is not None:
        metadata["checkpoint"] = unit.checkpoint
    context.log_event(dg.AssetObservation(asset_key=rollouts_key, partition=unit.partition_key, metadata=metadata))
    if not result.failed:
        context.log_event(
            dg.AssetMaterialization(asset_key=rollouts_key, partition=unit.partition_key, metadata=metadata)
        )


def _worker() -> str:
    """The Celery worker running this step (its node name), else this host."""
    try:
        from celery import current_task
    except ImportError:  # pragma: no cover - celery is a dependency; kept for a trimmed install
        return socket.gethostname()
    request = getattr(current_task, "request", None)
    return str(getattr(request, "hostname", None) or socket.gethostname())
