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
import functools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.result_sets import SETTINGS, read_result_set
from hud_pipelines.recording.events import EpisodeStatus

BOOTSTRAP_SAMPLES = 4000
BOOTSTRAP_SEED = 20261201
EXACT_FLIPS_UP_TO = 12
"""Pairs up to which the sign-flip test enumerates every flip (4,096); above, it draws BOOTSTRAP_SAMPLES."""
Z_80_POWER = NormalDist().inv_cdf(0.8)
"""The standard normal quantile for 80% power."""

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


def mcnemar_exact(only_candidate: int, only_baseline: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs against one half."""
    discordant = only_candidate + only_baseline
    if discordant == 0:
        return 1.0
    fewer = min(only_candidate, only_baseline)
    tail = sum(math.comb(discordant, k) for k in range(fewer + 1)) / 2**discordant
    return min(1.0, 2 * tail)


def mcnemar_sample_size(discordance: float, effect: float, alpha: float, *, power_z: float = Z_80_POWER) -> int:
    """Paired episodes needed to detect a success difference ``effect`` (Connor, 1987).

    ``discordance`` is the expected share of discordant pairs; it is at least ``effect`` (a difference
    needs that many discordant pairs) and is taken as such when the data show less.
    """
    psi = max(discordance, effect)
    z_alpha = NormalDist().inv_cdf(1 - alpha / 2)
    needed = (z_alpha * math.sqrt(psi) + power_z * math.sqrt(psi - effect**2)) ** 2 / effect**2
    return math.ceil(needed)


def paired_difference_interval(won: int, lost: int, pairs: int, alpha: float) -> tuple[float, float]:
    """An exact ``1 - alpha`` interval of the paired success difference, coherent with McNemar's exact test.

    The difference is ``d = psi * (2 * pi - 1)``: ``psi`` the share of discordant pairs, ``pi`` the
    share of them the candidate won. ``pi`` gets the Clopper-Pearson interval that McNemar's exact
    test inverts (so the interval excludes zero exactly when the test's p-value is below ``alpha``;
    at ``alpha`` itself a bound touches zero),
    ``psi`` its own, and ``d`` ranges over both. It is conservative: in simulations over 8 to 200 pairs
    and discordance 0 to 100% it covered the true difference 95.8-100% of the time at ``alpha = 0.05``.
    ``won`` and ``lost`` are the discordant pairs only the candidate, or only the baseline, succeeded in.
    """
    discordant = won + lost
    psi_low, psi_high = clopper_pearson(discordant, pairs, alpha)
    pi_low, pi_high = clopper_pearson(won, discordant, alpha) if discordant else (0.0, 1.0)
    low, high = 2 * pi_low - 1, 2 * pi_high - 1
    bounds = (psi_high if low < 0 else psi_low) * low, (psi_high if high > 0 else psi_low) * high
    return _zeroed(bounds[0]), _zeroed(bounds[1])


def _zeroed(bound: float) -> float:
    """A bound within bisection noise of zero is zero: whether it excludes zero is the test's verdict."""
    return 0.0 if abs(bound) < 1e-12 else bound


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``1 - alpha`` interval of a binomial proportion, by bisection on the tails."""
    if trials == 0:
        return 0.0, 1.0
    low = 0.0 if successes == 0 else _bisect(lambda p: _upper_tail(successes, trials, p) - alpha / 2)
    high = 1.0 if successes == trials else _bisect(lambda p: alpha / 2 - _lower_tail(successes, trials, p))
    return low, high


def _lower_tail(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``."""
    return _tail(np.arange(k + 1), n, p)


def _upper_tail(k: int, n: int, p: float) -> float:
    """``P(X >= k)``, summed itself (``1 - P(X < k)`` loses the digits a small ``alpha`` needs)."""
    return _tail(np.arange(k, n + 1), n, p)


def _tail(i: np.ndarray[Any, np.dtype[np.int64]], n: int, p: float) -> float:
    """The binomial probabilities of the counts ``i``, summed in log space (no overflow for large ``n``)."""
    log_factorial = _log_factorials(n)
    log_choose = log_factorial[n] - log_factorial[i] - log_factorial[n - i]
    return float(np.exp(log_choose + i * math.log(p) + (n - i) * math.log1p(-p)).sum())


@functools.lru_cache(maxsize=64)
def _log_factorials(n: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """``log(k!)`` for ``k = 0 .. n`` (a bisection asks for the same ``n`` sixty times)."""
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))


def _bisect(increasing: Callable[[float], float]) -> float:
    """The root in (0, 1) of a function that increases from negative to positive."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if increasing(middle) < 0:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def sign_flip_test(
    differences: np.ndarray[Any, np.dtype[np.float64]], alpha: float
) -> tuple[float, tuple[float, float] | None]:
    """The paired sign-flip test of a zero mean difference: its two-sided p-value, and the interval of
    the shifts it does not reject at ``alpha`` (``None`` where it can reject none: too few pairs).

    A flip's sum of shifted differences is ``flipped_sum - shift * sign_sum``: both are computed once, so
    each p-value of the interval's search costs one pass over the flips, whatever the number of pairs.
    """
    flipped, sign_sums, exact = _flip_sums(differences)
    total, n = float(differences.sum()), differences.size

    def p_value(shift: float) -> float:
        observed = abs(total - shift * n) * (1 - 1e-9)  # the tolerance keeps the observed flip and its ties in
        as_extreme = int(np.count_nonzero(np.abs(flipped - shift * sign_sums) >= observed))
        return as_extreme / flipped.size if exact else (as_extreme + 1) / (flipped.size + 1)

    mean, spread = float(differences.mean()), float(np.ptp(differences)) + abs(float(differences.mean())) + 1.0
    far_low, far_high = mean - 4 * spread, mean + 4 * spread  # every difference one sign: the smallest p
    p = p_value(0.0)
    if p_value(far_low) >= alpha or p_value(far_high) >= alpha:
        return p, None
    return p, (_crossing(p_value, far_low, mean, alpha), _crossing(p_value, far_high, mean, alpha))


def _flip_sums(
    differences: np.ndarray[Any, np.dtype[np.float64]],
) -> tuple[np.ndarray[Any, np.dtype[np.float64]], np.ndarray[Any, np.dtype[np.float64]], bool]:
    """Each flip's signed sum of ``differences`` and its sum of signs, and whether the flips are every one of
    the ``2^n`` (else BOOTSTRAP_SAMPLES drawn from a fixed seed, a block at a time: memory stays small)."""
    n = differences.size
    if n <= EXACT_FLIPS_UP_TO:
        flips: np.ndarray[Any, np.dtype[np.int64]] = np.arange(2**n, dtype=np.int64).reshape(-1, 1)
        signs = (1 - 2 * (np.right_shift(flips, np.arange(n, dtype=np.int64)) & 1)).astype(np.float64)
        return signs @ differences, signs.sum(axis=1), True
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    rows = max(1, (1 << 20) // n)
    flipped, sign_sums = np.empty(BOOTSTRAP_SAMPLES), np.empty(BOOTSTRAP_SAMPLES)
    for start in range(0, BOOTSTRAP_SAMPLES, rows):
        block = rng.choice([-1.0, 1.0], size=(min(rows, BOOTSTRAP_SAMPLES - start), n))
        flipped[start : start + len(block)] = block @ differences
        sign_sums[start : start + len(block)] = block.sum(axis=1)
    return flipped, sign_sums, False


def _crossing(p_value: Callable[[float], float], rejected: float, kept: float, alpha: float) -> float:
    """Where ``p_value`` reaches ``alpha`` between a shift it rejects and one it keeps (bisection)."""
    for _ in range(60):
        middle = (rejected + kept) / 2
        if p_value(middle) < alpha:
            rejected = middle
        else:
            kept = middle
    return kept


def episode_id(row: GradeRow) -> EpisodeId:
    """The episode a row answers: its task and seed, the same whatever ``num_envs`` the eval ran with
    (slot ``j`` of instance ``i`` gets ``seed + i * num_envs + j``)."""
    if row.seed is not None:
        return (row.task, row.seed, -1, -1)
    return (row.task, -1, row.instance, row.slot)


# -- the command ----------------------------------------------------------------------------------------


def run_compare(args: argparse.Namespace) -> int:
    """``hud-pipelines compare CANDIDATE BASELINE``: the comparison, and exit 1 with ``--fail-if-worse``."""
    outputs: Path | None = args.outputs
    candidate = read_result_set(args.candidate, outputs_root=outputs, checkpoint=args.candidate_checkpoint)
    baseline = read_result_set(args.baseline, outputs_root=outputs, checkpoint=args.baseline_checkpoint)
    result = compare(candidate.rows, baseline.rows, alpha=args.alpha, min_effect=args.min_effect)
    pipelines = [sorted({row.pipeline for row in side.rows}) for side in (candidate, baseline)]
    if pipelines[0] != pipelines[1]:
        mine, theirs = (", ".join(names) or "no pipeline" for names in pipelines)
        print(
            f"note: {candidate.name} holds results of {mine} and {baseline.name} of {theirs}: their episodes "
            "pair up by task name and seed alone, whatever their sims and graders",
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
    if args.json:
        sides = {"candidate": candidate.name, "baseline": baseline.name}
        print(json.dumps({**sides, **result.as_dict()}, indent=1))
    else:
        print(describe(result, candidate.name, baseline.name))
    if args.fail_if_worse and result.pairs == 0:  # a gate never passes on nothing, as no_regression does not
        print(
            f"--fail-if-worse: no episode of {candidate.name} pairs up with one of {baseline.name} "
            "(same tasks and seeds?): nothing to judge",
            file=sys.stderr,
        )
        return 1
    return 1 if args.fail_if_worse and result.verdict is Verdict.WORSE else 0


def confidence_label(alpha: float) -> str:
    """``95%`` for ``alpha = 0.05``, ``99.9%`` for 0.001: the level as people write it, never rounded to 100%."""
    return f"{100 * (1 - alpha):.10g}%"


def describe(result: PairedComparison, candidate: str, baseline: str) -> str:
    """The comparison in a few lines for a terminal."""
    if result.pairs == 0:
        return f"{candidate} vs {baseline}: no paired episodes ({result.unpaired} left out)"
    low, high = result.success_interval or (math.nan, math.nan)
    lines = [
        f"{candidate} vs {baseline}: {result.verdict.value} (McNemar exact p = {result.mcnemar_p:.3g})",
        f"  {result.pairs} paired episodes ({result.unpaired} left out): both succeeded {result.both_succeeded}, "
        f"only the candidate {result.only_candidate}, only the baseline {result.only_baseline}, "
        f"neither {result.neither}",
        f"  success difference {result.success_difference:+.1%} ({confidence_label(result.alpha)} CI {low:+.1%} to "
        f"{high:+.1%})",
    ]
    if result.score_difference is not None:
        p = f"p = {result.score_p:.3g}"
        interval = (
            f"CI {result.score_interval[0]:+.3g} to {result.score_interval[1]:+.3g}"
            if result.score_interval is not None
            else f"too few pairs for a {confidence_label(result.alpha)} interval"
        )
        lines.append(f"  mean score difference {result.score_difference:+.3g} ({interval}, {p})")
    if result.verdict is Verdict.NO_DIFFERENCE and result.episodes_needed is not None:
        lines.append(
            f"  inconclusive: about {result.episodes_needed} paired episodes would detect a "
            f"{result.min_effect:.0%} difference at 80% power"
        )
    return "\n".join(lines)
