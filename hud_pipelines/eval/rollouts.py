"""The rollouts step: run the selected instances, each one's result, traces and shard landing as it ends.

For a sweep (:mod:`hud_pipelines.eval.sweep`) the same step runs once per checkpoint with one sim pool:
the sims are started once and reset for every instance of every checkpoint, and each checkpoint's policy
is loaded once. A (checkpoint, instance) pair whose result is current is skipped unless ``rerun``:
a sweep resumes where it stopped and evaluates a new checkpoint alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hud_pipelines.contract import Contract
from hud_pipelines.errors import Fault, HudPipelinesError, fault_of
from hud_pipelines.eval import provenance, sources, sweep
from hud_pipelines.eval.configuration import (
    RolloutHashes,
    claim_served_sim,
    hold_served_policy,
    latest_served_sim,
    read_served_policy,
    read_served_sim,
    recorded_provenance,
)
from hud_pipelines.eval.kept import kept_result
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult, unreached_result
from hud_pipelines.eval.runner import EvalRunner
from hud_pipelines.recording.contained import ContainedSink
from hud_pipelines.recording.events import EpisodeSink
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.spec.models import Partition, PipelineSpec

if TYPE_CHECKING:
    from hud_pipelines.dataset.shards import ShardStore

# -- rollouts --------------------------------------------------------------------------------------------


def rollouts_step(
    spec: PipelineSpec,
    pool: SimPool,
    outputs: EvalOutputs,
    *,
    run_id: str,
    partitions: Sequence[Partition],
    on_result: Callable[[InstanceResult], None] | None = None,
    claims: EvalOutputs | None = None,
    keep_earlier: bool = False,
    checkpoint: str | None = None,
) -> list[InstanceResult]:
    """Run ``partitions``; each instance's result, traces and dataset shard land as it ends.

    ``claims``: the pipeline's outputs, where the run's served sim and policy are claimed (a sweep member's own
    ``outputs`` lie below them); by default ``outputs``. ``keep_earlier``: an instance that never started leaves
    an earlier complete result of its configuration in place (:func:`~hud_pipelines.eval.kept.kept_result`); it is
    still returned, failed, for the caller to fail the run with (:func:`~hud_pipelines.eval.kept.kept_failure`).
    ``checkpoint``: the label of the sweep member ``spec`` is (its episodes' job names it, :func:`episode_job`).
    """
    from hud_pipelines.dataset.shards import ShardStore

    traces = outputs.traces(run_id)
    shards = ShardStore(outputs, spec, run_id=run_id) if spec.dataset_enabled else None
    written: dict[str, ContainedSink] = {}  # each instance's dataset writer, until its shard is committed

    def sinks(partition: Partition, contract: Contract) -> list[EpisodeSink]:
        from hud_pipelines.recording.background import InBackground
        from hud_pipelines.recording.traces import TraceRecorder

        key = spec.partition_key(*partition)
        recorders: list[EpisodeSink] = [
            ContainedSink.built(
                lambda: InBackground(
                    TraceRecorder(traces, contract, video=spec.traces.video, max_videos=spec.traces.max_videos)
                ),
                "traces",
                f"{spec.name}, instance {key}",
            )
        ]
        if shards is not None:  # its failure marks the shard incomplete (``_keep``), never the episodes
            store = shards
            written[key] = ContainedSink.built(
                lambda: store.sink(key, contract), "dataset writer", f"{spec.name}, instance {key}"
            )
            recorders.append(written[key])
        return recorders

    finished: set[str] = set()
    code = sources.digests(spec, (claims or outputs).root)  # before the run loads any: an edit during it is not its

    recorded: list[dict[str, Any]] = []
    claimed_at = claims or outputs
    if pool.served_sim is None:  # a step or unit of its own: the served sim the run claimed is the one to match
        pool.served_sim = read_served_sim(claimed_at, run_id)

    def provenance_of_run() -> dict[str, Any]:
        if not recorded:  # once per run; the sim's contract is known by the time an instance ends
            try:
                contract_json: str | None = runner.contract().to_json()
            except HudPipelinesError:
                contract_json = None
            if pool.served_sim:
                pool.hold_to(claim_served_sim(claimed_at, run_id, pool.served_sim))
            elif not spec.sim.spawned:  # no served sim met yet: nothing to say of its environment
                ran = provenance.for_run(spec, contract_json=contract_json, code=code)
                return {k: v for k, v in ran.items() if k != "fingerprint"}
            served_policy = read_served_policy(claimed_at, run_id, remote=spec.agent.policy.kind == "remote")
            recorded.append(
                provenance.for_run(
                    spec,
                    contract_json=contract_json,
                    served_sim=pool.served_sim,
                    served_policy=served_policy,
                    code=code,
                )
            )
        return recorded[0]

    def ended(result: InstanceResult) -> None:
        result = dataclasses.replace(result, provenance=provenance_of_run())
        if keep_earlier and kept_result(result, outputs) is not None:  # it measured nothing to replace it with
            finished.add(result.key)
            if on_result is not None:
                on_result(result)
            return
        if result.fault is Fault.INTERRUPTED:  # cut short: kept as _record_interrupted would, with what it finished
            _keep(result)
            return
        finished.add(result.key)
        _keep(result)
        if on_result is not None:
            on_result(result)

    def _keep(result: InstanceResult) -> None:
        writer = written.pop(result.key, None)
        put_in_place(outputs, result, shards, failure=None if writer is None else writer.failure)

    job = episode_job(spec.name, run_id, checkpoint)
    runner = EvalRunner(
        spec,
        pool,
        job=job,
        run_id=run_id,
        sinks=sinks,
        on_result=ended,
        checkpoint=checkpoint,
        on_policy=lambda policy: hold_served_policy(policy, claimed_at, run_id),
    )
    try:
        return runner.run(partitions)
    except BaseException as exc:  # interrupted, or a fault of ours: say so for every instance it cut short
        cut = [p for p in partitions if spec.partition_key(*p) not in finished]
        _record_interrupted(spec, outputs, run_id, cut, exc)
        raise
    finally:
        if shards is not None:  # only this call's instances: other steps of the run may be writing theirs
            shards.discard_pending([spec.partition_key(*p) for p in partitions])


def episode_job(pipeline: str, run_id: str, checkpoint: str | None = None) -> str:
    """The job an episode's key names (its trace id is derived from it): the pipeline and run, and a sweep
    member's checkpoint, so that one instance of two checkpoints in one run are two episodes, not one id."""
    return "/".join(part for part in (pipeline, checkpoint, run_id) if part)


def put_in_place(
    outputs: EvalOutputs, result: InstanceResult, shards: ShardStore | None, *, failure: str | None = None
) -> None:
    """Write an instance's result and make its run's shard of it current (``failure``: why its writer failed), as one
    step under the instance's lock (:meth:`EvalOutputs.instance_lock`): of two runs of it at once, the one that ends
    last leaves both. A run cut short (an ``interrupted`` result) leaves any result in place but another cut-short
    run's, judged under the lock: a run of it that ended meanwhile keeps what it finished."""
    with outputs.instance_lock(result.key):
        if result.fault is Fault.INTERRUPTED and _holds_a_result(outputs.result(result.key), result.run_id):
            return
        result.write(outputs.result(result.key))
        if shards is not None:
            shards.commit(result.key, failure=failure)


def _record_interrupted(
    spec: PipelineSpec, outputs: EvalOutputs, run_id: str, cut: Sequence[Partition], cause: BaseException
) -> None:
    """Write ``interrupted`` results for the instances a cancelled run did not finish; where the run was not
    cancelled but the step failed (``cause``: an error of its own, a disk full), their reason says that.

    An instance that already has a result from an earlier run keeps it, whatever configuration made
    it: that work was finished, and the run that was cut short measured nothing to replace it with
    (an instance it cut short mid-way, one without, has its result already: its ended episodes
    graded, the others ``interrupted``). An earlier run's ``interrupted`` result is replaced: which run cut
    the instance short last is what the sweep's sensor asks again for.
    One of another configuration still reads as not run (stale) in the grades; putting the
    configuration back makes it current again.
    """
    for partition in cut:
        key = spec.partition_key(*partition)
        reason = f"the run was interrupted before instance {key} finished"
        if isinstance(cause, Exception) and fault_of(cause) is not Fault.INTERRUPTED:  # a Dagster termination too
            reason = (
                f"the run's eval step failed before instance {key} finished: {type(cause).__name__}: {cause!s:.500}"
            )
        put_in_place(outputs, unreached_result(spec, partition, reason, Fault.INTERRUPTED, run_id=run_id), None)


def _holds_a_result(path: Path, run_id: str) -> bool:
    """Whether ``path`` holds a result that a run cut short (``run_id``) leaves in place: any but one another cut
    short run wrote."""
    if not path.is_file():
        return False
    try:
        earlier = InstanceResult.read(path)
    except (OSError, ValueError, KeyError):
        return True
    return earlier.fault is not Fault.INTERRUPTED or earlier.run_id == run_id


SweepSelection = Mapping[str, Sequence[Partition]]
"""Checkpoint label -> the instances of it to run."""


def sweep_rollouts_step(
    spec: PipelineSpec,
    pool: SimPool,
    outputs: EvalOutputs,
    *,
    run_id: str,
    members: Sequence[sweep.Member],
    selection: SweepSelection | None = None,
    rerun: bool = False,
    on_result: Callable[[sweep.Member, InstanceResult], None] | None = None,
) -> list[tuple[sweep.Member, InstanceResult]]:
    """Run a sweep's checkpoints one after the other on one sim pool; ``selection`` None is every instance of each.

    Pairs with a current result that did not fail are skipped unless ``rerun``, so a resumed or repeated
    sweep evaluates only what is missing, on the same seeds.
    """
    ran: list[tuple[sweep.Member, InstanceResult]] = []
    environment = recorded_provenance(outputs, run_id)  # the run's, recorded as it started
    for member in members:
        wanted = list(selection.get(member.label, ())) if selection is not None else member.spec.partitions()
        todo = wanted if rerun else [p for p in wanted if not current(member, p, environment)]
        sweep.record(member)  # kept results too: where its weights are now, at which step (they may have moved)
        if not todo:
            continue

        def ended(result: InstanceResult, member: sweep.Member = member) -> None:
            if on_result is not None:
                on_result(member, result)

        results = rollouts_step(
            member.spec,
            pool,
            member.outputs,
            run_id=run_id,
            partitions=todo,
            on_result=ended,
            claims=outputs,
            keep_earlier=True,  # an attempt that measured nothing (weights deleted since, a sim crash) wipes nothing
            checkpoint=member.label,
        )
        ran += [(member, result) for result in results]
    return ran


def current(member: sweep.Member, partition: Partition, environment: dict[str, Any]) -> bool:
    """Whether the pair has a result of the member's configuration, made in ``environment`` (a run's
    provenance: packages, sim, the code and weights its targets read), that did not fail: it is not
    run again."""
    return current_result(member.spec, member.outputs, partition, environment) is not None


def current_result(
    spec: PipelineSpec, outputs: EvalOutputs, partition: Partition, environment: dict[str, Any]
) -> InstanceResult | None:
    """The instance's result when it is of ``spec``'s configuration, made in ``environment``, and did not fail."""
    path = outputs.result(spec.partition_key(*partition))
    if not path.is_file():
        return None
    result = InstanceResult.read(path)
    task = spec.tasks[partition.task_index].name
    expected = RolloutHashes.of(spec, [partition.task_index])  # a control's older results (matrix in) too
    fits = expected.current(task, result.rollout_hash) and not provenance.other_environment(
        result.provenance, environment
    )
    return result if fits and not result.failed else None


def kept_pairs(spec: PipelineSpec, outputs: EvalOutputs, labels: Sequence[str], instances: Sequence[str]) -> int:
    """How many (checkpoint, instance) pairs of ``labels`` x ``instances`` keep their current result.

    A checkpoint never evaluated (no ``checkpoint.json``) has no result to keep, so it is not hashed
    here: the run hashes it once, when it evaluates it.
    """
    evaluated = [label for label in labels if outputs.member(label).checkpoint_json.is_file()]
    if not evaluated:
        return 0
    partitions = [spec.partition_for_key(key) for key in instances]
    members = sweep.members(spec, outputs, settle_s=0.0, labels=evaluated)
    served = latest_served_sim(outputs) if not spec.sim.spawned else None
    environment = provenance.for_run(spec, served_sim=served, code=sources.digests(spec, outputs.root))
    environment["contract_hash"] = provenance.contract_hash_now(spec, outputs.contract)  # an edit since: stale
    return sum(current(member, partition, environment) for member in members for partition in partitions)


def finished_by(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    partitions: Sequence[Partition],
    runs: Collection[str],
    run_id: str | None = None,
) -> tuple[list[Partition], list[InstanceResult]]:
    """The ``partitions`` still to run, and the results of those that one of ``runs`` ran to its end under this
    configuration and in this environment (as the grades judge them: the run's recorded provenance, sources
    included): a re-execution from failure of a run that was cancelled or failed resumes it rather than run
    its finished instances again, except those whose recording stopped (their dataset shards are partial). A
    plain run runs them all: its results are fresh."""
    from hud_pipelines.dataset.shards import INCOMPLETE_FILE

    todo: list[Partition] = []
    kept: list[InstanceResult] = []
    environment = recorded_provenance(outputs, run_id) if runs else {}  # recorded as this run (``run_id``) started
    for partition in partitions:
        result = current_result(spec, outputs, partition, environment) if runs else None
        if result is None or result.run_id not in runs:
            todo.append(partition)
        elif spec.dataset_enabled and (outputs.shard(result.key) / INCOMPLETE_FILE).is_file():
            todo.append(partition)  # its dataset shard, which a failed writer left partial, is written again
        else:
            kept.append(result)
    return todo, kept
