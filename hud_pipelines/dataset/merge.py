"""Shards -> one dataset, through lerobot's own aggregation (``lerobot.datasets.aggregate``).

A shard is a directory of parts (``part-000``...), each a complete lerobot dataset written by one
writer thread. Merging takes the parts in a stable order (by path), so episode indices of the
merged dataset follow shard name, then part, then the order episodes ended within the part. The
``hud_episodes.jsonl`` sidecars are merged with the same offsets.

Its memory is flat in the episodes merged: lerobot appends each part's rows to the merged data
file by reading the whole file back, so the merge asks it for one data file per part and packs
them into lerobot's layout itself, one row group at a time (:mod:`.pack`).

Parts that hold no episode are skipped; a part that cannot be read (its writer was killed before
finalizing) is skipped with a warning and reported, never merged half-written.

``stats.json`` of a merged dataset describes its data: lerobot aggregates the parts' stats, which
is right for every feature whose values merging leaves alone, but it keeps each part's own stats of
the columns merging renumbers (``index``, ``episode_index``, ``task_index``), so their ranges
described one part. Those are recomputed from the merged rows, per episode and folded together as
lerobot's ``save_episode`` folds them, leaving out episodes kept flagged as non-finite (as the
parts' stats do). lerobot's progress bars are silenced while it merges.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from hud_pipelines.dataset.lerobot_api import (
    Stats,
    aggregate_stats,
    episode_stats,
    load_stats,
    parquet_columns,
    parquet_rows,
    write_stats,
)
from hud_pipelines.dataset.pack import pack_data_files
from hud_pipelines.dataset.part import EPISODES_SIDECAR, INFO_FILE
from hud_pipelines.errors import DatasetWriteError, EmptyDatasetError

logger = logging.getLogger(__name__)

RENUMBERED_COLUMNS = ("index", "episode_index", "task_index")
"""Columns whose values merging changes (offset or relabelled); all others keep their values."""
_QUIET_LOCK = threading.Lock()


@dataclass(frozen=True)
class MergeResult:
    root: Path
    episodes: int
    frames: int
    parts: list[Path]
    skipped: list[tuple[Path, str]] = field(default_factory=list[tuple[Path, str]])
    """Parts left out, with the reason."""


def find_parts(roots: Iterable[Path]) -> list[Path]:
    """Every dataset directory (one with ``meta/info.json``) at or below the given roots, in the roots'
    order and sorted below each: the merged dataset's episodes come in that order (an eval's shards in
    task and instance order, not in the alphabetical order of their partition keys)."""
    found: dict[Path, None] = {}  # ordered, and each part once
    for root in roots:
        root = Path(root)
        if (root / INFO_FILE).is_file():
            found[root] = None
        elif root.is_dir():
            found.update(dict.fromkeys(sorted(info.parent.parent for info in root.glob(f"**/{INFO_FILE}"))))
    return list(found)


def _episodes_in(part: Path) -> int:
    info = json.loads((part / INFO_FILE).read_text())
    return int(info.get("total_episodes", 0))


@dataclass(frozen=True)
class _PartCounts:
    episodes: int
    frames: int
    stats: dict[str, Any] | None


def _open_part(part: Path) -> _PartCounts | str:
    """The part's counts and stats, or why the part cannot be merged.

    Checked from the files (``info.json`` against the parquet footers, which a killed writer never
    wrote), not by loading lerobot's metadata: that starts threads, which Python refuses at
    interpreter exit, where an unclosed ``wrap()`` still publishes its dataset.
    """
    info = json.loads((part / INFO_FILE).read_text())
    episodes, frames = int(info.get("total_episodes", 0)), int(info.get("total_frames", 0))
    try:
        episode_rows = _parquet_rows(part / "meta" / "episodes")
        data_rows = _parquet_rows(part / "data")
        stats = load_stats(part)
    except Exception as exc:  # a killed writer leaves parquet files without footers
        return f"unreadable: {exc!r}"
    if (episode_rows, data_rows) != (episodes, frames):
        return f"its files hold {episode_rows} episodes / {data_rows} frames of {episodes} / {frames} (not finalized)"
    return _PartCounts(episodes, frames, stats)


def _parquet_rows(directory: Path) -> int:
    """Rows of the ``chunk-*/file-*.parquet`` files under ``directory``, read from their footers."""
    return sum(parquet_rows(f) for f in sorted(directory.glob("*/*.parquet")))


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
    metas: list[_PartCounts] = []
    skipped: list[tuple[Path, str]] = []
    for part in (Path(p) for p in parts):  # in the order given: the merged episodes' order
        if _episodes_in(part) == 0:
            skipped.append((part, "no episodes"))
            continue
        meta = _open_part(part)
        if isinstance(meta, str):
            logger.warning("leaving %s out of the merge: %s", part, meta)
            skipped.append((part, meta))
            continue
        usable.append(part)
        metas.append(meta)
    if not usable:
        raise EmptyDatasetError(f"no episodes to merge into {dest} (parts: {[str(p) for p in parts]})")

    expected_episodes = sum(m.episodes for m in metas)
    expected_frames = sum(m.frames for m in metas)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if len(usable) == 1:
        if move_single:
            usable[0].rename(dest)
        else:
            shutil.copytree(usable[0], dest)
    else:
        from lerobot.datasets.aggregate import aggregate_datasets

        with quiet_aggregation():
            aggregate_datasets(
                repo_ids=[repo_id] * len(usable),
                aggr_repo_id=repo_id,
                roots=list(usable),
                aggr_root=dest,
                concatenate_data=False,  # packed below, without re-reading what was merged so far
            )
        pack_data_files(dest)
        _merge_sidecars(usable, [m.episodes for m in metas], dest)
        _write_merged_stats(dest, [m.stats for m in metas])
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


@contextlib.contextmanager
def quiet_aggregation() -> Generator[None]:
    """lerobot's aggregation without its tqdm bars (they would print through a quiet run's stderr).

    ``lerobot.datasets.aggregate`` calls ``tqdm.tqdm`` through its own module reference; only that
    reference is swapped, for the block, so no other tqdm user in the process is affected.
    """
    from lerobot.datasets import aggregate

    with _QUIET_LOCK, mock.patch.object(aggregate, "tqdm", _SilentTqdm):
        yield


class _SilentTqdm:
    """Stands in for the ``tqdm`` module: ``tqdm.tqdm(iterable, ...)`` is the iterable itself."""

    @staticmethod
    def tqdm[T](iterable: Iterable[T], *args: object, **kwargs: object) -> Iterable[T]:
        return iterable


def _write_merged_stats(dest: Path, part_stats: Sequence[dict[str, Any] | None]) -> None:
    """``stats.json`` of the merged data: lerobot's aggregate of the parts, renumbered columns recomputed."""
    stats = aggregate_stats([s for s in part_stats if s])
    for column in RENUMBERED_COLUMNS:
        stats.pop(column, None)
    stats.update(_renumbered_column_stats(dest))
    # sorted: lerobot's aggregate orders features by set iteration, which differs from process to process
    write_stats({name: stats[name] for name in sorted(stats)}, dest)


def _renumbered_column_stats(root: Path) -> dict[str, Any]:
    """Stats of the renumbered columns over the episodes that count (not kept flagged as non-finite).

    Per episode with lerobot's ``compute_episode_stats``, folded in episode order with
    ``aggregate_stats`` as ``save_episode`` does: the stats lerobot writes for one dataset of these
    episodes.
    """
    files = [str(f) for f in sorted((root / "data").glob("*/*.parquet"))]
    columns = parquet_columns(files, RENUMBERED_COLUMNS)
    left_out = {int(str(r["episode_index"])) for r in read_episode_records(root) if r.get("in_stats") is False}
    features = {name: {"dtype": "int64", "shape": (1,), "names": None} for name in RENUMBERED_COLUMNS}
    episodes = columns["episode_index"]
    stats: Stats | None = None
    for episode in (int(e) for e in np.unique(episodes)):
        if episode in left_out:
            continue
        rows = episodes == episode
        one = episode_stats({name: values[rows] for name, values in columns.items()}, features)
        stats = one if stats is None else aggregate_stats([stats, one])
    return stats or {}


def read_episode_records(root: Path) -> list[dict[str, object]]:
    """The ``hud_episodes.jsonl`` records of a dataset (empty when it has none)."""
    sidecar = Path(root) / EPISODES_SIDECAR
    if not sidecar.is_file():
        return []
    return [json.loads(line) for line in sidecar.read_text().splitlines() if line.strip()]
