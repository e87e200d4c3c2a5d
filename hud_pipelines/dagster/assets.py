"""One pipeline spec -> its Dagster assets, checks, job and resource.

The graph, under the key prefix ``<name>``::

    contract -> rollouts (one partition per task x instance) -> grades (+ blocking checks) -> dataset
                                                             -> report

- ``rollouts`` is partitioned with ``BackfillPolicy.single_run()``: one local run drives every
  selected instance (``max_concurrent`` at a time) in one process and one step. As each instance
  ends, an observation with its figures is logged for its partition. If some instances failed, the
  others are materialized one by one and the step fails, so exactly the failed partitions show as
  failed and can be re-run alone.
- ``grades`` and ``report`` read the latest result of every partition: a partition that never ran
  shows its slots as errored, never as failed.
- the ``dataset`` sits behind ``grades`` so a failing blocking check stops it from being published;
  the ``report`` does not, so a failing eval still gets its report.

The job (named like the pipeline) runs in process (one sim set for the whole run) and carries the
full partition range as default tags, so ``dagster job execute -j <name>`` and ``dg launch --job
<name>`` run the whole eval; ``--partition-range k...k`` re-runs one instance.
"""

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import dagster as dg
from dagster import AssetCheckExecutionContext, AssetExecutionContext
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from hud_pipelines import progress
from hud_pipelines.contract import Contract
from hud_pipelines.dagster.resources import PipelineResource, resource_key
from hud_pipelines.eval import InstanceResult
from hud_pipelines.grading import GradeRow, summarize
from hud_pipelines.recording import EpisodeStatus
from hud_pipelines.spec.models import CheckSpec, MaxErrorRateCheck, MinMeanScoreCheck, MinSuccessRateCheck, PipelineSpec
from hud_pipelines.steps import (
    GRADE_COLUMNS,
    cell,
    contract_step,
    dataset_step,
    grades_step,
    read_grades,
    report_step,
    rollouts_step,
)

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def _resource(context: AssetExecutionContext | dg.AssetCheckExecutionContext, spec: PipelineSpec) -> PipelineResource:
    return getattr(context.resources, resource_key(spec.name))


def _grades_table(rows: Sequence[GradeRow]) -> dg.TableMetadataValue:
    schema = dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in GRADE_COLUMNS])
    records = [dg.TableRecord({name: cell(getattr(row, name)) for name, _ in GRADE_COLUMNS}) for row in rows[:500]]
    return dg.MetadataValue.table(records, schema=schema)


def _features_table(contract: Contract) -> dg.TableMetadataValue:
    schema = dg.TableSchema(
        columns=[dg.TableColumn(n, "string") for n in ("feature", "role", "type", "dtype", "shape", "names")]
    )
    records = [
        dg.TableRecord(
            {
                "feature": name,
                "role": feature.role,
                "type": feature.type.value,
                "dtype": feature.dtype,
                "shape": str(list(feature.shape)),
                "names": ", ".join(feature.names or [])[:200],
            }
        )
        for name, feature in contract.features.items()
    ]
    return dg.MetadataValue.table(records, schema=schema)


def _instance_metadata(result: InstanceResult) -> dict[str, Any]:
    counts = result.counts()
    return {
        "episodes": len(result.rows),
        "env_steps": result.env_steps,
        "succeeded": counts[EpisodeStatus.SUCCEEDED.value],
        "failed": counts[EpisodeStatus.FAILED.value],
        "errored": counts[EpisodeStatus.ERRORED.value],
        "wall_s": round(result.wall_s, 3),
        "error": result.error or "",
    }


def build_pipeline_assets(
    spec: PipelineSpec,
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], UnresolvedAssetJobDefinition]:
    """The assets, checks and job of one pipeline (the resource is bound by the caller)."""
    with warnings.catch_warnings():
        # BackfillPolicy is marked beta in Dagster 1.13; the single-run policy is what makes one
        # local run drive every partition, so it is used on purpose.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _build(spec)


def _build(
    spec: PipelineSpec,
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], UnresolvedAssetJobDefinition]:
    name = spec.name
    key = resource_key(name)
    partitions = dg.StaticPartitionsDefinition(spec.partition_keys())
    single_run = dg.BackfillPolicy.single_run()

    def eval_asset(
        step: str, description: str, deps: Sequence[Any] = (), **extra: Any
    ) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
        """``@dg.asset`` for one step of this pipeline: its key prefix, group, resource and single-run backfill."""
        return cast(
            Callable[[Callable[..., Any]], dg.AssetsDefinition],
            dg.asset(
                key=[name, step],
                group_name=name,
                deps=list(deps),
                backfill_policy=single_run,
                description=description,
                required_resource_keys={key},
                **extra,
            ),
        )

    @eval_asset(
        "contract",
        f"The sim's contract (observation and action features) for {name}.",
    )
    def contract(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        resource = _resource(context, spec)
        derived = contract_step(resource.pool, resource.outputs)
        return dg.MaterializeResult(
            metadata={
                "features": _features_table(derived),
                "control_rate_hz": derived.control_rate,
                "robot_type": derived.robot_type,
                "path": dg.MetadataValue.path(str(spec.contract_path or resource.outputs.contract)),
            }
        )

    @eval_asset(
        "rollouts",
        f"Rollouts of {name}: one partition per task instance, each one sim of {spec.sim.num_envs} slot(s).",
        deps=[contract],
        partitions_def=partitions,
    )
    def rollouts(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        resource = _resource(context, spec)
        run_id = context.run.run_id

        def on_result(result: InstanceResult) -> None:
            context.log_event(
                dg.AssetObservation(
                    asset_key=context.asset_key, partition=result.key, metadata=_instance_metadata(result)
                )
            )
            progress.notify(result)

        selected = [spec.partition_for_key(k) for k in context.partition_keys]
        results = rollouts_step(
            spec, resource.pool, resource.outputs, run_id=run_id, partitions=selected, on_result=on_result
        )
        traces_dir = resource.outputs.traces(run_id)
        failed = [r for r in results if r.failed]
        totals = summarize([row for r in results for row in r.rows])
        metadata: dict[str, Any] = {
            "instances": len(results),
            "episodes": totals.scheduled,
            "errored": totals.errored,
            "env_steps": sum(r.env_steps for r in results),
            "wall_s": round(max((r.wall_s for r in results), default=0.0), 3),
            "traces": dg.MetadataValue.path(str(traces_dir)),
        }
        if failed:
            for result in results:
                if not result.failed:
                    context.log_event(
                        dg.AssetMaterialization(
                            asset_key=context.asset_key, partition=result.key, metadata=_instance_metadata(result)
                        )
                    )
            reasons = "\n".join(f"- {r.key}: {r.error}" for r in failed)
            raise dg.Failure(
                description=f"{len(failed)} of {len(results)} instance(s) of {name} failed:\n{reasons}",
                metadata=metadata,
            )
        return dg.MaterializeResult(metadata=metadata)

    @eval_asset(
        "grades",
        f"One row per (task, instance, slot) of {name}: seed, score, success, return, steps, status.",
        deps=[rollouts],
    )
    def grades(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        outputs = _resource(context, spec).outputs
        rows = grades_step(spec, outputs)
        summary = summarize(rows)
        low, high = summary.success_interval
        return dg.MaterializeResult(
            metadata={
                "grades": _grades_table(rows),
                "scheduled": summary.scheduled,
                "succeeded": summary.succeeded,
                "failed": summary.failed,
                "errored": summary.errored,
                "success_rate": summary.success_rate if summary.success_rate is not None else float("nan"),
                "success_rate_ci95_low": low,
                "success_rate_ci95_high": high,
                "error_rate": summary.error_rate,
                "mean_score": summary.mean_score if summary.mean_score is not None else float("nan"),
                "path": dg.MetadataValue.path(str(outputs.grades_csv)),
            }
        )

    @eval_asset(
        "report",
        f"Success rate with its 95% interval and denominators, per task, with a plot, for {name}.",
        deps=[rollouts],
    )
    def report(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
        outputs = _resource(context, spec).outputs
        markdown = report_step(spec, outputs)
        return dg.MaterializeResult(
            metadata={"report": dg.MetadataValue.md(markdown), "path": dg.MetadataValue.path(str(outputs.report_md))}
        )

    checks = [_check(spec, check, grades.key) for check in spec.checks]
    assets: list[dg.AssetsDefinition] = [contract, rollouts, grades, report]

    if spec.dataset_enabled:

        @eval_asset(
            "dataset",
            f"The rollouts of {name} as a LeRobot v3 dataset (every instance's shard, merged and "
            "published atomically).",
            deps=[grades],
        )
        def dataset(context: AssetExecutionContext) -> dg.MaterializeResult[Any]:
            resource = _resource(context, spec)
            published = dataset_step(
                spec, resource.outputs, project_dir=Path(resource.project_dir), run_id=context.run.run_id
            )
            return dg.MaterializeResult(metadata=published.dagster_metadata())

        assets.append(dataset)
    job = dg.define_asset_job(
        name,
        selection=dg.AssetSelection.key_prefixes([name]),
        executor_def=dg.in_process_executor,
        description=spec.description or f"Evaluate {name}",
        tags={RANGE_START_TAG: spec.partition_keys()[0], RANGE_END_TAG: spec.partition_keys()[-1]},
    )
    return assets, checks, job


def _check(spec: PipelineSpec, check: CheckSpec, grades_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    key = resource_key(spec.name)

    @dg.asset_check(
        asset=grades_key,
        name=check.name,
        blocking=check.blocking,
        description=type(check).__doc__,
        required_resource_keys={key},
    )
    def run_check(context: AssetCheckExecutionContext) -> dg.AssetCheckResult:
        summary = summarize(read_grades(_resource(context, spec).outputs))
        passed, observed = evaluate_check(check, summary.success_rate, summary.error_rate, summary.mean_score)
        return dg.AssetCheckResult(
            passed=passed,
            severity=dg.AssetCheckSeverity.ERROR if check.blocking else dg.AssetCheckSeverity.WARN,
            description=f"{check.kind}: observed {observed}, threshold {check.value}",
            metadata={
                "observed": observed if observed is not None else float("nan"),
                "threshold": check.value,
                "scheduled": summary.scheduled,
                "errored": summary.errored,
            },
        )

    return run_check


def evaluate_check(
    check: CheckSpec, success_rate: float | None, error_rate: float, mean_score: float | None
) -> tuple[bool, float | None]:
    """Whether ``check`` passes and the figure it looked at (no graded episode fails a rate check)."""
    match check:
        case MinSuccessRateCheck():
            return success_rate is not None and success_rate >= check.value, success_rate
        case MaxErrorRateCheck():
            return error_rate <= check.value, error_rate
        case MinMeanScoreCheck():
            return mean_score is not None and mean_score >= check.value, mean_score
