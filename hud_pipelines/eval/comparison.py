"""Paired comparison of two result sets on the same episodes: is the candidate better, worse, or can't we tell?

Two evals of the same pipeline (two checkpoints, a change and its baseline) run exactly the same
episodes, so their outcomes pair up episode by episode: an episode is its task and its seed (where
it starts), whichever instance and slot ``num_envs`` put it in; rows without a seed pair on their
task, instance and slot. Pairing is what
makes small evals informative: an episode both solve or both miss says nothing about the difference;
only the *discordant* pairs do. The statistics here are the standard ones for that design:

- success: McNemar's exact test (a two-sided binomial test on the discordant pairs), the paired
  difference in success rate with an exact interval that excludes zero exactly when that test finds
  a difference (:func:`paired_difference_interval`), and the number of paired episodes a difference
  of ``min_effect`` would need to be detected at 80% power (Connor's formula for McNemar's test,
  with the discordance observed here);
- score: the mean paired difference, with the two-sided p-value of the paired sign-flip
  (randomization) test, exact over all ``2^n`` flips up to :data:`EXACT_FLIPS_UP_TO` pairs and drawn
  from a fixed seed above, and the interval that inverts the same test (every shift of the
  differences it does not reject), so the interval excludes zero exactly when p < alpha. On few pairs
  the test cannot reject anything (one pair: p = 1; three pairs all one way: p = 0.25) and there is
  no interval to give (``None``), where a bootstrap would have said p = 0 and an interval of zero
  width. Where every score is the episode's success (1 or 0, as the ``success`` grader gives), the
  score difference is the success difference and gets its exact interval and McNemar's p.

Errored episodes carry no answer, so a pair where either side errored is left out (and counted).
Random draws come from a fixed seed: the same inputs always give the same figures.
A bootstrap of the success difference would be too narrow on the few pairs evals have (on 8 pairs,
4 discordant all one way, it excludes zero where McNemar's p is 0.125): the report must not say
"no detectable difference" beside an interval that says there is one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.grades import GradeRow, one_line
from hud_pipelines.eval.paired_tests import (
    mcnemar_exact,
    mcnemar_sample_size,
    paired_difference_interval,
    sign_flip_test,
)
from hud_pipelines.eval.result_sets import SETTINGS, Judge, read_result_set
from hud_pipelines.recording.events import EpisodeStatus

EpisodeId = tuple[str, int, int, int]
"""How two result sets pair up: ``(task, seed, -1, -1)``, or ``(task, -1, instance, slot)`` for a row
without a seed (seeds are never negative)."""


class Verdict(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    NO_DIFFERENCE = "no detectable difference"


@dataclass(frozen=True)
class PairedComparison:
    """The candidate against the baseline on their paired episodes."""

    pairs: int
    """Episodes both sides answered (neither errored)."""
    unpaired: int
    """Episodes only one side has, or that errored on either side (left out)."""
    both_succeeded: int
    only_candidate: int
    """Pairs the candidate solved and the baseline did not."""
    only_baseline: int
    neither: int
    success_difference: float | None
    """Candidate success rate minus the baseline's, over the pairs."""
    success_interval: tuple[float, float] | None
    mcnemar_p: float | None
    score_difference: float | None
    score_interval: tuple[float, float] | None
    score_p: float | None
    verdict: Verdict
    episodes_needed: int | None
    """Paired episodes that a success difference of ``min_effect`` would need for 80% power."""
    min_effect: float
    alpha: float

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data


def pair_rows(
    candidate: Sequence[GradeRow], baseline: Sequence[GradeRow]
) -> tuple[list[tuple[GradeRow, GradeRow]], int]:
    """The answered episodes both sides share, in a stable order, and how many were left out."""
    theirs = _by_episode(baseline, "baseline")
    mine = _by_episode(candidate, "candidate")
    shared = sorted(set(mine) & set(theirs))
    pairs = [
        (mine[key], theirs[key])
        for key in shared
        if mine[key].status is not EpisodeStatus.ERRORED and theirs[key].status is not EpisodeStatus.ERRORED
    ]
    left_out = len(set(mine) | set(theirs)) - len(pairs)
    return pairs, left_out


def _by_episode(rows: Sequence[GradeRow], side: str) -> dict[EpisodeId, GradeRow]:
    """Each row under its episode; two rows of one episode (two checkpoints or runs mixed) are refused."""
    keyed: dict[EpisodeId, GradeRow] = {}
    for row in rows:
        key = episode_id(row)
        if key in keyed:
            raise HudPipelinesError(
                f"the {side} holds two rows of one episode (task {row.task!r}, instance {row.instance}, slot "
                f"{row.slot}, seed {row.seed}): one side of a comparison must be one result set, not several"
            )
        keyed[key] = row
    return keyed


def compare(
    candidate: Sequence[GradeRow],
    baseline: Sequence[GradeRow],
    *,
    alpha: float = 0.05,
    min_effect: float = 0.1,
) -> PairedComparison:
    """Compare ``candidate`` with ``baseline`` on the episodes they share (see the module docstring)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < min_effect <= 1:
        raise ValueError(f"min_effect must be in (0, 1], got {min_effect}")
    pairs, left_out = pair_rows(candidate, baseline)
    mine = np.array([a.success for a, _ in pairs], dtype=np.bool_)
    theirs = np.array([b.success for _, b in pairs], dtype=np.bool_)
    only_candidate = int((mine & ~theirs).sum())
    only_baseline = int((~mine & theirs).sum())
    both = int((mine & theirs).sum())
    n = len(pairs)
    if n == 0:
        return PairedComparison(
            0, left_out, 0, 0, 0, 0, None, None, None, None, None, None, Verdict.NO_DIFFERENCE, None, min_effect, alpha
        )
    scores = np.array([a.score - b.score for a, b in pairs], dtype=np.float64)
    success_diff = (only_candidate - only_baseline) / n
    p_success = mcnemar_exact(only_candidate, only_baseline)
    success_ci = paired_difference_interval(only_candidate, only_baseline, n, alpha)
    if all(a.score == float(a.success) and b.score == float(b.success) for a, b in pairs):
        score_ci, score_p = success_ci, p_success  # the score is the success: the same exact statistics
    else:
        score_p, score_ci = sign_flip_test(scores, alpha)
    verdict = Verdict.NO_DIFFERENCE
    if p_success < alpha:
        verdict = Verdict.BETTER if success_diff > 0 else Verdict.WORSE
    return PairedComparison(
        pairs=n,
        unpaired=left_out,
        both_succeeded=both,
        only_candidate=only_candidate,
        only_baseline=only_baseline,
        neither=n - both - only_candidate - only_baseline,
        success_difference=success_diff,
        success_interval=success_ci,
        mcnemar_p=p_success,
        score_difference=float(scores.mean()),
        score_interval=score_ci,
        score_p=score_p,
        verdict=verdict,
        episodes_needed=mcnemar_sample_size((only_candidate + only_baseline) / n, min_effect, alpha),
        min_effect=min_effect,
        alpha=alpha,
    )


@dataclass(frozen=True)
class ErrorsAgainst:
    """Episodes that errored on one side only, and the comparison had each gone against the candidate."""

    here: int
    """Errored in the candidate, answered in the baseline (had they gone against it: failed)."""
    there: int
    """Errored in the baseline, answered in the candidate (had they gone against it: succeeded there)."""
    worst: PairedComparison

    def drop(self) -> float:
        return -(self.worst.success_difference or 0.0)

    def describe(self, candidate: str = "the candidate") -> str:
        return (
            f"{self.here + self.there} episode(s) errored on one side only ({self.here} in {candidate}, "
            f"{self.there} in the baseline); had they gone against {candidate}, success {-self.drop():+.1%} "
            f"(McNemar p = {self.worst.mcnemar_p:.3g}) over {paired_episodes(self.worst.pairs)}"
        )


def errors_against(
    candidate: Sequence[GradeRow], baseline: Sequence[GradeRow], *, alpha: float, min_effect: float
) -> ErrorsAgainst | None:
    """What the episodes that errored on one side only could make of the comparison (``None``: there are none).
    An episode errored on both sides says nothing of the difference, as one both failed. Errors are not
    failures, nor do they carry a pass: a gate that passes only because they were left out is undecided."""
    mine = {episode_id(row): row for row in candidate}
    theirs = {episode_id(row): row for row in baseline}
    shared = mine.keys() & theirs.keys()
    here = {key for key in shared if errored_in_a_run(mine[key]) and theirs[key].status is not EpisodeStatus.ERRORED}
    there = {key for key in shared if errored_in_a_run(theirs[key]) and mine[key].status is not EpisodeStatus.ERRORED}
    if not here and not there:
        return None
    failed = {"status": EpisodeStatus.FAILED, "success": False, "fault": None, "error": None}
    succeeded = {"status": EpisodeStatus.SUCCEEDED, "success": True, "fault": None, "error": None}
    worst_rows = [replace(r, **failed) if episode_id(r) in here else r for r in candidate]
    worst_baseline = [replace(r, **succeeded) if episode_id(r) in there else r for r in baseline]
    worst = compare(worst_rows, worst_baseline, alpha=alpha, min_effect=min_effect)
    return ErrorsAgainst(len(here), len(there), worst)


def unpaired_cause(candidate: Sequence[GradeRow], baseline: Sequence[GradeRow]) -> str:
    """Why no episode pairs up: one side's rows are all of a configuration since changed (``not_run``: they pair
    with nothing), said with their reason; or all errored (an error is no answer to pair), said with the first
    error; else, most likely, other tasks or seeds."""
    for whose, rows in (("this eval's", candidate), ("the baseline's", baseline)):
        if rows and all(row.fault is Fault.NOT_RUN for row in rows):
            return f"{whose} rows have no current result, e.g. {_stale_reason(rows[0])}"
        errored = [row for row in rows if errored_in_a_run(row)]
        if errored and all(row.status is EpisodeStatus.ERRORED for row in rows):
            return f"{whose} episodes all errored ({len(errored)} in a run), e.g. {one_line(errored[0].error or '')}"
    return "same tasks and seeds?"


def _stale_reason(row: GradeRow) -> str:
    """Why a ``not_run`` row has no current result, without the command (one run of the pipeline runs them all)."""
    return one_line(row.error or "not run").split("; run it with: ")[0]


def errored_in_a_run(row: GradeRow) -> bool:
    """Errored in a run (an instance not run yet is no answer of any run)."""
    return row.status is EpisodeStatus.ERRORED and row.fault is not Fault.NOT_RUN


def episode_id(row: GradeRow) -> EpisodeId:
    """The episode a row answers: its task and seed, the same whatever ``num_envs`` the eval ran with
    (slot ``j`` of instance ``i`` gets ``seed + i * num_envs + j``)."""
    if row.seed is not None:
        return (row.task, row.seed, -1, -1)
    return (row.task, -1, row.instance, row.slot)


# -- the command ----------------------------------------------------------------------------------------


def run_compare(args: argparse.Namespace, judge: Judge | None = None) -> int:
    """``hud-pipelines compare CANDIDATE BASELINE``: the comparison, and exit 1 with ``--fail-if-worse``.

    A side that names a pipeline is judged by ``judge`` as ``report`` judges it (:func:`read_result_set`)."""
    outputs: Path | None = args.outputs
    candidate = read_result_set(args.candidate, outputs_root=outputs, checkpoint=args.candidate_checkpoint, judge=judge)
    baseline = read_result_set(args.baseline, outputs_root=outputs, checkpoint=args.baseline_checkpoint, judge=judge)
    result = compare(candidate.rows, baseline.rows, alpha=args.alpha, min_effect=args.min_effect)
    for where in dict.fromkeys(side.where for side in (candidate, baseline) if side.unjudged):  # once a name
        print(
            f"note: no pipeline file named {where} loads here (./pipelines or $HUD_PIPELINES_DIR): its "
            "grades are read as its last run wrote them, not judged against the code as it is now",
            file=sys.stderr,
        )
    for where in dict.fromkeys(side.where for side in (candidate, baseline) if side.folder):
        print(
            f"note: the folder {where} is read as its last run wrote it; give its pipeline's name to judge it against "
            "the code, weights and configuration as they are now, as `report` does",
            file=sys.stderr,
        )
    for side in (candidate, baseline):
        stale = [row for row in side.rows if row.fault is Fault.NOT_RUN]
        if stale:
            instances = len({row.group_id for row in stale})
            why = _stale_reason(stale[0])  # the first
            print(
                f"note: {len(stale)} of {len(side.rows)} episode(s) of {side.name} ({instances} instance(s)) have no "
                f"current result and pair with nothing, e.g. {why}; run the pipeline again to compare them",
                file=sys.stderr,
            )
    pipelines = [sorted({row.pipeline for row in side.rows}) for side in (candidate, baseline)]
    if pipelines[0] != pipelines[1]:
        mine, theirs = (", ".join(names) or "no pipeline" for names in pipelines)
        print(
            f"note: the two sides hold results of other pipelines (candidate {candidate.name}: {mine}; baseline "
            f"{baseline.name}: {theirs}): their episodes pair up by task name and seed alone, whatever their sims "
            "and graders",
            file=sys.stderr,
        )
    for name in SETTINGS:
        mine, theirs = candidate.settings.get(name), baseline.settings.get(name)
        if mine and theirs and mine != theirs:
            print(
                f"note: {candidate.name} ran with {name} {' or '.join(mine)} and {baseline.name} with "
                f"{' or '.join(theirs)}: their episodes pair up by task and seed, but were run or scored otherwise",
                file=sys.stderr,
            )
    errors = errors_against(candidate.rows, baseline.rows, alpha=args.alpha, min_effect=args.min_effect)
    undecided = result.verdict is not Verdict.WORSE and errors is not None and errors.worst.verdict is Verdict.WORSE
    if args.json:
        sides = {"candidate": candidate.name, "baseline": baseline.name}
        print(json.dumps({**sides, **result.as_dict(), "undecided_by_errors": undecided}, indent=1))
    else:
        print(describe(result, candidate.name, baseline.name))
    if undecided and errors is not None:  # errors are not failures, nor do they carry a pass: no_regression's rule
        print(f"undecided: {errors.describe()} would be worse", file=sys.stderr if args.json else sys.stdout)
        if args.fail_if_worse:
            return 1
    if args.fail_if_worse and result.pairs == 0:  # a gate never passes on nothing, as no_regression does not
        print(
            f"--fail-if-worse: no episode of {candidate.name} pairs up with one of {baseline.name} "
            f"({unpaired_cause(candidate.rows, baseline.rows)}): nothing to judge",
            file=sys.stderr,
        )
        return 1
    return 1 if args.fail_if_worse and result.verdict is Verdict.WORSE else 0


def confidence_label(alpha: float) -> str:
    """``95%`` for ``alpha = 0.05``, ``99.9%`` for 0.001: the level as people write it, never rounded to 100%."""
    return f"{100 * (1 - alpha):.10g}%"


def paired_episodes(count: int) -> str:
    """``1 paired episode``, ``3 paired episodes``."""
    return f"{count} paired episode{'' if count == 1 else 's'}"


def describe(result: PairedComparison, candidate: str, baseline: str) -> str:
    """The comparison in a few lines for a terminal."""
    if result.pairs == 0:
        return f"{candidate} vs {baseline}: no paired episodes ({result.unpaired} left out)"
    low, high = result.success_interval or (math.nan, math.nan)
    lines = [
        f"{candidate} vs {baseline}: {result.verdict.value} (McNemar exact p = {result.mcnemar_p:.3g})",
        f"  {paired_episodes(result.pairs)} ({result.unpaired} left out): both succeeded {result.both_succeeded}, "
        f"only the candidate {result.only_candidate}, only the baseline {result.only_baseline}, "
        f"neither {result.neither}",
        f"  success difference {result.success_difference:+.1%} ({confidence_label(result.alpha)} CI {low:+.1%} to "
        f"{high:+.1%})",
    ]
    if result.score_difference is not None:
        p = f"p = {result.score_p:.3g}"
        interval = (
            f"{confidence_label(result.alpha)} CI {result.score_interval[0]:+.3g} to {result.score_interval[1]:+.3g}"
            if result.score_interval is not None
            else f"too few pairs for a {confidence_label(result.alpha)} interval"
        )
        lines.append(f"  mean score difference {result.score_difference:+.3g} ({interval}, {p})")
    if result.verdict is Verdict.NO_DIFFERENCE and result.episodes_needed is not None:
        answer = "no difference detected" if result.pairs >= result.episodes_needed else "inconclusive"
        lines.append(
            f"  {answer}: about {paired_episodes(result.episodes_needed)} would detect a "
            f"{result.min_effect:.0%} difference at 80% power"
        )
    return "\n".join(lines)
