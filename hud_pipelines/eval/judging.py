"""Which rows each check judges: the built-in ones every row, the YAML's the control tasks.

A matrix's tasks run other configurations (each is compared with its control in the perturbations
table), and a sweep's checkpoints are other weights (its YAML checks judge the candidate): pooling
either into a gate would change what the gate means. The Dagster asset checks and the steps judge
through here, so a run's checks and ``evaluate()``'s agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hud_pipelines.eval import sweep
from hud_pipelines.eval.checks import CheckVerdict, builtin_verdicts, check_verdict, instances_verdict
from hud_pipelines.eval.graders import score_bounds
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.perturbations import control_rows
from hud_pipelines.eval.result_sets import grades_file
from hud_pipelines.spec.grading import CheckSpec, NoRegressionCheck
from hud_pipelines.spec.models import PipelineSpec


def all_verdicts(
    spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow], run_failure: str | None = None
) -> list[CheckVerdict]:
    """The built-in checks on every row, then the YAML's (:func:`yaml_verdict`).

    ``run_failure``: why the run writing them failed before its grades (instances that kept earlier runs'
    results, a configuration refused before any rollout): ``instances_completed`` fails saying so, since the
    rows alone (earlier runs' results) would pass it.
    """
    command = outputs.run_command(spec)  # as the check step's (``--outputs`` where not the default)
    builtin = (
        [completed_verdict(spec, rows, command), sweep.answered(rows)]
        if spec.is_sweep
        else builtin_verdicts(rows, command)
    )
    if run_failure is not None:
        builtin[0] = replace(builtin[0], passed=False, description=f"this run failed: {run_failure}")
    return [*builtin, *(yaml_verdict(spec, check, rows, outputs) for check in spec.resolved_checks())]


def completed_verdict(spec: PipelineSpec, rows: Sequence[GradeRow], command: Sequence[str]) -> CheckVerdict:
    """``instances_completed`` (a sweep's names the checkpoints that cannot load)."""
    return sweep.completed(rows, command) if spec.is_sweep else instances_verdict(rows, command)


def own_baseline(check: NoRegressionCheck, outputs: EvalOutputs) -> str | None:
    """Why ``check`` (its baseline resolved) cannot judge: its baseline is the pipeline's own ``grades.json``, which
    every run rewrites before its checks read it, so a run would be compared with itself. ``None`` otherwise."""
    named = grades_file(check.baseline, outputs.root)[0].resolve()
    if named not in (outputs.grades_json.resolve(), outputs.base.resolve()):  # the folder, before its first run
        return None
    return (
        f"the baseline is this pipeline's own grades.json ({outputs.grades_json}), which every run rewrites before "
        "its checks read it, so each run would be compared with itself: copy the grades.json of the run to compare "
        "with to a file of its own, and name that file"
    )


def yaml_verdict(spec: PipelineSpec, check: CheckSpec, rows: Sequence[GradeRow], outputs: EvalOutputs) -> CheckVerdict:
    """One YAML check on the control tasks' rows (a sweep's: of its candidate checkpoint), as its description says."""
    if isinstance(check, NoRegressionCheck) and (itself := own_baseline(check, outputs)) is not None:
        return CheckVerdict(check.name, False, check.blocking, f"{check.name}: {itself}")
    judged = control_rows(spec, rows)
    bounds = score_bounds(spec.graders[0])
    found = sweep.verdict(spec, check, judged, bounds) if spec.is_sweep else check_verdict(check, judged, bounds)
    return found if len(judged) == len(rows) else replace(found, description=f"control tasks: {found.description}")


def headline_rows(spec: PipelineSpec, rows: Sequence[GradeRow]) -> tuple[str, list[GradeRow]]:
    """The rows a headline rate counts, and what they are (``""``: every row).

    The control tasks, as the YAML's checks judge them; of a sweep, its candidate checkpoint's. The
    report, the HTML page and the Dagster UI's grades figures all state this one rate.
    """
    judged = control_rows(spec, rows)
    matrix = len(judged) != len(rows)  # a rate pooled over other configurations would mean nothing
    if not spec.is_sweep:
        return ("control tasks; each perturbation against its control below" if matrix else ""), judged
    label = sweep.candidate_label(judged)  # one rate over several weights means nothing: the candidate's, as checked
    if label is None:
        return "no checkpoint evaluated yet", []
    scope = f"candidate checkpoint {label}" + (", control tasks" if matrix else "")
    return scope, [row for row in judged if row.checkpoint == label]
