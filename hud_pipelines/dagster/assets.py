"""One pipeline spec -> its Dagster assets, checks and job (its four resources are bound by the caller).

The graph, under the key prefix ``<name>``::

    contract -> rollouts (one partition per task x instance) -> instances -> grades (+ checks) -> dataset
                                                                          -> report

- ``contract``, ``rollouts`` and ``instances`` come from one step (``<name>__eval``), with
  ``BackfillPolicy.single_run()``: one local run drives every selected instance
  (``max_concurrent`` at a time) in one process. As each instance ends, an observation with its
  figures is logged for its partition, and the partition is materialized if the instance ran to its
  end. A failed instance is data, not a failed step: its slots are errored rows, ``instances`` is
  always materialized (by a run of no rollouts too: "Materialize all" runs them in a run of their own),
  and the built-in blocking check ``instances_completed`` fails the run, so exactly the failed
  partitions show as failed and can be re-run alone.
- ``grades`` and ``report`` read the latest result of every partition: a partition that never ran
  shows its slots as errored (``not_run``), never as failed.
- the ``dataset`` sits behind ``grades`` so a failing blocking check stops it from being published;
  the ``report`` does not, so a failing eval still gets its report.

The job (named like the pipeline) carries the full partition range as default tags, so ``dagster job
execute -j <name>`` runs the whole eval; ``--partition-range k...k`` re-runs one instance. Each asset's code
version is what decides it (:func:`~hud_pipelines.dagster.metadata.code_versions`).
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import dagster as dg
from dagster import AssetCheckExecutionContext, AssetExecutionContext
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from hud_pipelines.dagster import metadata as asset_metadata
from hud_pipelines.dagster import sweeps, units
from hud_pipelines.dagster.checks import answered_check, instances_check, pipeline_check
from hud_pipelines.dagster.context import effective_of, judging_of, sim_of
from hud_pipelines.dagster.deployed import refuse_before_a_run
from hud_pipelines.dagster.eval_failure import eval_step_name, graded_if_it_fails
from hud_pipelines.dagster.execution import ExecutionSettings
from hud_pipelines.dagster.executors import executor_for
from hud_pipelines.dagster.overlap import tag_running
from hud_pipelines.dagster.resources import AGENT, CONTRACT, GRADERS, SIM, resource_key
from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval import progress, sweep
from hud_pipelines.eval.configuration import judged_in_run, record_configuration
from hud_pipelines.eval.grade_table import grade_cell, grade_columns
from hud_pipelines.eval.grades import GradeRow, Summary, summarize
from hud_pipelines.eval.judging import headline_rows
from hud_pipelines.eval.kept import kept_failure, kept_result, sweep_kept_failure
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.report import rate_text, success_interval
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.eval.rollouts import finished_by, sweep_rollouts_step
from hud_pipelines.eval.steps import (
    comparison_step,
    contract_step,
    dataset_root,
    dataset_step,
    grades_step,
    refuse_misfit_dataset,
    report_step,
    rollouts_step,
)
from hud_pipelines.recording.thumbnails import markdown_image
from hud_pipelines.spec.models import PipelineSpec

COMPARISON_DESCRIPTION = (
    "Every checkpoint of {name} per task: success with its 95% interval, mean score, and the paired comparison "
    "(McNemar's exact test) with the previous checkpoint and the baseline."
)
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


Context = AssetExecutionContext | AssetCheckExecutionContext


def _key_figures(summary: Summary) -> dict[str, Any]:
    """The figures a reader looks for first, beside the link to the HTML report."""
    return {
        "success_rate": summary.success_rate if summary.success_rate is not None else float("nan"),
        "success": rate_text(summary),
        "scheduled": summary.scheduled,
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "errored": summary.errored,
        "error_rate": summary.error_rate,
    }


def _grades_table(spec: PipelineSpec, rows: Sequence[GradeRow]) -> dg.TableMetadataValue:
    columns = grade_columns(spec)
    schema = dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in columns])
    records = [dg.TableRecord({name: grade_cell(row, name) for name, _ in columns}) for row in rows[:500]]
    return dg.MetadataValue.table(records, schema=schema)


def build_pipeline_assets(
    spec: PipelineSpec,
    *,
    outputs: EvalOutputs,
    project_dir: Path,
    execution: ExecutionSettings | None = None,
    refused: str | None = None,
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], UnresolvedAssetJobDefinition]:
    """The assets, checks and job of one pipeline (its four resources are bound by the caller).

    ``execution`` (the deployment's, default in process) says where the steps run: on Celery
    workers the eval step becomes one unit per instance (:mod:`hud_pipelines.dagster.units`). ``refused``: why
    the code location refuses every run (:func:`~hud_pipelines.dagster.deployed.refuse_before_a_run`).
    """
    with warnings.catch_warnings():
        # BackfillPolicy is marked beta in Dagster 1.13; the single-run policy is what makes one
        # local run drive every partition, so it is used on purpose.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _build(spec, outputs, project_dir, execution or ExecutionSettings(), refused)


def _build(
    spec: PipelineSpec, outputs: EvalOutputs, project_dir: Path, execution: ExecutionSettings, refused: str | None
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], UnresolvedAssetJobDefinition]:
    name = spec.name
    graders_key = resource_key(name, GRADERS)
    partitions: dg.PartitionsDefinition[Any] = (
        sweeps.partitions(spec) if spec.is_sweep else dg.StaticPartitionsDefinition(spec.partition_keys())
    )
    single_run = dg.BackfillPolicy.single_run()
    rolled, judged = asset_metadata.code_versions(spec)

    def eval_asset(
        step: str, description: str, deps: Sequence[Any] = (), resources: set[str] | None = None, **extra: Any
    ) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
        """``@dg.asset`` for one step of this pipeline: its key prefix, group, resources and single-run backfill."""
        return cast(
            Callable[[Callable[..., Any]], dg.AssetsDefinition],
            dg.asset(
                key=[name, step],
                group_name=name,
                deps=list(deps),
                backfill_policy=single_run,
                code_version=judged,
                description=description,
                required_resource_keys=resources or set(),
                **extra,
            ),
        )

    contract_key = dg.AssetKey([name, "contract"])
    rollouts_key = dg.AssetKey([name, "rollouts"])
    instances_key = dg.AssetKey([name, "instances"])

    def judging_asset(step: str, description: str) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
        """An asset that judges the instances' results with the graders: the grades, report, comparison."""
        return eval_asset(step, description, deps=[instances_key], resources={graders_key})

    eval_specs = [
        dg.AssetSpec(
            contract_key,
            group_name=name,
            skippable=True,
            code_version=rolled,
            description=f"The sim's contract (observation and action features) for {name}.",
        ),
        dg.AssetSpec(
            rollouts_key,
            group_name=name,
            deps=[contract_key],
            partitions_def=partitions,
            skippable=True,
            code_version=rolled,
            description=f"Rollouts of {name}: one partition per task instance, each one sim of "
            f"{spec.sim.num_envs} slot(s). An instance that failed is not materialized (its partition "
            "shows as failed); its slots are errored rows in the grades.",
        ),
        dg.AssetSpec(
            instances_key,
            group_name=name,
            deps=[rollouts_key],
            code_version=rolled,
            description=f"What each instance of {name} selected in the run did: ran to its end, or failed "
            "and why. Always materialized, so grades, checks and the report follow every run.",
        ),
    ]

    def local_eval() -> dg.AssetsDefinition:
        """The eval step in the run's process: every instance of the run on threads, one sim pool."""

        @dg.multi_asset(
            name=eval_step_name(name),
            specs=eval_specs,
            can_subset=True,
            backfill_policy=single_run,
            required_resource_keys={resource_key(name, part) for part in (SIM, CONTRACT, AGENT, GRADERS)},
        )
        def run_eval(context: AssetExecutionContext) -> Iterator[dg.MaterializeResult[Any]]:
            if rollouts_key not in context.selected_asset_keys:  # no instance to run: no verdict to write
                yield from evaluate(context)
                return
            with graded_if_it_fails(context, spec, outputs):  # else the files would say an earlier run's verdict
                yield from evaluate(context)

        def evaluate(context: AssetExecutionContext) -> Iterator[dg.MaterializeResult[Any]]:
            effective = effective_of(context, spec)
            selected = context.selected_asset_keys
            if rollouts_key in selected:  # before any sim starts, as `hud-pipelines run` refuses
                refuse_before_a_run(spec, effective, refused)
            pool = sim_of(context, spec).pool(effective)
            if contract_key in selected:
                try:
                    derived = contract_step(effective, pool, outputs, run_id=context.run.run_id)
                except HudPipelinesError as exc:  # every selected instance then errors with the reason
                    context.log.error(f"the sim of {name} did not start: {exc}")
                else:
                    yield dg.MaterializeResult(
                        asset_key=contract_key,
                        metadata=asset_metadata.contract_metadata(effective, outputs, derived),
                    )
                    refuse_misfit_dataset(effective, derived)
            if rollouts_key not in selected:  # "Materialize all": the rollouts ran in a run of their own
                if instances_key in selected:
                    yield dg.MaterializeResult(
                        asset_key=instances_key, metadata=asset_metadata.instances_on_disk(effective, outputs)
                    )
                return
            tag_running(context, name)  # a later `hud-pipelines run` of this pipeline then warns that this one runs
            run_id = context.run.run_id

            def on_result(result: InstanceResult) -> None:
                metadata = asset_metadata.instance_metadata(result)
                context.log_event(dg.AssetObservation(asset_key=rollouts_key, partition=result.key, metadata=metadata))
                if not result.failed:
                    context.log_event(
                        dg.AssetMaterialization(asset_key=rollouts_key, partition=result.key, metadata=metadata)
                    )
                progress.notify(result)

            overrides = record_configuration(effective, spec, outputs, run_id=run_id)
            if overrides:
                context.log.info(f"{name} runs with overrides of its YAML: {overrides}")
            kept: str | None = None
            if effective.is_sweep:
                results, kept = _run_sweep(context, effective, pool, outputs, rollouts_key)
            else:
                chosen = [spec.partition_for_key(k) for k in context.partition_keys]
                todo, done = finished_by(effective, outputs, chosen, units.re_executed(context), run_id)
                if done:
                    context.log.info(
                        f"{name}: the instances {', '.join(r.key for r in done)} ran to their end in "
                        f"run {done[0].run_id}, which this run re-executes: kept, not run again"
                    )
                results = done + rollouts_step(
                    effective, pool, outputs, run_id=run_id, partitions=todo, on_result=on_result, keep_earlier=True
                )
                kept = kept_failure(effective, outputs, results)
            if instances_key in selected:
                yield dg.MaterializeResult(
                    asset_key=instances_key,
                    metadata=asset_metadata.instances_metadata(outputs, run_id, results, overrides),
                )
            if kept is not None:  # the grades would pass on the kept results: the run fails here, saying why
                raise dg.Failure(description=kept, allow_retries=False)

        return run_eval

    run_eval = (
        units.eval_units_asset(spec, outputs, eval_specs, execution, refused) if execution.distributed else local_eval()
    )

    @judging_asset(
        "grades",
        f"One row per (task, instance, slot) of {name}: seed, score, success, return, steps, how it ended, status, "
        "fault, run.",
    )
    def grades(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        judged, current = judging_of(context, spec, outputs, context.run.run_id, context.run.parent_run_id)
        rows, _ = grades_step(judged, outputs, current)  # and the checks' verdicts, as a file beside them
        scope, headline = headline_rows(judged, rows)
        summary = summarize(headline)  # the report's headline rate, never one pooled over arms or weights
        low, high = success_interval(summary)
        return dg.MaterializeResult(
            metadata={
                "grades": _grades_table(judged, rows),
                "counted": scope or "every episode",
                **_key_figures(summary),
                "success_rate_ci95_low": low,
                "success_rate_ci95_high": high,
                "mean_score": summary.mean_score if summary.mean_score is not None else float("nan"),
                "path": dg.MetadataValue.path(str(outputs.grades_csv)),
            }
        )

    @judging_asset(
        "report",
        f"Success rate with its 95% interval and denominators, per task, the checks' verdicts and a plot, for {name}.",
    )
    def report(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        judged, current = judging_of(context, spec, outputs, context.run.run_id, context.run.parent_run_id)
        dataset = dataset_root(spec, outputs, project_dir)
        written = report_step(judged, outputs, run_id=context.run.run_id, current=current, dataset=dataset)
        for warning in written.warnings:  # the run's log says what the report warns of
            context.log.warning(warning)
        thumbnails = (
            {"last_frames": dg.MetadataValue.md(markdown_image(written.thumbnails_png, "how episodes ended"))}
            if written.thumbnails_png is not None
            else {}
        )
        return dg.MaterializeResult(
            metadata={
                **_key_figures(written.summary),
                "report_url": dg.MetadataValue.url(written.html.as_uri()),
                "report_html": dg.MetadataValue.path(str(written.html)),
                **thumbnails,
                "report": dg.MetadataValue.md(written.markdown),
                "path": dg.MetadataValue.path(str(outputs.report_md)),
            }
        )

    checks = [
        instances_check(spec, outputs, grades.key),
        answered_check(spec, outputs, grades.key),
        *(pipeline_check(spec, outputs, check, grades.key) for check in spec.checks),
    ]
    assets: list[dg.AssetsDefinition] = [run_eval, grades, report]

    if spec.is_sweep:
        assets.append(_comparison_asset(spec, outputs, judging_asset))

    if spec.dataset_enabled:

        @eval_asset(
            "dataset",
            f"The rollouts of {name} as a LeRobot v3 dataset (every instance's shard, merged and "
            "published atomically).",
            deps=[grades],
        )
        def dataset(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
            run_id = context.run.run_id  # published as the grades judged them
            current = judged_in_run(spec, outputs, run_id, context.run.parent_run_id)
            published = dataset_step(spec, outputs, project_dir=project_dir, run_id=run_id, current=current)
            return dg.MaterializeResult(metadata=published.dagster_metadata())

        assets.append(dataset)
    job = dg.define_asset_job(
        name,
        selection=dg.AssetSelection.key_prefixes([name]),
        executor_def=executor_for(execution),
        description=spec.description or f"Evaluate {name}",
        tags=sweeps.default_tags(spec)
        if spec.is_sweep
        else {RANGE_START_TAG: spec.partition_keys()[0], RANGE_END_TAG: spec.partition_keys()[-1]},
    )
    return assets, checks, job


def _run_sweep(
    context: AssetExecutionContext, spec: PipelineSpec, pool: Any, outputs: EvalOutputs, rollouts_key: dg.AssetKey
) -> tuple[list[InstanceResult], str | None]:
    """The selected (checkpoint, instance) pairs, checkpoint after checkpoint on one sim pool, current ones kept;
    and why the run fails where an attempt kept an earlier result (:func:`sweep_kept_failure`)."""
    chosen = sweeps.run_selection(context, spec, outputs)

    def on_result(member: sweep.Member, result: InstanceResult) -> None:
        metadata = {**asset_metadata.instance_metadata(result), "checkpoint": member.label}
        partition = member.partition_key(result.key)
        context.log_event(dg.AssetObservation(asset_key=rollouts_key, partition=partition, metadata=metadata))
        if not result.failed:
            context.log_event(dg.AssetMaterialization(asset_key=rollouts_key, partition=partition, metadata=metadata))
        progress.notify(result)

    ran = sweep_rollouts_step(
        spec,
        pool,
        outputs,
        run_id=context.run.run_id,
        members=chosen.members,
        selection=chosen.pairs,
        rerun=chosen.rerun,
        on_result=on_result,
    )
    kept = chosen.kept(ran)
    for key in kept:  # materialized by an earlier run: a backfill ("Materialize all") then counts the pair done
        context.log_event(dg.AssetMaterialization(asset_key=rollouts_key, partition=key, metadata={"kept": True}))
    if kept:
        context.log.info(f"{spec.name}: {len(kept)} (checkpoint, instance) pair(s) kept their current result")
    kept_earlier = [(m.label, a, e) for m, a in ran if (e := kept_result(a, m.outputs)) is not None]
    return [result for _, result in ran], sweep_kept_failure(spec, outputs, kept_earlier)


def _comparison_asset(
    spec: PipelineSpec, outputs: EvalOutputs, judging_asset: Callable[..., Any]
) -> dg.AssetsDefinition:
    @judging_asset("comparison", COMPARISON_DESCRIPTION.format(name=spec.name))
    def comparison(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        judged, current = judging_of(context, spec, outputs, context.run.run_id, context.run.parent_run_id)
        table = comparison_step(judged, outputs, current=current)
        return dg.MaterializeResult(metadata=asset_metadata.comparison_metadata(table, outputs))

    return comparison
