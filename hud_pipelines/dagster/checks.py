"""A pipeline's asset checks on its grades: the built-in ``instances_completed`` and ``episodes_answered``, and
the YAML's checks.

Each check reads the grade table the ``grades`` asset wrote and this run's thresholds (the graders
resource); the YAML's judge the control tasks, a sweep's its candidate
(:func:`hud_pipelines.eval.judging.yaml_verdict`).
"""

import inspect
from collections.abc import Callable, Sequence

import dagster as dg
from dagster import AssetCheckExecutionContext

from hud_pipelines.dagster.context import judged_of
from hud_pipelines.dagster.resources import GRADERS, resource_key
from hud_pipelines.eval import sweep
from hud_pipelines.eval.checks import (
    ANSWERED_CHECK,
    INSTANCES_CHECK,
    CheckVerdict,
    answered_verdict,
    rerun_command,
)
from hud_pipelines.eval.grade_table import read_grades
from hud_pipelines.eval.grades import GradeRow, summarize
from hud_pipelines.eval.judging import completed_verdict, yaml_verdict
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.grading import CheckSpec
from hud_pipelines.spec.models import PipelineSpec


def pipeline_check(
    spec: PipelineSpec, outputs: EvalOutputs, check: CheckSpec, grades_key: dg.AssetKey
) -> dg.AssetChecksDefinition:
    key = resource_key(spec.name, GRADERS)

    @dg.asset_check(
        asset=grades_key,
        name=check.name,
        blocking=check.blocking,
        description=check_description(check),
        required_resource_keys={key},
    )
    def run_check(context: AssetCheckExecutionContext) -> dg.AssetCheckResult:
        rows = read_grades(outputs)
        judged = judged_of(context, spec)
        configured = {c.name: c for c in judged.resolved_checks()}.get(check.name, check)  # this run's threshold
        return _check_result(yaml_verdict(judged, configured, rows, outputs), rows)

    return run_check


def instances_check(spec: PipelineSpec, outputs: EvalOutputs, grades_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The built-in blocking check: a failed instance fails the run (and holds the dataset back)."""

    def judge(rows: list[GradeRow]) -> dg.AssetCheckResult:
        command = outputs.run_command(spec)
        verdict = completed_verdict(spec, rows, command)
        result = _check_result(verdict, rows)
        if not verdict.failed_instances:
            return result
        keys = verdict.failed_instances
        order = list(dict.fromkeys(row.group_id for row in rows))
        rerun = rerun_command(keys, command, order)
        metadata = {**result.metadata, "failed_instances": dg.MetadataValue.json(list(keys)), "rerun": rerun}
        return dg.AssetCheckResult(
            passed=False, severity=result.severity, description=result.description, metadata=metadata
        )

    described = (
        "Every instance ran to its end: none failed on a sim fault, a policy or rollout deadline, or an "
        "interruption. Failed instances are listed with the command that re-runs them."
    )
    return _builtin_check(INSTANCES_CHECK, described, outputs, grades_key, judge)


def answered_check(spec: PipelineSpec, outputs: EvalOutputs, grades_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The built-in blocking check that an eval has a result: some episode (a sweep's candidate's) was answered."""

    def judge(rows: list[GradeRow]) -> dg.AssetCheckResult:
        return _check_result(sweep.answered(rows) if spec.is_sweep else answered_verdict(rows), rows)

    described = (
        "Some episode produced an answer (succeeded or failed): a run whose every episode errored has no "
        "success rate, and fails instead of passing its rate checks on nothing."
    )
    return _builtin_check(ANSWERED_CHECK, described, outputs, grades_key, judge)


def _builtin_check(
    name: str,
    description: str,
    outputs: EvalOutputs,
    grades_key: dg.AssetKey,
    judge: Callable[[list[GradeRow]], dg.AssetCheckResult],
) -> dg.AssetChecksDefinition:
    """A blocking check every eval gets, judged on the grade table the ``grades`` asset wrote."""

    @dg.asset_check(asset=grades_key, name=name, blocking=True, description=description)
    def builtin(context: AssetCheckExecutionContext) -> dg.AssetCheckResult:
        del context  # the grades on disk are all it reads
        return judge(read_grades(outputs))

    return builtin


def _check_result(verdict: CheckVerdict, rows: Sequence[GradeRow]) -> dg.AssetCheckResult:
    summary = summarize(rows)
    return dg.AssetCheckResult(
        passed=verdict.passed,
        severity=dg.AssetCheckSeverity.ERROR if verdict.blocking else dg.AssetCheckSeverity.WARN,
        description=verdict.description,
        metadata={
            "observed": verdict.observed if verdict.observed is not None else float("nan"),
            "threshold": verdict.threshold if verdict.threshold is not None else float("nan"),
            "scheduled": summary.scheduled,
            "errored": summary.errored,
        },
    )


def check_description(check: CheckSpec) -> str:
    """What a YAML check asserts, as its docs say, and how this pipeline sets it (the UI shows the docstring
    as it is, indented like code, and without the threshold)."""
    settings = check.model_dump(mode="json", exclude={"kind", "name"})
    ordered = sorted(settings.items(), key=lambda item: item[0] == "blocking")  # its threshold first
    configured = ", ".join(f"{key} = {value}" for key, value in ordered)
    return f"{inspect.cleandoc(type(check).__doc__ or check.kind)}\n\nHere: {configured}."
