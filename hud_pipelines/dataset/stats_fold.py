"""A dataset's stats folded from its per-episode stats, episode after episode, as lerobot's writer folds them.

lerobot's ``save_episode`` folds each new episode into the dataset's stats with
``aggregate_stats([stats, episode])``. Called once per episode on a merged dataset that costs about
1-3 ms an episode (it stacks, checks and rebuilds dicts for two entries); this is the same
arithmetic on the two entries directly, for all features at once, so the result is the same to the
last bit (``tests/dataset/test_dataset_stats_fold.py`` checks it against lerobot's) at a fraction of
the cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from hud_pipelines.dataset.lerobot_api import Stats

Array = np.ndarray[Any, Any]


def fold_in_order(columns: Mapping[str, Mapping[str, Array]], rows: Iterable[int]) -> Stats:
    """The stats of the episodes ``rows``, folded in that order. ``columns[feature][stat]`` holds every episode's
    values of one stat, shape ``(episodes, *shape)`` (``count``: ``(episodes, 1)``).

    Features with the same stats (names and types) are folded together, their values side by side in one
    row per episode with each value's own count beside it: every value is still computed on its own, by the
    same operations, and a dozen array operations an episode serve all features at once."""
    rows = list(rows)
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for feature, stats in columns.items():
        groups.setdefault(tuple((stat, values.dtype.str) for stat, values in stats.items()), []).append(feature)
    folded: Stats = {}
    for features in groups.values():
        packed = _Packed(columns, features)
        total: dict[str, Array] | None = None
        for row in rows:
            episode = packed.row(row)
            total = episode if total is None else _pair(total, episode)
        if total is not None:
            folded.update(packed.unpack(total))
    return folded


class _Packed:
    """Some features' per-episode stats side by side: one ``(episodes, values)`` array per stat."""

    def __init__(self, columns: Mapping[str, Mapping[str, Array]], features: list[str]) -> None:
        first = columns[features[0]]
        episodes = len(first["count"])
        self._features = features
        self._shapes: list[tuple[int, ...]] = [columns[feature]["mean"].shape[1:] for feature in features]
        sizes = [int(np.prod(shape)) for shape in self._shapes]
        self._ends: list[int] = np.cumsum(sizes).tolist()
        counts = [
            np.repeat(columns[f]["count"].reshape(episodes, -1)[:, :1], n, axis=1)
            for f, n in zip(features, sizes, strict=True)
        ]
        self._stats = {  # in the columns' order: one episode's stats are its own, as lerobot's fold keeps them
            stat: np.concatenate(counts, axis=1)
            if stat == "count"
            else np.concatenate([columns[feature][stat].reshape(episodes, -1) for feature in features], axis=1)
            for stat in first
        }

    def row(self, row: int) -> dict[str, Array]:
        return {stat: values[row] for stat, values in self._stats.items()}

    def unpack(self, total: dict[str, Array]) -> Stats:
        """Each feature's stats, shaped and ordered as lerobot's fold gives them (``count`` of shape ``(1,)``)."""
        unpacked: Stats = {}
        for feature, shape, start, end in zip(
            self._features, self._shapes, [0, *self._ends[:-1]], self._ends, strict=True
        ):
            unpacked[feature] = {
                stat: values[start : start + 1] if stat == "count" else values[start:end].reshape(shape)
                for stat, values in total.items()
            }
        return unpacked


def _pair(first: dict[str, Array], second: dict[str, Array]) -> dict[str, Array]:
    """``aggregate_feature_stats([first, second])``: a sum over two stacked rows is the two rows added."""
    first_count, second_count = first["count"], second["count"]
    total = first_count + second_count
    mean = (first["mean"] * first_count + second["mean"] * second_count) / total
    first_spread = (first["std"] ** 2 + (first["mean"] - mean) ** 2) * first_count
    second_spread = (second["std"] ** 2 + (second["mean"] - mean) ** 2) * second_count
    folded = {
        "min": np.minimum(first["min"], second["min"]),
        "max": np.maximum(first["max"], second["max"]),
        "mean": mean,
        "std": np.sqrt((first_spread + second_spread) / total),
        "count": total,
    }
    for stat in first:
        if stat[:1] == "q" and stat[1:].isdigit() and stat in second:
            folded[stat] = (first[stat] * first_count + second[stat] * second_count) / total
    return folded
