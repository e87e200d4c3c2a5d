"""Checks: the verdicts a grade table gets, the built-in ``instances_completed`` and ``episodes_answered``
first, then the YAML's.

A rate check (``min_success_rate``, ``max_error_rate``, ``min_mean_score``) reads the table's own
figures; ``no_regression`` compares it with a baseline on paired episodes
(:mod:`hud_pipelines.eval.comparison`) and says "inconclusive" with the episodes an answer needs
rather than pass or fail on noise. Errored episodes never count as failed ones.
"""

from __future__ import annotations

import collections
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.comparison import (
    Verdict,
    compare,
    errored_in_a_run,
    errors_against,
    paired_episodes,
    unpaired_cause,
)
from hud_pipelines.eval.grades import GradeRow, one_line, summarize
from hud_pipelines.eval.result_sets import read_result_set
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.grading import (
    BUILTIN_CHECKS,
    CheckSpec,
    MaxErrorRateCheck,
    MinMeanScoreCheck,
    MinSuccessRateCheck,
    NoRegressionCheck,
)

INSTANCES_CHECK, ANSWERED_CHECK = BUILTIN_CHECKS
"""The built-in blocking checks of every eval: no instance failed (a sim fault, a policy deadline, an
interruption), and some episode produced an answer (so the eval has a result)."""
RERUN_HINT = "; re-run them with: "
"""What precedes the command in ``instances_completed``'s description (the CLI puts its own invocation there)."""


@dataclass(frozen=True)
class CheckVerdict:
    """The result of one check on a grade table: what it looked at and whether it passed."""

    name: str
    passed: bool
    blocking: bool
    """Whether its failure fails the run and stops the assets downstream (the dataset), or only warns."""
    description: str
    observed: float | None = None
    threshold: float | None = None
    failed_instances: tuple[str, ...] = ()
    """Partition keys of the instances that failed (for ``instances_completed``)."""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed_instances": list(self.failed_instances)}


def rerun_command(failed: Sequence[str], command: Sequence[str], order: Sequence[str] | None = None) -> str:
    """The shell line that runs the ``failed`` instances again: ``command`` and a ``--partition`` each.

    One run takes a contiguous range of partitions, so failed instances with others between them (in
    ``order``, every partition key in order) get a command per range, joined by ``;``. Quoted for a
    shell: a sweep's keys hold ``|`` (``<checkpoint>|<instance>``).
    """
    position = {key: index for index, key in enumerate(order or failed)}
    ranges: list[list[str]] = []
    for key in sorted(failed, key=lambda k: position.get(k, len(position))):
        if ranges and position.get(key) == position.get(ranges[-1][-1], -2) + 1:
            ranges[-1].append(key)
        else:
            ranges.append([key])
    return "; ".join(shlex.join([*command, *(arg for key in keys for arg in ("--partition", key))]) for keys in ranges)


_NOT_FIXED_BY_RUNNING_AGAIN = {Fault.CONTRACT.value, Fault.SETUP.value}
"""Faults of the configuration (the contract, the policy or a grader that cannot load): a run again alone
meets them again."""


def instances_verdict(rows: Sequence[GradeRow], command: Sequence[str] | None = None) -> CheckVerdict:
    """``instances_completed``: passes when no row errored with a fault that ended its instance.

    ``command`` runs the pipeline again (:meth:`~hud_pipelines.eval.outputs.EvalOutputs.run_command`: a file
    outside the pipelines directory named by its path, outputs elsewhere by ``--outputs``); by default,
    ``hud-pipelines run`` and its rows' pipeline name.

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
        listed = "; ".join(f"{key}: {fault} ({one_line(reason)})" for key, (fault, reason) in sorted(failed.items()))
        order = list(dict.fromkeys(row.group_id for row in rows))
        again = rerun_command(sorted(failed), command or ["hud-pipelines", "run", rows[0].pipeline], order)
        fix_first = sorted({fault for fault, _ in failed.values()} & _NOT_FIXED_BY_RUNNING_AGAIN)
        said = f"{fix_first[0]} error says" if len(fix_first) == 1 else f"{' and '.join(fix_first)} errors say"
        first = f"; fix what the {said} first" if fix_first else ""
        description = f"{len(failed)} instance(s) failed: {listed}{first}{RERUN_HINT}{again}"
    else:
        description = "every instance that ran, ran to its end"
    if not_run:
        description += f"; {not_run} episode(s) of instances not run with this configuration yet"
    return CheckVerdict(
        name=INSTANCES_CHECK,
        passed=not failed,
        blocking=True,
        description=description,
        observed=float(len(failed)),
        threshold=0.0,
        failed_instances=tuple(sorted(failed)),
    )


def answered_verdict(rows: Sequence[GradeRow]) -> CheckVerdict:
    """``episodes_answered``: passes when at least one episode succeeded or failed.

    Errors are never failures, so a table whose every episode errored (a policy that raises on
    every forward, a grader that always fails) has no success rate at all: without this check such
    a run would pass every rate check that needs no graded episode and exit 0. The reason of the
    first errored row and the count of each fault say where to look.
    """
    summary = summarize(rows)
    if summary.graded:
        description = f"{summary.graded} of {summary.scheduled} episode(s) produced an answer (succeeded or failed)"
    else:
        faults = collections.Counter(row.fault.value for row in rows if row.fault is not None)
        counted = ", ".join(f"{fault}: {count}" for fault, count in sorted(faults.items()))
        first = next((row.error for row in rows if row.error), None)
        description = f"no episode produced an answer: {summary.scheduled} scheduled, {summary.errored} errored"
        description += f" ({counted})" if counted else ""
        description += f"; the first error: {one_line(first)}" if first else ""
    return CheckVerdict(
        name=ANSWERED_CHECK,
        passed=summary.graded > 0,
        blocking=True,
        description=description,
        observed=float(summary.graded),
        threshold=1.0,
    )


def builtin_verdicts(rows: Sequence[GradeRow], command: Sequence[str] | None = None) -> list[CheckVerdict]:
    """The checks every eval gets, whatever its YAML says: ``instances_completed``, ``episodes_answered``."""
    return [instances_verdict(rows, command), answered_verdict(rows)]


def check_verdict(
    check: CheckSpec, rows: Sequence[GradeRow], score_bounds: tuple[float, float] | None = None
) -> CheckVerdict:
    """Whether a pipeline's check passes on the grade ``rows`` (no graded episode fails a rate check).

    ``score_bounds``: the lowest and highest score the first grader gives (a success grader's 0 and 1), with
    which ``min_mean_score`` knows whether the errored episodes could decide it; ``None``: unbounded (a return).
    """
    if isinstance(check, NoRegressionCheck):
        return _regression_verdict(check, rows)
    summary = summarize(rows)
    observed: float | None
    note = ""
    match check:
        case MinSuccessRateCheck():
            observed = summary.success_rate
            passed = observed is not None and observed >= check.value
            said = f"{observed:.1%} ({summary.succeeded}/{summary.graded})" if observed is not None else ""
            threshold = f"{check.value:.1%}"
            undecided = _errors_decide(check, rows, summary.succeeded, summary.graded)
            if undecided and observed is not None:  # a pass they could take away, or a failure they could turn
                passed, said = False, f"{said}, {'but ' if passed else ''}{undecided}"
            if observed is not None:
                note = _not_run_could(check, rows, summary.succeeded, summary.graded)
        case MaxErrorRateCheck():  # instances not run with this configuration yet are no errors of a run
            errored, scheduled = summary.errored - summary.not_run, summary.scheduled - summary.not_run
            observed = 0.0 if scheduled == 0 else errored / scheduled
            passed = observed <= check.value
            said, threshold = f"{observed:.1%} ({errored}/{scheduled})", f"{check.value:.1%}"
            note = f"; {summary.not_run} episode(s) not run with this configuration yet" if summary.not_run else ""
        case MinMeanScoreCheck():
            observed = summary.mean_score
            passed = observed is not None and observed >= check.value
            said, threshold = f"{observed:.4g}" if observed is not None else "", f"{check.value:g}"
            undecided, note = _errors_decide_mean(check, rows, score_bounds) if observed is not None else ("", "")
            if undecided:
                passed, said = False, f"{said}, {'but ' if passed else ''}{undecided}"
    return CheckVerdict(
        name=check.name,
        passed=passed,
        blocking=check.blocking,
        description=f"{check.kind}: observed {said or 'n/a (no graded episode)'}, threshold {threshold}{note}",
        observed=observed,
        threshold=check.value,
    )


def _errors_decide(check: MinSuccessRateCheck, rows: Sequence[GradeRow], succeeded: int, graded: int) -> str:
    """Why the run's errored episodes could decide ``check`` (``""``: they could not). Instances not run
    with this configuration yet are no answer of this eval's, and are left out."""
    errored = sum(errored_in_a_run(row) for row in rows)
    if not errored:
        return ""
    worst, best = succeeded / (graded + errored), (succeeded + errored) / (graded + errored)
    if worst >= check.value or best < check.value:
        return ""
    return (
        f"undecided: {errored} errored episode(s) decide it ({worst:.1%} had they failed, {best:.1%} had they "
        "succeeded); errors are not failures, nor do they carry a pass: fix what errored and run them again"
    )


def _errors_decide_mean(
    check: MinMeanScoreCheck, rows: Sequence[GradeRow], bounds: tuple[float, float] | None
) -> tuple[str, str]:
    """Why the errored episodes could decide ``check`` (as :func:`_errors_decide`), and else a note of how many
    the mean leaves out where the scores are unbounded (a return could be anything)."""
    errored = sum(errored_in_a_run(row) for row in rows)
    if not errored:
        return "", ""
    if bounds is None:
        return "", f"; {errored} errored episode(s) left out of the mean"
    scores = [row.score for row in rows if row.status is not EpisodeStatus.ERRORED]
    low, high = bounds
    worst, best = [(sum(scores) + errored * bound) / (len(scores) + errored) for bound in bounds]
    if worst >= check.value or best < check.value:
        return "", ""
    return (
        f"undecided: {errored} errored episode(s) decide it ({worst:.4g} had they scored {low:g}, {best:.4g} "
        f"had they scored {high:g}); errors are not failures, nor do they carry a pass: fix what errored and run "
        "them again"
    ), ""


def _not_run_could(check: MinSuccessRateCheck, rows: Sequence[GradeRow], succeeded: int, graded: int) -> str:
    """Where instances not run with this configuration yet (a run of some partitions) could take the verdict,
    said beside it; they are no answer of this eval's, so they do not decide it (``""``: they could not move it)."""
    unrun = sum(row.fault is Fault.NOT_RUN for row in rows)
    if not unrun:
        return ""
    errored = sum(errored_in_a_run(row) for row in rows)
    scheduled = graded + errored + unrun
    worst, best = succeeded / scheduled, (succeeded + errored + unrun) / scheduled
    if worst >= check.value or best < check.value:
        return ""
    return (
        f"; {unrun} episode(s) not run with this configuration yet could change it ({worst:.1%} to {best:.1%} "
        "had they run): run every instance for the eval's verdict"
    )


def _regression_verdict(check: NoRegressionCheck, rows: Sequence[GradeRow]) -> CheckVerdict:
    """``no_regression`` against the baseline file the check names."""

    try:
        baseline = read_result_set(check.baseline)
    except HudPipelinesError as exc:
        return _regression(check, False, f"the baseline cannot be read: {exc}")
    return regression_verdict(check, rows, baseline.rows, baseline_name=baseline.name)


def regression_verdict(
    check: NoRegressionCheck, rows: Sequence[GradeRow], baseline: Sequence[GradeRow], *, baseline_name: str
) -> CheckVerdict:
    """``no_regression``: the paired comparison with the baseline decides (see :mod:`hud_pipelines.eval.comparison`)."""
    result = compare(rows, baseline, alpha=1 - check.confidence, min_effect=max(check.max_drop, 0.01))
    if result.pairs == 0:
        why = unpaired_cause(rows, baseline)  # results gone stale are no typo of tasks or seeds
        return _regression(check, False, f"no episode pairs up with the baseline {baseline_name} ({why})")
    drop = -(result.success_difference or 0.0)
    against = f"{paired_episodes(result.pairs)} against {baseline_name}"
    if not (result.verdict is Verdict.WORSE and drop > check.max_drop):
        undecided = _errors_decide_regression(check, rows, baseline)
        if undecided:
            return _regression(check, False, f"{undecided} (as answered: success {-drop:+.1%} over {against})", -drop)
    if result.verdict is Verdict.WORSE and drop > check.max_drop:
        return _regression(
            check,
            False,
            f"worse than the baseline: success {-drop:+.1%} (McNemar p = {result.mcnemar_p:.3g}) over {against}",
            -drop,
        )
    unrun = sum(row.fault is Fault.NOT_RUN for row in rows)  # a run of some instances: no answer, said beside
    left_out = f"; {unrun} episode(s) not run with this configuration yet are left out" if unrun else ""
    if result.verdict is Verdict.NO_DIFFERENCE:  # enough pairs to see a drop of that size and none seen: an answer
        more, effect = max(0, (result.episodes_needed or 0) - result.pairs), f"{result.min_effect:.0%} drop"
        said = f"{more} more episodes needed to detect a {effect}" if more else f"enough to detect a {effect}"
        verdict = "inconclusive" if more else "no drop detected"
        observed = f"success {-drop:+.1%} (p = {result.mcnemar_p:.3g}) over {against}"
        return _regression(check, True, f"{verdict}: {observed}; {said} at 80% power{left_out}", -drop)
    return _regression(
        check, True, f"{result.verdict.value} than the baseline: success {-drop:+.1%} over {against}{left_out}", -drop
    )


def _errors_decide_regression(check: NoRegressionCheck, rows: Sequence[GradeRow], baseline: Sequence[GradeRow]) -> str:
    """Why episodes that errored on one side only could make this eval a regression (``""``: they could
    not): had each gone against it (failed here, succeeded in the baseline), it would be worse by more
    than ``max_drop``."""
    errors = errors_against(rows, baseline, alpha=1 - check.confidence, min_effect=max(check.max_drop, 0.01))
    if errors is None or not (errors.worst.verdict is Verdict.WORSE and errors.drop() > check.max_drop):
        return ""
    said = errors.describe("this eval")
    return f"undecided: {said} would be a regression: errors are not failures, nor do they carry a pass"


def _regression(
    check: NoRegressionCheck, passed: bool, description: str, observed: float | None = None
) -> CheckVerdict:
    return CheckVerdict(check.name, passed, check.blocking, f"no_regression: {description}", observed, -check.max_drop)


def verdicts(
    checks: Sequence[CheckSpec], rows: Sequence[GradeRow], score_bounds: tuple[float, float] | None = None
) -> list[CheckVerdict]:
    """Every check of a pipeline on its grade table: the built-in ones first, then the YAML's (``score_bounds``:
    the first grader's, as :func:`check_verdict` takes them)."""
    return [*builtin_verdicts(rows), *(check_verdict(check, rows, score_bounds) for check in checks)]
