"""Shards -> one dataset, through lerobot's own aggregation (``lerobot.datasets.aggregate``).

A shard is a directory of parts (``part-000``...), each a complete lerobot dataset written by one
writer thread. Merging takes the parts in a stable order (by path), so episode indices of the
merged dataset follow shard name, then part, then the order episodes ended within the part. The
``hud_episodes.jsonl`` sidecars are merged with the same offsets.

Parts that hold no episode are skipped; a part that cannot be read (its writer was killed before
finalizing) is skipped with a warning and reported, never merged half-written.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hud_pipelines.dataset.part import EPISODES_SIDECAR, INFO_FILE
from hud_pipelines.dataset.writer import DatasetWriteError

logger = logging.getLogger(__name__)


class EmptyDatasetError(DatasetWriteError):
    """There is no episode to merge: nothing was recorded, or every episode was left out."""


@dataclass(frozen=True)
class MergeResult:
    root: Path
    episodes: int
    frames: int
    parts: list[Path]
    skipped: list[tuple[Path, str]] = field(default_factory=list[tuple[Path, str]])
    """Parts left out, with the reason."""


def find_parts(roots: Iterable[Path]) -> list[Path]:
    """Every dataset directory (one with ``meta/info.json``) at or below the given roots, sorted."""
    found: set[Path] = set()
    for root in roots:
        root = Path(root)
        if (root / INFO_FILE).is_file():
            found.add(root)
            continue
        if root.is_dir():
            found.update(info.parent.parent for info in root.glob(f"**/{INFO_FILE}"))
    return sorted(found)


def _episodes_in(part: Path) -> int:
    info = json.loads((part / INFO_FILE).read_text())
    return int(info.get("total_episodes", 0))


def _open_part(part: Path, repo_id: str) -> tuple[Any, str | None]:
    """The part's lerobot metadata, or why the part cannot be merged."""
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    try:
        meta = LeRobotDatasetMetadata(repo_id, root=part)
        if meta.total_episodes == 0 or meta.episodes is None or len(meta.episodes) != meta.total_episodes:
            return None, "its episode metadata is incomplete (not finalized)"
    except Exception as exc:  # a killed writer leaves parquet files without footers
        return None, f"unreadable: {exc!r}"
    return meta, None


def merge_parts(parts: Sequence[Path], dest: Path, *, repo_id: str, move_single: bool = False) -> MergeResult:
    """Merge dataset parts into ``dest`` (which must not exist).

    One readable part is copied (or renamed, with ``move_single``, when it lives on the same file
    system and may be consumed); several are aggregated by lerobot. The result is checked: its
    episode and frame counts must be the sum of the parts'.
    """
    dest = Path(dest)
    if dest.exists():
        raise DatasetWriteError(f"{dest}: the merge target already exists")
    usable: list[Path] = []
    metas: list[Any] = []
    skipped: list[tuple[Path, str]] = []
    for part in sorted(Path(p) for p in parts):
        if _episodes_in(part) == 0:
            skipped.append((part, "no episodes"))
            continue
        meta, reason = _open_part(part, repo_id)
        if reason is not None:
            logger.warning("leaving %s out of the merge: %s", part, reason)
            skipped.append((part, reason))
            continue
        usable.append(part)
        metas.append(meta)
    if not usable:
        raise EmptyDatasetError(f"no episodes to merge into {dest} (parts: {[str(p) for p in parts]})")

    from lerobot.datasets.aggregate import aggregate_datasets

    expected_episodes = sum(int(m.total_episodes) for m in metas)
    expected_frames = sum(int(m.total_frames) for m in metas)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if len(usable) == 1:
        if move_single:
            usable[0].rename(dest)
        else:
            shutil.copytree(usable[0], dest)
    else:
        aggregate_datasets(repo_ids=[repo_id] * len(usable), aggr_repo_id=repo_id, roots=list(usable), aggr_root=dest)
        _merge_sidecars(usable, [m.total_episodes for m in metas], dest)
    info = json.loads((dest / INFO_FILE).read_text())
    if (info.get("total_episodes"), info.get("total_frames")) != (expected_episodes, expected_frames):
        raise DatasetWriteError(
            f"{dest}: merged {info.get('total_episodes')} episodes / {info.get('total_frames')} frames, "
            f"expected {expected_episodes} / {expected_frames}"
        )
    return MergeResult(
        root=dest, episodes=expected_episodes, frames=expected_frames, parts=list(usable), skipped=skipped
    )


def _merge_sidecars(parts: Sequence[Path], episode_counts: Sequence[int], dest: Path) -> None:
    offset = 0
    lines: list[str] = []
    for part, count in zip(parts, episode_counts, strict=True):
        sidecar = part / EPISODES_SIDECAR
        if sidecar.is_file():
            for raw in sidecar.read_text().splitlines():
                if raw.strip():
                    record = json.loads(raw)
                    record["episode_index"] = int(record["episode_index"]) + offset
                    lines.append(json.dumps(record))
        offset += count
    if lines:
        (dest / EPISODES_SIDECAR).write_text("\n".join(lines) + "\n")


def read_episode_records(root: Path) -> list[dict[str, object]]:
    """The ``hud_episodes.jsonl`` records of a dataset (empty when it has none)."""
    sidecar = Path(root) / EPISODES_SIDECAR
    if not sidecar.is_file():
        return []
    return [json.loads(line) for line in sidecar.read_text().splitlines() if line.strip()]
