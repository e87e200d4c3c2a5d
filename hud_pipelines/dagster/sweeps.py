"""A sweep in Dagster: a checkpoint dimension, and the sensor that evaluates checkpoints as training writes them.

A sweep's rollouts are partitioned by (checkpoint, instance): Dagster's multi-partitions with a dynamic
``checkpoint`` dimension (``<name>__checkpoints``) beside the static instances, so each pair shows, fails
and re-runs on its own. Dimensions are ordered by name, so a partition key reads ``<label>|<instance>``,
as :mod:`hud_pipelines.eval.sweep` writes it, and a range ``L|first .. L|last`` is every instance of one
checkpoint.

The sensor polls the sweep's sources. A checkpoint it has not registered yet that is complete (every
file there, none changed for a few seconds) is added to the dimension and gets one run for its
instances; a half-written one waits, and the sensor says why. An evaluated one whose files changed
since (other weights under its label) gets one run again per version of its content. The eval runs in
its own process, never in the trainer's. Registering happens before a run either way: ``hud-pipelines
run`` registers what it finds, and the job's default range is the registered checkpoints complete when
the code location loaded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from hud_pipelines.agent.checkpoint_files import SETTLING
from hud_pipelines.agent.checkpoints import DEFAULT_SETTLE_S, Checkpoint, Discovery, label_named, several_named
from hud_pipelines.dagster.overlap import unfinished_runs
from hud_pipelines.errors import CheckpointError, Fault
from hud_pipelines.eval import sweep
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.spec.models import Partition, PipelineSpec
from hud_pipelines.spec.problems import did_you_mean

CHECKPOINT_DIMENSION = "checkpoint"
INSTANCE_DIMENSION = "instance"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
RERUN_TAG = "hud_pipelines/rerun"
"""A run tagged ``true`` re-runs pairs that already have a current result (by default they are kept)."""
CHECKPOINTS_TAG = "hud_pipelines/checkpoints"
"""Comma-separated labels: a run evaluates only these checkpoints of its partition range."""
SENSOR_INTERVAL_S = 30
CANCELLED_RUNS_READ = 20
"""How many of a sensor's latest cancelled runs it reads on each tick for checkpoints they left unstarted."""


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
    """The job's default range (what ``dagster job execute -j <sweep>`` runs): the registered checkpoints that
    are complete as the code location loads, from the first to the last in the order they were registered.

    A range may only name registered checkpoints, and Dagster orders them as they were registered (a
    checkpoint of a lower step found later stands last), so the range is read from the instance, never from
    the files alone. Nothing is registered here: the sensor runs each checkpoint it registers, and a
    checkpoint registered behind its back would never be run by it. A run of this range says which
    complete checkpoints it leaves out for being unregistered (:func:`selection`). No range (no instance,
    nothing registered): the run refuses, naming how to register them.
    """
    try:
        complete = {c.label for c in sweep.discover(spec).complete}
    except CheckpointError:
        return {}
    chosen = [label for label in registered(spec) if label in complete]
    return range_tags(spec, chosen) if chosen else {}


def registered(spec: PipelineSpec, instance: dg.DagsterInstance | None = None) -> list[str]:
    """The sweep's registered checkpoints in their order, from ``instance`` (by default ``$DAGSTER_HOME``'s;
    none when there is no such instance)."""
    name = checkpoints_partitions_name(spec.name)
    if instance is not None:
        return list(instance.get_dynamic_partitions(name))
    if not os.environ.get("DAGSTER_HOME"):
        return []
    try:
        with dg.DagsterInstance.get() as home:
            return list(home.get_dynamic_partitions(name))
    except Exception:  # a home that is no instance yet, a bad dagster.yaml, a database that is down
        return []  # the job has no default range then: a run opens the instance itself and says what is wrong


def register(instance: dg.DagsterInstance, spec: PipelineSpec, labels: Sequence[str]) -> list[str]:
    """Add the checkpoints ``labels`` to the sweep's dimension; returns those that were new."""
    name = checkpoints_partitions_name(spec.name)
    known = set(instance.get_dynamic_partitions(name))
    new = [label for label in labels if label not in known]
    if new:
        instance.add_dynamic_partitions(name, new)
    return new


def _settled(spec: PipelineSpec, wanted: Sequence[str] | None, say: Callable[[str], None] | None = None) -> Discovery:
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
    if say is not None and settling(found):
        fresh = ", ".join(
            p.checkpoint.label
            for p in found.pending
            if p.reason.startswith(SETTLING) and (wanted is None or p.checkpoint.label in wanted)
        )
        say(f"waiting up to {2 * DEFAULT_SETTLE_S:g} s for checkpoint(s) {fresh}, written moments ago, to settle")
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
    say: Callable[[str], None] | None = None,
) -> tuple[dict[str, str], list[str], str]:
    """Tags of a run of the checkpoints ``checkpoints`` (default: every complete one) x ``instances``; those
    labels; and the checkpoints that are not complete yet, each with why (``""`` when none waits). ``say``
    hears that the run waits for checkpoints written moments ago.

    Every complete checkpoint is registered first (a run may only name registered partitions). A label
    that is not a complete checkpoint is an error naming the known ones and why the others wait.
    """
    found = _settled(spec, checkpoints or None, say)
    complete = [c.label for c in found.complete]
    waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending)
    chosen = [label_named(label, complete) for label in checkpoints] if checkpoints else complete
    unknown = [label for label in chosen if label not in complete]
    if not complete or unknown:
        what = (
            f"no checkpoint labelled {', '.join(unknown)}"
            + (several_named(unknown[0], complete) or did_you_mean(unknown[0], complete))
            if unknown
            else "no complete checkpoint"
        )
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
    unregistered: list[str] = field(default_factory=list[str])
    """Complete checkpoints outside every range, for not being registered: a run of the job's default
    range (``dagster job execute``) leaves them to the sensor or ``hud-pipelines run``."""
    outside: list[str] = field(default_factory=list[str])
    """Registered complete checkpoints that this run's range does not hold (the job's default range is read
    as the code location loads: a checkpoint registered since stands past its end until a reload)."""

    @property
    def asked(self) -> int:
        return sum(len(parts) for parts in self.pairs.values())

    def kept(self, ran: Sequence[tuple[sweep.Member, InstanceResult]]) -> list[str]:
        """The partition keys of the pairs asked for that did not run (a current result kept), in order."""
        done = {(member.label, result.key) for member, result in ran}
        asked = [(m, m.spec.partition_key(*p)) for m in self.members for p in self.pairs.get(m.label, ())]
        return [member.partition_key(key) for member, key in asked if (member.label, key) not in done]


def selection(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    partition_keys: Sequence[str],
    tags: Mapping[str, str],
    known: Sequence[str] = (),
) -> Selection:
    """The (checkpoint, instance) pairs of a run's partition range (only the labels its tag names, if it does);
    ``known``: the registered checkpoints, to tell which complete ones no range can hold yet."""
    only = tags.get(CHECKPOINTS_TAG)
    wanted = set(only.split(",")) if only else None
    pairs: dict[str, list[Partition]] = {}
    for key in partition_keys:
        label, instance = sweep.split_partition_key(key)
        if wanted is None or label in wanted:
            pairs.setdefault(label, []).append(spec.partition_for_key(instance))
    members = sweep.members(spec, outputs, settle_s=0.0, labels=list(pairs))
    gone = sorted(set(pairs) - {m.label for m in members})
    try:
        complete = [c.label for c in sweep.discover(spec).complete] if known else []
    except CheckpointError:
        complete = []
    unregistered = [label for label in complete if label not in known]
    outside = [label for label in complete if label in known and label not in pairs] if wanted is None else []
    return Selection(members, pairs, gone, tags.get(RERUN_TAG) == "true", unregistered, outside)


def run_selection(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, spec: PipelineSpec, outputs: EvalOutputs
) -> Selection:
    """The pairs a run of the sweep's rollouts asks for (:func:`selection`; in process, or its units' plan),
    said in its log where some are left out; a run of no partition is refused, naming how to register them."""
    if not (context.has_partition_key or context.has_partition_key_range):
        raise CheckpointError(
            f"{spec.name}: this run names no checkpoint (none of the sweep's is registered, or none was complete "
            f"when the code location loaded); `hud-pipelines run {spec.name}` registers the complete ones and "
            f"evaluates them, as does the sensor {spec.name}__checkpoints once it runs"
        )
    known = registered(spec, context.instance)
    chosen = selection(spec, outputs, context.partition_keys, context.run.tags, known=known)
    if chosen.unregistered:
        context.log.warning(
            f"{spec.name}: complete checkpoint(s) {', '.join(chosen.unregistered)} are not registered, so no range "
            f"holds them: `hud-pipelines run {spec.name}` or the sensor {spec.name}__checkpoints registers and "
            "evaluates them"
        )
    default = [context.job_def.tags.get(tag) for tag in (RANGE_START_TAG, RANGE_END_TAG)]  # read at load
    if (
        chosen.outside
        and None not in default
        and default == [context.run.tags.get(RANGE_START_TAG), context.run.tags.get(RANGE_END_TAG)]
    ):  # another range was chosen on purpose
        context.log.warning(
            f"{spec.name}: registered checkpoint(s) {', '.join(chosen.outside)} are outside this run's range (a "
            "job's default range is the one read when the code location loaded: reload it to take in checkpoints "
            f"registered since, or launch `hud-pipelines run {spec.name}`)"
        )
    if chosen.gone:
        context.log.error(f"{spec.name}: checkpoint(s) {', '.join(chosen.gone)} are not (or no longer) complete")
    return chosen


def checkpoint_sensor(spec: PipelineSpec, outputs: EvalOutputs) -> dg.SensorDefinition:
    """The sensor that registers the sweep's new complete checkpoints and runs their instances, and runs again
    an evaluated checkpoint whose files changed (other weights under its label: a training run restarted into
    the same directory), once per write; all of them in one run, and never while another run of the sweep
    has not ended (its checks would judge a candidate still being evaluated)."""
    name = checkpoints_partitions_name(spec.name)
    sensor_name = f"{spec.name}__checkpoints"

    @dg.sensor(
        name=sensor_name,
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
        busy = unfinished_runs(context.instance, spec.name)
        if busy:  # its checks judge the candidate: another run still evaluating it would fail them
            return dg.SkipReason(
                f"run {busy[0].run_id} of {spec.name} has not ended: one run of a sweep at a time, so that each "
                "judges a candidate it evaluated (what is new meanwhile runs next, in one run)"
            )
        known = context.instance.get_dynamic_partitions(name)
        new = [c.label for c in found.complete if c.label not in known]
        complete = {c.label for c in found.complete}
        evaluated = sweep.evaluated(spec, outputs, settled=complete, found=found.complete)
        changed = [m for m in evaluated if m.changed and m.label in known]
        kept = [c for c in found.complete if c.label in known and c.label not in {m.label for m in changed}]
        cut = cut_short(spec, outputs, kept)  # a changed one runs again for its new weights already
        cut = {**cancelled_unstarted(context.instance, spec, outputs, kept, sensor_name), **cut}
        waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending)
        if not new and not changed and not cut:
            return dg.SkipReason(
                f"no new or changed complete checkpoint{f' (waiting for {waiting})' if waiting else ''}"
            )
        if waiting:
            context.log.info(f"{spec.name}: waiting for {waiting}")
        order = [*known, *new]  # a range runs in the order the checkpoints were registered
        labels = sorted({*new, *(m.label for m in changed), *cut}, key=order.index)
        tags = {**range_tags(spec, labels), CHECKPOINTS_TAG: ",".join(labels)}
        keys = {**{label: label for label in new}, **{m.label: sweep.rerun_key(m) for m in changed}, **cut}
        key = "+".join(keys[label] for label in labels)  # a label may hold "@": each key found by its label
        return dg.SensorResult(  # one run for all of them (a new label once, a write of a changed one once)
            run_requests=[dg.RunRequest(run_key=key, tags=tags)],
            dynamic_partitions_requests=[dg.AddDynamicPartitionsRequest(partitions_def_name=name, partition_keys=new)],
        )

    return watch


def cut_short(spec: PipelineSpec, outputs: EvalOutputs, registered: Sequence[Checkpoint]) -> dict[str, str]:
    """The registered checkpoints whose run was cut short (cancelled in the UI, its ``dagster dev`` stopped): an
    instance of theirs was interrupted; each with its run key. A registered label is not new, so without this
    its instances were never asked for again and every later run failed its ``instances_completed`` on them.
    The key names the runs that cut them short: requested once for each (an instance's own fault, a crash, is
    not run again and again; its check says how to rerun it). One registered but never run (by a CLI run of
    other checkpoints) is left to the runs that name it, as the report's warning says."""
    cut: dict[str, str] = {}
    for checkpoint in registered:
        folder = outputs.member(checkpoint.label)
        lacking: list[str] = []
        for key in spec.partition_keys():
            path = folder.result(key)
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            run_id = _interrupted_run(str(path), (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size))
            if run_id is not None:
                lacking.append(f"{key}:{run_id}")
        if lacking:
            digest = hashlib.sha256("\n".join(lacking).encode()).hexdigest()[:12]
            cut[checkpoint.label] = f"{checkpoint.label}@resume-{digest}"
    return cut


@functools.lru_cache(maxsize=1 << 16)
def _interrupted_run(path: str, version: tuple[int, int, int, int]) -> str | None:
    """The run that interrupted the instance whose result is at ``path``, ``None`` when none did: read once per
    version of the file (a result is replaced whole, by a rename), not on every tick of the sensor for every
    instance of every registered checkpoint."""
    del version  # the cache's key (inode, times, size): a rewritten result is read anew
    result = InstanceResult.read(Path(path))
    return result.run_id if result.fault is Fault.INTERRUPTED else None


def cancelled_unstarted(
    instance: dg.DagsterInstance,
    spec: PipelineSpec,
    outputs: EvalOutputs,
    registered: Sequence[Checkpoint],
    sensor: str,
) -> dict[str, str]:
    """The registered checkpoints of this sensor's cancelled runs that have an instance with no result at all: the
    run was cancelled before it reached them (while its sim started, its units waited in a Celery queue), so no
    instance says it was interrupted for :func:`cut_short` to find. Each with a key naming the newest such run:
    asked once per cancelled run. A failed run is not asked again (its failure would repeat on every tick)."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            job_name=spec.name, statuses=[dg.DagsterRunStatus.CANCELED], tags={"dagster/sensor_name": sensor}
        ),
        limit=CANCELLED_RUNS_READ,
    )
    labels = {checkpoint.label for checkpoint in registered}
    asked: dict[str, str] = {}
    for run in runs:  # the newest first
        for label in run.tags.get(CHECKPOINTS_TAG, "").split(","):
            if label in labels and label not in asked and _lacks_a_result(spec, outputs.member(label)):
                asked[label] = f"{label}@cancelled-{run.run_id[:12]}"
    return asked


def _lacks_a_result(spec: PipelineSpec, member: EvalOutputs) -> bool:
    return any(not member.result(key).is_file() for key in spec.partition_keys())
