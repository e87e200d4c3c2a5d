"""What a Dagster asset shows about a published dataset: counts, size, features, stats, first frames.

Reading goes through lerobot (``LeRobotDataset(repo_id, root=...)``), so a summary that builds is
also proof that the published dataset loads. The thumbnail strip decodes the first frame of the
first episodes of every camera: one row per camera, one column per episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from hud_pipelines.dataset.lerobot_api import features_of, stats_of
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.dataset.writer import default_repo_id
from hud_pipelines.recording.thumbnails import as_uint8_rgb, markdown_image, strip_png

_MAX_DIMS = 6
"""Stats of wider vectors are cut after this many dimensions (metadata lives in the event log)."""


@dataclass(frozen=True)
class FeatureRow:
    key: str
    dtype: str
    shape: str
    names: str


@dataclass(frozen=True)
class StatRow:
    key: str
    min: str
    max: str
    mean: str
    std: str


@dataclass(frozen=True)
class DatasetSummary:
    path: Path
    repo_id: str
    episodes: int
    frames: int
    fps: int
    robot_type: str
    tasks: int
    size_bytes: int
    features: list[FeatureRow]
    stats: list[StatRow]
    success_rate: float | None
    """Share of the answered episodes graded successful, from ``meta/hud_episodes.jsonl`` (``None`` without it, or
    when every episode errored): an errored episode kept in the dataset is no failure."""
    thumbnail_png: bytes | None = field(default=None, repr=False)

    def dagster_metadata(self) -> dict[str, Any]:
        """The summary as ``MaterializeResult(metadata=...)`` values."""
        import dagster as dg

        features = dg.MetadataValue.table(
            records=[dg.TableRecord(vars(row)) for row in self.features],
            schema=dg.TableSchema(columns=[dg.TableColumn(name) for name in ("key", "dtype", "shape", "names")]),
        )
        stats = dg.MetadataValue.table(
            records=[dg.TableRecord(vars(row)) for row in self.stats],
            schema=dg.TableSchema(columns=[dg.TableColumn(name) for name in ("key", "min", "max", "mean", "std")]),
        )
        metadata: dict[str, Any] = {
            "path": dg.MetadataValue.path(str(self.path)),
            "repo_id": self.repo_id,
            "episodes": self.episodes,
            "frames": self.frames,
            "fps": self.fps,
            "size_mb": round(self.size_bytes / 2**20, 3),
            "features": features,
            "stats": stats,
        }
        if self.success_rate is not None:
            metadata["success_rate"] = self.success_rate
        if self.thumbnail_png is not None:
            metadata["first_frames"] = dg.MetadataValue.md(markdown_image(self.thumbnail_png, "first frames"))
        return metadata


def summarize_dataset(
    root: Path, *, repo_id: str | None = None, thumbnail_episodes: int = 8, thumbnail_height: int = 96
) -> DatasetSummary:
    """Load the dataset at ``root`` with lerobot and summarize it."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    repo_id = repo_id or default_repo_id(root.name)
    dataset = LeRobotDataset(repo_id, root=root)
    meta = dataset.meta
    specs = features_of(meta)
    features = [
        FeatureRow(
            key=key,
            dtype=str(spec["dtype"]),
            shape=str(list(spec["shape"])),
            names=_short(spec.get("names")),
        )
        for key, spec in specs.items()
    ]
    all_stats = stats_of(meta) or {}
    cameras = set(meta.camera_keys)
    stats = [
        StatRow(
            key=key,
            min=_numbers(values["min"]),
            max=_numbers(values["max"]),
            mean=_numbers(values["mean"]),
            std=_numbers(values["std"]),
        )
        for key, values in all_stats.items()
        if key not in cameras and {"min", "max", "mean", "std"} <= set(values)
    ]
    records = read_episode_records(root)
    answered = [r for r in records if r.get("status") != "errored"]
    success_rate = sum(bool(r.get("success")) for r in answered) / len(answered) if answered else None
    return DatasetSummary(
        path=root,
        repo_id=repo_id,
        episodes=meta.total_episodes,
        frames=meta.total_frames,
        fps=meta.fps,
        robot_type=str(meta.robot_type),
        tasks=meta.total_tasks,
        size_bytes=sum(p.stat().st_size for p in root.rglob("*") if p.is_file()),
        features=features,
        stats=stats,
        success_rate=success_rate,
        thumbnail_png=_thumbnails(dataset, thumbnail_episodes, thumbnail_height),
    )


def _short(names: object) -> str:
    if not _is_sequence(names):
        return "" if names is None else str(names)
    items = [str(n) for n in names]
    return ", ".join(items[:_MAX_DIMS]) + (f", ... ({len(items)})" if len(items) > _MAX_DIMS else "")


def _is_sequence(value: object) -> TypeGuard[list[object] | tuple[object, ...]]:
    return isinstance(value, list | tuple)


def _numbers(values: object) -> str:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    text = ", ".join(f"{v:.4g}" for v in flat[:_MAX_DIMS])
    return f"[{text}{', ...' if flat.size > _MAX_DIMS else ''}]"


def _thumbnails(dataset: Any, episodes: int, height: int) -> bytes | None:
    """One PNG: a row per camera, the first frame of each of the first ``episodes`` episodes."""
    cameras: list[str] = list(dataset.meta.camera_keys)
    if not cameras or episodes < 1:
        return None
    starts = [int(i) for i in dataset.meta.episodes["dataset_from_index"][:episodes]]
    return strip_png([[as_uint8_rgb(dataset[start][camera]) for start in starts] for camera in cameras], height)
