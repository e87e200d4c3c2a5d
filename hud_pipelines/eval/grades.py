"""Grades: per-slot rows and eval-level statistics with honest denominators.

Every scheduled (task, instance, slot) ends in exactly one row whose ``status`` is ``succeeded``,
``failed`` or ``errored``. Errors are never failures: the success rate is ``succeeded / (succeeded +
failed)`` over the episodes that produced an answer, and the error rate is reported beside it, so
``scheduled == succeeded + failed + errored`` always holds. The 95% interval is Wilson's score
interval, which stays inside [0, 1] and is sensible for the small samples evals usually have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hud_pipelines.errors import Fault
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.sections import (
    CheckSpec,
    MaxErrorRateCheck,
    MinMeanScoreCheck,
    MinSuccessRateCheck,
    NoRegressionCheck,
)

Z_95 = 1.959963984540054


@dataclass(frozen=True)
class GradeRow:
    """One graded slot of one instance of one task."""

    pipeline: str
    task: str
    task_index: int
    instance: int
    group_id: str
    slot: int
    seed: int | None
    status: EpisodeStatus
    score: float
    success: bool
    total_reward: float
    steps: int
    error: str | None = None
    trace_id: str | None = None
    metrics: dict[str, float | bool] = field(default_factory=dict[str, float | bool])
    """Columns added by the graders after the first (``<name>_score``, ``<name>_success``)."""
    fault: Fault | None = None
    """Why an errored row errored; ``None`` for rows that produced an answer."""
    run_id: str = ""
    """The run that produced this row (a grade table may hold rows of earlier runs of other instances)."""
    checkpoint: str | None = None
    """The checkpoint of a sweep this row evaluated (its label); ``None`` outside sweeps."""

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["status"] = self.status.value
        row["fault"] = None if self.fault is None else self.fault.value
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> GradeRow:
        fault = row.get("fault")
        fields: dict[str, Any] = {
            **row,
            "status": EpisodeStatus(row["status"]),
            "fault": Fault(fault) if fault else None,
        }
        return cls(**fields)


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; ``(0, 1)`` when there are no trials."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Summary:
    """Eval-level figures with their denominators."""

    scheduled: int
    succeeded: int
    failed: int
    errored: int
    mean_score: float | None
    mean_return: float | None

    @property
    def graded(self) -> int:
        """Episodes that produced an answer (errors excluded)."""
        return self.succeeded + self.failed

    @property
    def success_rate(self) -> float | None:
        return None if self.graded == 0 else self.succeeded / self.graded

    @property
    def error_rate(self) -> float:
        return 0.0 if self.scheduled == 0 else self.errored / self.scheduled

    @property
    def success_interval(self) -> tuple[float, float]:
        return wilson_interval(self.succeeded, self.graded)

    def as_dict(self) -> dict[str, Any]:
        low, high = self.success_interval
        return {
            "scheduled": self.scheduled,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "errored": self.errored,
            "success_rate": self.success_rate,
            "success_rate_ci95": [low, high],
            "error_rate": self.error_rate,
            "mean_score": self.mean_score,
            "mean_return": self.mean_return,
        }


def summarize(rows: Iterable[GradeRow]) -> Summary:
    rows = list(rows)
    graded = [r for r in rows if r.status is not EpisodeStatus.ERRORED]
    return Summary(
        scheduled=len(rows),
        succeeded=sum(r.status is EpisodeStatus.SUCCEEDED for r in rows),
        failed=sum(r.status is EpisodeStatus.FAILED for r in rows),
        errored=sum(r.status is EpisodeStatus.ERRORED for r in rows),
        mean_score=_mean([r.score for r in graded]),
        mean_return=_mean([r.total_reward for r in graded]),
    )


def summarize_by_task(rows: Sequence[GradeRow]) -> dict[str, Summary]:
    tasks: dict[str, list[GradeRow]] = {}
    for row in rows:
        tasks.setdefault(row.task, []).append(row)
    return {task: summarize(task_rows) for task, task_rows in tasks.items()}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# -- checks --------------------------------------------------------------------------------------------

INSTANCES_CHECK = "instances_completed"
"""The built-in blocking check of every eval: no instance failed (sim, policy deadline, interruption)."""


@dataclass(frozen=True)
class CheckVerdict:
    """The result of one check on a grade table: what it looked at and whether it passed."""

    name: str
    passed: bool
    blocking: bool
    description: str
    observed: float | None = None
    threshold: float | None = None
    failed_instances: tuple[str, ...] = ()
    """Partition keys of the instances that failed (for ``instances_completed``)."""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed_instances": list(self.failed_instances)}


def instances_verdict(rows: Sequence[GradeRow]) -> CheckVerdict:
    """``instances_completed``: passes when no row errored with a fault that ended its instance.

    Instances that have not run yet (``not_run``) do not fail it: a run of a few partitions is
    complete when those ran; the grades still show the others as errored.
    """
    failed: dict[str, tuple[str, str]] = {}
    not_run = 0
    for row in rows:
        if row.fault is Fault.NOT_RUN:
            not_run += 1
        elif row.fault is not None and row.fault.ends_instance:
            failed.setdefault(row.group_id, (row.fault.value, row.error or ""))
    if failed:
        listed = "; ".join(f"{key}: {fault} ({reason})" for key, (fault, reason) in sorted(failed.items()))
        rerun = " ".join(f"--partition {key}" for key in sorted(failed))
        command = f"hud-pipelines run {rows[0].pipeline} {rerun}"
        description = f"{len(failed)} instance(s) failed: {listed}; re-run them with: {command}"
    else:
        description = "every instance ran to its end"
    if not_run:
        description += f"; {not_run} episode(s) of instances that have not run"
    return CheckVerdict(
        name=INSTANCES_CHECK,
        passed=not failed,
        blocking=True,
        description=description,
        observed=float(len(failed)),
        threshold=0.0,
        failed_instances=tuple(sorted(failed)),
    )


def check_verdict(check: CheckSpec, rows: Sequence[GradeRow]) -> CheckVerdict:
    """Whether a pipeline's check passes on the grade ``rows`` (no graded episode fails a rate check)."""
    if isinstance(check, NoRegressionCheck):
        return _regression_verdict(check, rows)
    summary = summarize(rows)
    observed: float | None
    match check:
        case MinSuccessRateCheck():
            observed = summary.success_rate
            passed = observed is not None and observed >= check.value
        case MaxErrorRateCheck():
            observed = summary.error_rate
            passed = observed <= check.value
        case MinMeanScoreCheck():
            observed = summary.mean_score
            passed = observed is not None and observed >= check.value
    return CheckVerdict(
        name=check.name,
        passed=passed,
        blocking=check.blocking,
        description=f"{check.kind}: observed {observed}, threshold {check.value}",
        observed=observed,
        threshold=check.value,
    )


def _regression_verdict(check: NoRegressionCheck, rows: Sequence[GradeRow]) -> CheckVerdict:
    """``no_regression`` against the baseline file the check names."""
    from hud_pipelines.errors import HudPipelinesError
    from hud_pipelines.eval.comparison import read_result_set

    try:
        baseline = read_result_set(check.baseline)
    except HudPipelinesError as exc:
        return _regression(check, False, f"the baseline cannot be read: {exc}")
    return regression_verdict(check, rows, baseline, baseline_name=check.baseline)


def regression_verdict(
    check: NoRegressionCheck, rows: Sequence[GradeRow], baseline: Sequence[GradeRow], *, baseline_name: str
) -> CheckVerdict:
    """``no_regression``: the paired comparison with the baseline decides (see :mod:`hud_pipelines.eval.comparison`)."""
    from hud_pipelines.eval.comparison import Verdict, compare

    result = compare(rows, baseline, alpha=1 - check.confidence, min_effect=max(check.max_drop, 0.01))
    if result.pairs == 0:
        return _regression(
            check, False, f"no episode pairs up with the baseline {baseline_name} (same tasks and seeds?)"
        )
    drop = -(result.success_difference or 0.0)
    against = f"{result.pairs} paired episodes against {baseline_name}"
    if result.verdict is Verdict.WORSE and drop > check.max_drop:
        return _regression(
            check,
            False,
            f"worse than the baseline: success {-drop:+.1%} (McNemar p = {result.mcnemar_p:.3g}) over {against}",
            -drop,
        )
    if result.verdict is Verdict.NO_DIFFERENCE:
        needed = result.episodes_needed or 0
        more = max(0, needed - result.pairs)
        return _regression(
            check,
            True,
            f"inconclusive: success {-drop:+.1%} (p = {result.mcnemar_p:.3g}) over {against}; "
            f"{more} more episodes needed to detect a {result.min_effect:.0%} drop",
            -drop,
        )
    return _regression(
        check, True, f"{result.verdict.value} than the baseline: success {-drop:+.1%} over {against}", -drop
    )


def _regression(
    check: NoRegressionCheck, passed: bool, description: str, observed: float | None = None
) -> CheckVerdict:
    return CheckVerdict(check.name, passed, check.blocking, f"no_regression: {description}", observed, -check.max_drop)


def verdicts(checks: Sequence[CheckSpec], rows: Sequence[GradeRow]) -> list[CheckVerdict]:
    """Every check of a pipeline on its grade table: the built-in one first, then the YAML's."""
    return [instances_verdict(rows), *(check_verdict(check, rows) for check in checks)]
