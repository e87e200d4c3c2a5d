"""The eval step as units of work: one Dagster step per instance (or sweep pair), for executors that spread steps.

In process, one step drives every instance of a run on threads (:mod:`hud_pipelines.dagster.assets`).
On Celery workers that one step would run every instance on one worker, so when the deployment's
``execution:`` says ``celery`` the same three assets (``contract``, ``rollouts``, ``instances``) come
from a graph instead::

    plan ──▶ unit[u0_task0_i0], unit[u1_task0_i1], ... ──▶ finish
    (control queue)     (the pipeline's queue)              (control queue)

- ``plan`` records the run's configuration and yields one dynamic output per instance of the run's
  partition range (for a sweep, per (checkpoint, instance) pair without a current result).
- each ``unit`` runs one instance with its own sim set, on whichever worker takes it: its result,
  traces and dataset shard land as in process, its partition of ``rollouts`` is observed and, if the
  instance ran to its end, materialized. A unit never fails because its instance failed (that is
  data, as in process); a unit whose worker died is retried by the run
  (:mod:`hud_pipelines.dagster.celery_executor`): it runs the instance again ``execution.retries``
  times, then records the instance as failed (``worker_lost``) so the rest of the eval goes on.
- ``finish`` runs once every unit ended: it materializes ``contract`` (when a unit's sim started) and
  ``instances`` (what every unit of the run did), so grades, report, checks and the dataset follow,
  once.
- The graph takes a subset of its three assets, as "Materialize all" asks (Dagster's backfill runs the
  unpartitioned contract, the partitioned rollouts and the rest apart): a run without the rollouts
  plans no unit, derives the contract in ``plan`` when it is selected, and materializes ``instances``
  from the results on disk, as the in-process step does.

The results are those of the in-process run: the same seeds per slot, and each instance's policy
rows are forwarded on their own in both (``across_instances: false``).
"""

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import OpExecutionContext

from hud_pipelines.contract import Contract, load_contract
from hud_pipelines.dagster import sweeps
from hud_pipelines.dagster.context import effective_of, sim_of
from hud_pipelines.dagster.deployed import refuse_before_a_run
from hud_pipelines.dagster.eval_failure import eval_step_name, graded_if_it_fails
from hud_pipelines.dagster.execution import ExecutionSettings
from hud_pipelines.dagster.executors import UnitPlacement
from hud_pipelines.dagster.metadata import contract_metadata, instances_metadata, instances_on_disk
from hud_pipelines.dagster.overlap import tag_running
from hud_pipelines.dagster.resources import (
    AGENT,
    CONTRACT,
    GRADERS,
    SIM,
    resource_key,
)
from hud_pipelines.dagster.unit_attempts import Unit, record_lost, report_attempt, stands_after_the_loss
from hud_pipelines.dagster.unit_tags import QUEUE_TAG, UNIT_TAG
from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval import sweep
from hud_pipelines.eval.configuration import claim_served_sim, read_served_sim, recorded_provenance, write_contract
from hud_pipelines.eval.kept import kept_failure, kept_result, sweep_kept_failure
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.rollouts import current, finished_by, rollouts_step
from hud_pipelines.eval.runner import InstanceResult
from hud_pipelines.eval.steps import contract_step, record_configuration, refuse_misfit_dataset, seed_checked_contract
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.spec.models import PipelineSpec

PLANNED, UNITS = "planned", "units"


def eval_units_asset(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    specs: Sequence[dg.AssetSpec],
    settings: ExecutionSettings,
    refused: str | None = None,
) -> dg.AssetsDefinition:
    """``contract``, ``rollouts`` and ``instances`` of ``spec`` from the graph plan -> units -> finish (``refused``:
    why the code location refuses every run, see :func:`~hud_pipelines.dagster.deployed.refuse_before_a_run`)."""
    contract_key, rollouts_key, instances_key = (s.key for s in specs)
    resources = {resource_key(spec.name, part) for part in (SIM, CONTRACT, AGENT, GRADERS)}
    control = {QUEUE_TAG: settings.control_queue}
    placement = UnitPlacement.of(settings)

    # each op's definition is named for its pipeline: Dagster's job of every asset ("Materialize all", a
    # backfill) holds every pipeline's graph, and one name may stand for one definition only; the nodes keep
    # the short names (step keys ``<pipeline>__eval.unit[...]``)
    @dg.op(
        name=f"{spec.name}__plan",
        out={UNITS: dg.DynamicOut(str), PLANNED: dg.Out(bool)},
        required_resource_keys=resources,
        tags=control,
    )
    def plan(context: OpExecutionContext) -> Iterator[dg.Output[Any] | dg.DynamicOutput[str]]:
        effective = effective_of(context, spec)
        if rollouts_key in context.selected_asset_keys:  # before any unit starts a sim: said at the YAML's line
            with graded_if_it_fails(context, spec, outputs):
                refuse_before_a_run(spec, effective, refused)
        if rollouts_key not in context.selected_asset_keys:  # a run of "Materialize all" that runs no rollouts
            yield dg.Output(_contract_alone(context, effective, outputs, contract_key), output_name=PLANNED)
            return
        tag_running(context, spec.name)
        overrides = record_configuration(effective, spec, outputs, run_id=context.run.run_id)
        outputs.seed_check.unlink(missing_ok=True)  # the run's first unit checks anew
        if overrides:
            context.log.info(f"{spec.name} runs with overrides of its YAML: {overrides}")
        keys = _sweep_plan(context, effective, outputs) if effective.is_sweep else _resumed(context, effective, outputs)
        for index, key in enumerate(keys):
            yield dg.DynamicOutput(key, output_name=UNITS, mapping_key=mapping_key(index, key))
        yield dg.Output(False, output_name=PLANNED)

    @dg.op(
        name=f"{spec.name}__unit",
        required_resource_keys=resources,
        tags={QUEUE_TAG: settings.queue, UNIT_TAG: "true", **placement.unit_tags},
        retry_policy=placement.unit_retry_policy,
        description=f"One instance of {spec.name} with its own sim set, on {placement.where}.",
    )
    def unit(context: OpExecutionContext, key: str) -> Any:
        effective = effective_of(context, spec)
        planned = resolve_unit(effective, outputs, key)
        lost = context.retry_number  # a unit only ever retries because its worker was lost
        ended = stands_after_the_loss(context, planned, lost, rollouts_key) if lost else None
        if ended is not None or lost > settings.retries:
            result = ended or record_lost(context, planned, lost, rollouts_key)
            derived = False
        else:
            if lost:
                context.log.warning(f"{key}: attempt {lost + 1}, after its worker was lost")
            pool = sim_of(context, spec).pool(effective)
            first = context.get_mapping_key() == mapping_key(0, key)  # it checks the sim's seeding for the run
            derived = _derive_contract(effective, pool, outputs, context.run.run_id, check_seeds=first)
            result = _run(context, planned, pool, rollouts_key, lost, claims=outputs)
        kept = kept_result(result, planned.outputs) is not None
        return {
            "key": key,
            "label": planned.checkpoint,
            "result": str(planned.result_path),
            "contract": derived,
            "failed": result.failed,
            "kept": result.as_dict() if kept else None,  # the attempt that did not start: finish fails the run on it
        }

    @dg.op(
        name=f"{spec.name}__finish",
        ins={"units": dg.In(), PLANNED: dg.In(bool)},
        out={
            "contract": dg.Out(dg.Nothing, is_required=False),
            "rollouts": dg.Out(dg.Nothing, is_required=False),
            "instances": dg.Out(dg.Nothing, is_required=False),
        },
        required_resource_keys=resources,
        tags=control,
    )
    def finish(context: OpExecutionContext, units: list[Any], planned: bool) -> Iterator[dg.Output[None]]:
        if rollouts_key not in context.selected_asset_keys:  # no instance ran: no verdict to write (as in process)
            yield from collect(context, units, planned)
            return
        with graded_if_it_fails(context, spec, outputs):  # a kept earlier result fails it: else the files say that one
            yield from collect(context, units, planned)

    def collect(context: OpExecutionContext, units: list[Any], planned: bool) -> Iterator[dg.Output[None]]:
        effective = effective_of(context, spec)
        run_id = context.run.run_id
        selected = context.selected_asset_keys  # "Materialize all" runs the three apart: each yields its own
        derived = planned or any(u["contract"] for u in units)
        if contract_key in selected and derived and outputs.contract.is_file():
            metadata = contract_metadata(effective, outputs, load_contract(outputs.contract))
            yield dg.Output(None, output_name="contract", metadata=metadata)
        if rollouts_key not in selected:  # the instances from the results on disk, as in process
            if instances_key in selected:
                yield dg.Output(None, output_name="instances", metadata=instances_on_disk(effective, outputs))
            return
        results = [
            InstanceResult.from_dict(u["kept"]) if u.get("kept") else InstanceResult.read(Path(u["result"]))
            for u in units
        ]
        # ``rollouts`` is never yielded here: each unit materialized its own partition, if it completed.
        if instances_key in selected:
            metadata = instances_metadata(outputs, run_id, results, effective.overrides(spec))
            yield dg.Output(None, output_name="instances", metadata=metadata)
        if effective.is_sweep:  # each attempt beside the earlier result it kept, which lies where its own would
            kept_earlier = [
                (u["label"], InstanceResult.from_dict(u["kept"]), InstanceResult.read(Path(u["result"])))
                for u in units
                if u.get("kept")
            ]
            kept = sweep_kept_failure(effective, outputs, kept_earlier)
        else:
            kept = kept_failure(effective, outputs, results)
        if kept is not None:  # the grades would pass on the kept results: the run fails here, saying why
            raise dg.Failure(description=kept, allow_retries=False)

    @dg.graph(
        name=eval_step_name(spec.name),
        out={"contract": dg.GraphOut(), "rollouts": dg.GraphOut(), "instances": dg.GraphOut()},
    )
    def eval_graph() -> dict[str, Any]:
        keys, planned = plan.alias("plan")()
        units = keys.map(unit.alias("unit")).collect()
        contract, rollouts, instances = finish.alias("finish")(units=units, planned=planned)
        return {"contract": contract, "rollouts": rollouts, "instances": instances}

    return dg.AssetsDefinition(
        node_def=eval_graph,
        keys_by_input_name={},
        keys_by_output_name={"contract": contract_key, "rollouts": rollouts_key, "instances": instances_key},
        specs=list(specs),
        # "Materialize all" runs the contract, the rollouts and the rest apart (their partitions differ)
        can_subset=True,
        backfill_policy=dg.BackfillPolicy.single_run(),
    )


def _contract_alone(
    context: OpExecutionContext, spec: PipelineSpec, outputs: EvalOutputs, contract_key: dg.AssetKey
) -> bool:
    """The contract of a run that selects it without the rollouts, derived here; whether it was."""
    if contract_key not in context.selected_asset_keys:
        return False
    try:
        contract = contract_step(spec, sim_of(context, spec).pool(spec), outputs, run_id=context.run.run_id)
    except HudPipelinesError as exc:
        context.log.error(f"the sim of {spec.name} did not start: {exc}")
        return False
    refuse_misfit_dataset(spec, contract)
    return True


def mapping_key(index: int, partition_key: str) -> str:
    """A dynamic mapping key for the ``index``-th unit (letters, digits and ``_`` only): ``u3_task0_i1``."""
    return f"u{index}_{re.sub(r'[^A-Za-z0-9_]', '_', partition_key)}"


def resolve_unit(spec: PipelineSpec, outputs: EvalOutputs, key: str) -> Unit:
    """The unit of partition ``key`` of ``spec`` (the run's effective spec); a sweep's from its member."""
    if not spec.is_sweep:
        return Unit(spec, outputs, spec.partition_for_key(key), key)
    label, instance = sweep.split_partition_key(key)
    member = next((m for m in sweep.evaluated(spec, outputs) if m.label == label), None)
    if member is None:  # plan records every member it hands out a unit of
        raise HudPipelinesError(f"{spec.name}: checkpoint {label!r} was not recorded by the run's plan")
    return Unit(member.spec, member.outputs, member.spec.partition_for_key(instance), key, checkpoint=label)


# -- the ops' parts ------------------------------------------------------------------------------------


def _sweep_plan(context: OpExecutionContext, spec: PipelineSpec, outputs: EvalOutputs) -> list[str]:
    """The (checkpoint, instance) pairs of the run's range to run; pairs with a current result are kept."""
    chosen = sweeps.run_selection(context, spec, outputs)
    keys: list[str] = []
    environment = recorded_provenance(outputs, context.run.run_id)  # the run's, recorded by plan
    for member in chosen.members:
        todo = [p for p in chosen.pairs[member.label] if chosen.rerun or not current(member, p, environment)]
        sweep.record(member)  # kept results too: where its weights are now, at which step (they may have moved)
        if todo:
            keys += [member.partition_key(member.spec.partition_key(*p)) for p in todo]
    kept = chosen.asked - len(keys)
    if kept:
        context.log.info(f"{spec.name}: {kept} (checkpoint, instance) pair(s) kept their current result")
    return keys


def _derive_contract(
    spec: PipelineSpec, pool: SimPool, outputs: EvalOutputs, run_id: str, *, check_seeds: bool
) -> bool:
    """Start the unit's sim and write the contract it reports (units write the same file, atomically).

    A served sim is held to the one another unit of the run claimed already, else claimed for the run.
    ``check_seeds``: the run's first unit also checks the sim's seeded reset, as a contract step does.
    """
    pool.served_sim = read_served_sim(outputs, run_id)
    try:
        contract: Contract = seed_checked_contract(spec, pool, outputs) if check_seeds else pool.contract()
    except HudPipelinesError:  # the unit's instance then fails with the sim's own reason
        return False
    if pool.served_sim:  # claimed at the same moment by another unit, maybe of another sim: the first holds
        pool.hold_to(claim_served_sim(outputs, run_id, pool.served_sim))
    write_contract(outputs, run_id, contract.to_json())  # one whole file whichever unit writes it last
    refuse_misfit_dataset(spec, contract)  # every unit: no rollout runs for a dataset that cannot take it
    return True


def _run(
    context: OpExecutionContext,
    unit: Unit,
    pool: SimPool,
    rollouts_key: dg.AssetKey,
    attempt: int,
    *,
    claims: EvalOutputs,
) -> InstanceResult:
    """Run the unit's instance; its partition is observed and, if it ran to its end, materialized."""
    results = rollouts_step(
        unit.spec,
        pool,
        unit.outputs,
        run_id=context.run.run_id,
        partitions=[unit.partition],
        claims=claims,
        keep_earlier=True,  # as in process: an attempt that measured nothing wipes nothing
        checkpoint=unit.checkpoint,
        on_result=lambda result: report_attempt(context, unit, result, rollouts_key, attempt),
    )
    return results[0]


def _resumed(context: OpExecutionContext, spec: PipelineSpec, outputs: EvalOutputs) -> list[str]:
    """The run's instances less those that the run it re-executes (Dagster's "from failure") ran to their end."""
    chosen = [spec.partition_for_key(k) for k in context.partition_keys]
    todo, done = finished_by(spec, outputs, chosen, re_executed(context), context.run.run_id)
    if done:
        context.log.info(
            f"{spec.name}: {', '.join(r.key for r in done)} ran to their end in the run this one re-executes"
        )
    return [spec.partition_key(*partition) for partition in todo]


def re_executed(context: OpExecutionContext | dg.AssetExecutionContext) -> set[str]:
    """The earlier runs a re-execution from failure resumes: every run of its group, whichever re-executed
    which (none for a plain run, nor for "re-execute all", which asks for fresh results)."""
    tags = context.run.tags
    root = tags.get("dagster/root_run_id")
    if not root or "true" not in (tags.get("dagster/is_resume_retry"), tags.get("dagster/is_asset_resume_retry")):
        return set()
    group = context.instance.get_run_group(root)  # the root and every run tagged with it
    runs: Sequence[dg.DagsterRun] = group[1] if group else []
    return {root, *(run.run_id for run in runs)} - {context.run.run_id}
