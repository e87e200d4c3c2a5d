"""The paired tests behind every comparison, on counts and differences alone (no rows, no files).

McNemar's exact test and the episodes it needs, the exact interval of a paired success difference
that agrees with it, Clopper-Pearson intervals, and the paired sign-flip test of a mean score
difference with the interval that inverts it. :mod:`hud_pipelines.eval.comparison` says what they
mean for two result sets; every random draw here comes from a fixed seed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 4000
BOOTSTRAP_SEED = 20261201
EXACT_FLIPS_UP_TO = 12
"""Nonzero differences up to which the sign-flip test enumerates every flip (4,096); above, it draws
BOOTSTRAP_SAMPLES."""
EXACT_FLIP_CELLS = 1 << 16
"""The most (flip, tie count) cells an exact test enumerates: ``2^k x (m + 1)`` for ``k`` nonzero differences and
``m`` zeros (4,096 flips beside 15 zeros, 16 beside 4,095); its interval scans them some 120 times."""
Floats = np.ndarray[Any, np.dtype[np.float64]]
Z_80_POWER = NormalDist().inv_cdf(0.8)
"""The standard normal quantile for 80% power."""


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
    ``psi`` its own, and ``d`` ranges over both. ``d`` is also at most the share of pairs only the
    candidate won, and at least minus the baseline's: each bound is kept within that share's
    Clopper-Pearson bound, so one more pair lost never raises the upper bound (without it, 0 of 1
    discordant pairs in 16 read up to +28.7%, where none read +20.6%). The cap never crosses zero, so
    the agreement with the test stands. It is conservative: its exact coverage at ``alpha = 0.05``, over
    8 to 80 pairs and shares of each side's wins from 0 to 60%, is at least 95.0%, lowest where every
    pair is discordant (96% or more where a tenth of the pairs agree); the cap leaves that minimum as it
    was. ``won`` and ``lost`` are the discordant pairs only the candidate, or only the baseline,
    succeeded in.
    """
    discordant = won + lost
    psi_low, psi_high = clopper_pearson(discordant, pairs, alpha)
    pi_low, pi_high = clopper_pearson(won, discordant, alpha) if discordant else (0.0, 1.0)
    low, high = 2 * pi_low - 1, 2 * pi_high - 1
    bounds = (psi_high if low < 0 else psi_low) * low, (psi_high if high > 0 else psi_low) * high
    won_share, lost_share = clopper_pearson(won, pairs, alpha)[1], clopper_pearson(lost, pairs, alpha)[1]
    return _zeroed(max(bounds[0], -lost_share)), _zeroed(min(bounds[1], won_share))


def _zeroed(bound: float, tolerance: float = 1e-12) -> float:
    """A bound within bisection noise of zero is zero: whether it excludes zero is the test's verdict."""
    return 0.0 if abs(bound) < tolerance else bound


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
    each p-value of the interval's search costs one pass over the flips, whatever the number of pairs. The
    pairs are taken in sorted order, so that a drawn test (many pairs) does not depend on the order of the rows.
    """
    differences = np.sort(differences)
    flipped, sign_sums, weights = _flip_sums(differences)
    total, n = float(differences.sum()), differences.size

    def p_value(shift: float) -> float:
        observed = abs(total - shift * n) * (1 - 1e-9)  # the tolerance keeps the observed flip and its ties in
        as_extreme = np.abs(flipped - shift * sign_sums) >= observed
        if weights is not None:
            return min(1.0, float(weights[as_extreme].sum()))
        return (int(np.count_nonzero(as_extreme)) + 1) / (flipped.size + 1)

    mean, spread = float(differences.mean()), float(np.ptp(differences)) + abs(float(differences.mean())) + 1.0
    far_low, far_high = mean - 4 * spread, mean + 4 * spread  # every difference one sign: the smallest p
    p = p_value(0.0)
    if p_value(far_low) >= alpha or p_value(far_high) >= alpha:
        return p, None
    scale = float(np.abs(differences).max())
    low, high = _crossing(p_value, far_low, mean, alpha), _crossing(p_value, far_high, mean, alpha)
    return p, (_zeroed(low, 1e-8 * scale), _zeroed(high, 1e-8 * scale))  # within the ties' tolerance of zero: zero


def _flip_sums(differences: Floats) -> tuple[Floats, Floats, Floats | None]:
    """Each flip's signed sum of ``differences`` and its sum of signs, and each flip's probability where they are
    exact (``None`` where BOOTSTRAP_SAMPLES flips were drawn from a fixed seed, a block at a time: memory stays small).

    Exact where the nonzero differences are few (up to EXACT_FLIPS_UP_TO), however many ties there are: a zero
    difference's flip only adds its sign to the sign sum, so the ``m`` zeros enter as the ``m + 1`` values their
    signs can sum to, each with its binomial probability, beside every flip of the nonzero ones.
    """
    nonzero = differences[differences != 0]
    k, m = nonzero.size, differences.size - nonzero.size
    if k <= EXACT_FLIPS_UP_TO and (2**k) * (m + 1) <= EXACT_FLIP_CELLS:
        flips: np.ndarray[Any, np.dtype[np.int64]] = np.arange(2**k, dtype=np.int64).reshape(-1, 1)
        signs = (1 - 2 * (np.right_shift(flips, np.arange(k, dtype=np.int64)) & 1)).astype(np.float64)
        ties = np.arange(m + 1)  # how many zeros flip to -1
        tie_chance = _binomial_halves(m)
        flipped = np.repeat(signs @ nonzero, m + 1)
        sign_sums = (signs.sum(axis=1)[:, None] + (m - 2 * ties)[None, :]).ravel()
        return flipped, sign_sums, np.tile(tie_chance / 2**k, 2**k)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = differences.size
    rows = max(1, (1 << 20) // n)
    flipped, sign_sums = np.empty(BOOTSTRAP_SAMPLES), np.empty(BOOTSTRAP_SAMPLES)
    for start in range(0, BOOTSTRAP_SAMPLES, rows):
        block = rng.choice([-1.0, 1.0], size=(min(rows, BOOTSTRAP_SAMPLES - start), n))
        flipped[start : start + len(block)] = block @ differences
        sign_sums[start : start + len(block)] = block.sum(axis=1)
    return flipped, sign_sums, None


def _binomial_halves(m: int) -> Floats:
    """``C(m, t) / 2^m`` for ``t = 0 .. m``, each a correctly rounded quotient of integers: exact where it can be (a
    few ties: a p-value equal to alpha stays equal to it, where log-space sums missed it by an ulp)."""
    whole, count, chances = 2**m, 1, [1 / 2**m]
    for t in range(m):
        count = count * (m - t) // (t + 1)
        chances.append(count / whole)
    return np.array(chances, dtype=np.float64)


def _crossing(p_value: Callable[[float], float], rejected: float, kept: float, alpha: float) -> float:
    """Where ``p_value`` reaches ``alpha`` between a shift it rejects and one it keeps (bisection)."""
    for _ in range(60):
        middle = (rejected + kept) / 2
        if p_value(middle) < alpha:
            rejected = middle
        else:
            kept = middle
    return kept
