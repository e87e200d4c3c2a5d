"""A sweep in Dagster: a checkpoint dimension, and the sensor that evaluates checkpoints as training writes them.

A sweep's rollouts are partitioned by (checkpoint, instance): Dagster's multi-partitions with a dynamic
``checkpoint`` dimension (``<name>__checkpoints``) beside the static instances, so each pair shows, fails
and re-runs on its own. Dimensions are ordered by name, so a partition key reads ``<label>|<instance>``,
as :mod:`hud_pipelines.eval.sweep` writes it, and a range ``L|first .. L|last`` is every instance of one
checkpoint.

The sensor polls the sweep's sources. A checkpoint it has not registered yet that is complete (every
file there, none changed for a few seconds) is added to the dimension and gets one run for its
instances; a half-written one waits, and the sensor says why. The eval runs in its own process, never
in the trainer's. Registering happens before a run either way: ``hud-pipelines run`` registers what it
finds, and the job's default range is every checkpoint complete when the code location loaded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from hud_pipelines.agent.checkpoint_files import SETTLING
from hud_pipelines.agent.checkpoints import DEFAULT_SETTLE_S, Discovery
from hud_pipelines.errors import CheckpointError
from hud_pipelines.eval import sweep
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.models import Partition, PipelineSpec

CHECKPOINT_DIMENSION = "checkpoint"
INSTANCE_DIMENSION = "instance"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
RERUN_TAG = "hud_pipelines/rerun"
"""A run tagged ``true`` re-runs pairs that already have a current result (by default they are kept)."""
CHECKPOINTS_TAG = "hud_pipelines/checkpoints"
"""Comma-separated labels: a run evaluates only these checkpoints of its partition range."""
SENSOR_INTERVAL_S = 30


def checkpoints_partitions_name(pipeline: str) -> str:
    return f"{pipeline}__checkpoints"


def partitions(spec: PipelineSpec) -> dg.MultiPartitionsDefinition:
    """(checkpoint, instance): the dynamic checkpoints of the sweep crossed with its task instances."""
    return dg.MultiPartitionsDefinition(
        {
            CHECKPOINT_DIMENSION: dg.DynamicPartitionsDefinition(name=checkpoints_partitions_name(spec.name)),
            INSTANCE_DIMENSION: dg.StaticPartitionsDefinition(spec.partition_keys()),
        }
    )


def range_tags(spec: PipelineSpec, labels: Sequence[str]) -> dict[str, str]:
    """The run tags selecting every instance of the checkpoints ``labels`` (consecutive in sweep order)."""
    keys = spec.partition_keys()
    return {RANGE_START_TAG: f"{labels[0]}|{keys[0]}", RANGE_END_TAG: f"{labels[-1]}|{keys[-1]}"}


def default_tags(spec: PipelineSpec) -> dict[str, str]:
    """The job's default range: every checkpoint complete now (none when there is none yet)."""
    try:
        found = sweep.discover(spec).complete
    except CheckpointError:
        return {}
    return range_tags(spec, [c.label for c in found]) if found else {}


def register(instance: dg.DagsterInstance, spec: PipelineSpec, labels: Sequence[str]) -> list[str]:
    """Add the checkpoints ``labels`` to the sweep's dimension; returns those that were new."""
    name = checkpoints_partitions_name(spec.name)
    known = set(instance.get_dynamic_partitions(name))
    new = [label for label in labels if label not in known]
    if new:
        instance.add_dynamic_partitions(name, new)
    return new


def _settled(spec: PipelineSpec, wanted: Sequence[str] | None) -> Discovery:
    """The sweep's checkpoints once those asked for (``wanted``; default every one) that only wait out the
    settle time have settled.

    A run asked for right after a checkpoint was saved waits those seconds instead of skipping it (or
    finding nothing to run); one that keeps changing, or lacks files, still waits for the sensor.
    """

    def settling(found: Discovery) -> bool:
        return any(
            p.reason.startswith(SETTLING) and (wanted is None or p.checkpoint.label in wanted) for p in found.pending
        )

    found = sweep.discover(spec)
    deadline = time.monotonic() + 2 * DEFAULT_SETTLE_S
    while settling(found) and time.monotonic() < deadline:
        time.sleep(0.25)
        found = sweep.discover(spec)
    return found


def run_tags(
    instance: dg.DagsterInstance,
    spec: PipelineSpec,
    instances: Sequence[str],
    *,
    checkpoints: Sequence[str] | None = None,
    rerun: bool = False,
) -> tuple[dict[str, str], list[str], str]:
    """Tags of a run of the checkpoints ``checkpoints`` (default: every complete one) x ``instances``; those
    labels; and the checkpoints that are not complete yet, each with why (``""`` when none waits).

    Every complete checkpoint is registered first (a run may only name registered partitions). A label
    that is not a complete checkpoint is an error naming the known ones and why the others wait.
    """
    found = _settled(spec, checkpoints or None)
    complete = [c.label for c in found.complete]
    waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending)
    chosen = list(checkpoints) if checkpoints else complete
    unknown = [label for label in chosen if label not in complete]
    if not complete or unknown:
        what = f"no checkpoint labelled {', '.join(unknown)}" if unknown else "no complete checkpoint"
        raise CheckpointError(
            f"{spec.name}: {what}; complete: {', '.join(complete) or 'none'}"
            + (f"; waiting: {waiting}" if waiting else "")
        )
    register(instance, spec, complete)
    registered = instance.get_dynamic_partitions(checkpoints_partitions_name(spec.name))
    positions = sorted(registered.index(label) for label in chosen)
    tags = {
        RANGE_START_TAG: f"{registered[positions[0]]}|{instances[0]}",
        RANGE_END_TAG: f"{registered[positions[-1]]}|{instances[-1]}",
    }
    if checkpoints:
        tags[CHECKPOINTS_TAG] = ",".join(chosen)
    if rerun:
        tags[RERUN_TAG] = "true"
    return tags, chosen, waiting


@dataclass(frozen=True)
class Selection:
    """What a run of a sweep asks for: the members of its checkpoints and, per label, the instances."""

    members: list[sweep.Member]
    pairs: dict[str, list[Partition]]
    gone: list[str]
    """Labels of the run's range that are not (or no longer) complete checkpoints: not run."""
    rerun: bool

    @property
    def asked(self) -> int:
        return sum(len(parts) for parts in self.pairs.values())


def selection(
    spec: PipelineSpec, outputs: EvalOutputs, partition_keys: Sequence[str], tags: Mapping[str, str]
) -> Selection:
    """The (checkpoint, instance) pairs of a run's partition range (only the labels its tag names, if it does)."""
    only = tags.get(CHECKPOINTS_TAG)
    wanted = set(only.split(",")) if only else None
    pairs: dict[str, list[Partition]] = {}
    for key in partition_keys:
        label, instance = sweep.split_partition_key(key)
        if wanted is None or label in wanted:
            pairs.setdefault(label, []).append(spec.partition_for_key(instance))
    members = sweep.members(spec, outputs, settle_s=0.0, labels=list(pairs))
    gone = sorted(set(pairs) - {m.label for m in members})
    return Selection(members, pairs, gone, rerun=tags.get(RERUN_TAG) == "true")


def checkpoint_sensor(spec: PipelineSpec) -> dg.SensorDefinition:
    """The sensor that registers the sweep's new complete checkpoints and runs each one's instances."""
    name = checkpoints_partitions_name(spec.name)

    @dg.sensor(
        name=f"{spec.name}__checkpoints",
        job_name=spec.name,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Evaluates each new checkpoint of {spec.name} once it is completely written.",
    )
    def watch(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        try:
            found = sweep.discover(spec)
        except CheckpointError as exc:
            return dg.SkipReason(f"no checkpoint to evaluate: {exc}")
        known = set(context.instance.get_dynamic_partitions(name))
        new = [c.label for c in found.complete if c.label not in known]
        waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending)
        if not new:
            return dg.SkipReason(f"no new complete checkpoint{f' (waiting for {waiting})' if waiting else ''}")
        if waiting:
            context.log.info(f"{spec.name}: waiting for {waiting}")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=label, tags=range_tags(spec, [label])) for label in new],
            dynamic_partitions_requests=[dg.AddDynamicPartitionsRequest(partitions_def_name=name, partition_keys=new)],
        )

    return watch
