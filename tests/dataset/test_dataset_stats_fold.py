"""The stats fold of a laid-out dataset is lerobot's writer's fold, to the last bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hud_pipelines.dataset.stats_fold import fold_in_order

SHAPES = {"observation.state": (4,), "next.reward": (1,), "index": (1,), "observation.images.front": (3, 1, 1)}
STATS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")  # meta/episodes' order


def _column(rng: np.random.Generator, stat: str, shape: tuple[int, ...], episodes: int) -> np.ndarray[Any, Any]:
    if stat == "count":
        return rng.integers(1, 500, size=(episodes, 1))
    values = rng.normal(size=(episodes, *shape)) * 10.0 ** rng.integers(-3, 6)
    return np.abs(values) if stat == "std" else values


@pytest.mark.parametrize(("seed", "counted"), [(0, 35), (1, 35), (2, 1)])
def test_the_fold_equals_lerobots_pairwise_aggregate_stats_to_the_last_bit(seed: int, counted: int) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats

    rng = np.random.default_rng(seed)
    episodes = 40
    columns = {
        feature: {stat: _column(rng, stat, shape, episodes) for stat in STATS} for feature, shape in SHAPES.items()
    }
    rows = [int(row) for row in rng.permutation(episodes)[:counted]]

    expected: dict[str, dict[str, Any]] | None = None
    for row in rows:
        one = {feature: {stat: values[row] for stat, values in stats.items()} for feature, stats in columns.items()}
        expected = one if expected is None else aggregate_stats([expected, one])
    assert expected is not None

    folded = fold_in_order(columns, rows)
    assert set(folded) == set(expected)
    for feature, stats in expected.items():
        assert list(folded[feature]) == list(stats), "the same stats in the same order (stats.json's bytes)"
        for stat, value in stats.items():
            np.testing.assert_array_equal(folded[feature][stat], value, err_msg=f"{feature} {stat}")
            assert folded[feature][stat].dtype == np.asarray(value).dtype


def test_no_counted_episode_folds_to_no_stats() -> None:
    assert fold_in_order({"index": {"mean": np.zeros((2, 1)), "count": np.ones((2, 1), np.int64)}}, []) == {}
