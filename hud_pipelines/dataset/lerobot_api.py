"""The functions of lerobot, ``datasets`` and pyarrow the dataset package calls, typed once.

These libraries annotate arrays as bare ``np.ndarray`` and leave tables untyped, which strict
type checking reads as unknown. Each function is wrapped here with the types it has at run time,
so the modules that use it stay fully typed; the tests that write and read real datasets exercise
every one. Each import happens on the first call: lerobot's takes seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy.typing as npt

Stats = dict[str, dict[str, Any]]
"""lerobot's ``stats.json`` in memory: feature -> statistic (``min``, ``mean``, ``count``...) -> array."""
FeatureStats = dict[str, npt.NDArray[Any]]
"""One feature's statistics."""


def stats_of(meta: Any) -> Stats | None:
    """The stats a ``LeRobotDatasetMetadata`` holds now (``None`` before any episode)."""
    return cast("Stats | None", meta.stats)


def features_of(meta: Any) -> dict[str, dict[str, Any]]:
    """The lerobot feature specs (``dtype``, ``shape``, ``names``...) of a ``LeRobotDatasetMetadata``."""
    return cast("dict[str, dict[str, Any]]", meta.features)


def load_stats(root: Path) -> Stats | None:
    """``stats.json`` of the dataset at ``root`` (``None`` without one)."""
    from lerobot.datasets import io_utils

    return cast("Stats | None", io_utils.load_stats(root))


def write_stats(stats: Stats, root: Path) -> None:
    from lerobot.datasets import io_utils

    io_utils.write_stats(stats, root)


def episode_stats(columns: dict[str, npt.NDArray[Any]], features: dict[str, dict[str, Any]]) -> Stats:
    """lerobot's ``compute_episode_stats`` of one episode's columns."""
    from lerobot.datasets import compute_stats

    data: dict[str, list[str] | npt.NDArray[Any]] = dict(columns)
    return cast("Stats", compute_stats.compute_episode_stats(data, features))


def sample_indices(length: int) -> list[int]:
    """The frames of an episode of ``length`` that lerobot samples for image stats."""
    from lerobot.datasets import compute_stats

    return compute_stats.sample_indices(length)


def downsample(image: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A ``(C, H, W)`` image as lerobot shrinks it before taking stats."""
    from lerobot.datasets import compute_stats

    return cast("npt.NDArray[Any]", compute_stats.auto_downsample_height_width(image))


def feature_stats(array: npt.NDArray[Any], axis: tuple[int, ...], *, keepdims: bool) -> FeatureStats:
    from lerobot.datasets import compute_stats

    return cast("FeatureStats", compute_stats.get_feature_stats(array, axis=axis, keepdims=keepdims))


def parquet_rows(path: Path) -> int:
    """The rows of a parquet file, from its footer (a file whose writer was killed has none: an error)."""
    import pyarrow.parquet as pq

    return cast(int, pq.read_metadata(path).num_rows)


def parquet_columns(files: Sequence[str], columns: Sequence[str]) -> dict[str, npt.NDArray[Any]]:
    """The named columns of several parquet files, read as one table, as numpy arrays."""
    import pyarrow.parquet as pq

    table = cast(Any, pq.ParquetDataset(list(files)).read(columns=list(columns)))
    return {name: table.column(name).to_numpy() for name in columns}


def needs_embedding(feature: Any) -> bool:
    """Whether ``datasets`` must embed this feature's storage (images held as paths) before writing."""
    from datasets.features import features

    return features.require_storage_embed(feature)


def embed_table_storage(table: Any) -> Any:
    """``datasets``' column-wise embedding of one arrow table."""
    from datasets import table as tables

    return cast(Any, tables.embed_table_storage(table))
