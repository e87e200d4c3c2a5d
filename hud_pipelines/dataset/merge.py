"""Shards -> one dataset, through lerobot's own aggregation (``lerobot.datasets.aggregate``).

A shard is a directory of parts (``part-000``...), each a complete lerobot dataset written by one
writer thread. lerobot merges the parts in the order given, and the ``hud_episodes.jsonl`` sidecars
are merged with the same offsets; then the episodes are laid out in one order whatever the schedule
(by task and seed: :mod:`.canonical`), which also writes the data files and ``stats.json``.

Its memory is flat in the episodes merged: lerobot appends each part's rows to the merged data
file by reading the whole file back, so the merge asks it for one data file per part, and the
canonical layout writes the rows again one episode at a time.

Parts that hold no episode are skipped; a part that cannot be read (its writer was killed before
finalizing) is skipped with a warning and reported, never merged half-written.

lerobot's progress bars are silenced while it merges.
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

from hud_pipelines.dataset.canonical import lay_out_canonically
from hud_pipelines.dataset.lerobot_api import load_stats, parquet_rows
from hud_pipelines.dataset.part import EPISODES_SIDECAR, INFO_FILE
from hud_pipelines.errors import DatasetWriteError, EmptyDatasetError

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Schema:
    """What lerobot's merge needs equal in every dataset it merges: fps, robot type and features (a video's without
    its encoding ``info``, which the merge does not compare)."""

    fps: object
    robot_type: object
    features: dict[str, dict[str, Any]]

    def described(self, key: str) -> str:
        """Feature ``key`` in a few characters (``int64[1]``)."""
        feature = self.features[key]
        return f"{feature.get('dtype')}{list(feature.get('shape') or [])}"


def schema(shard: Path) -> Schema | None:
    """The :class:`Schema` of ``shard`` as its first part that holds episodes says it (``None``: no such part)."""
    for part in find_parts([shard]):
        info: dict[str, Any] = json.loads((part / INFO_FILE).read_text())
        if int(info.get("total_episodes", 0)):
            features: dict[str, dict[str, Any]] = info.get("features") or {}
            without_info = {key: {k: v for k, v in f.items() if k != "info"} for key, f in features.items()}
            return Schema(info.get("fps"), info.get("robot_type"), without_info)
    return None


def _episodes_in(part: Path) -> int:
    info = json.loads((part / INFO_FILE).read_text())
    return int(info.get("total_episodes", 0))


@dataclass(frozen=True)
class _PartCounts:
    episodes: int
    frames: int


def _open_part(part: Path) -> _PartCounts | str:
    """The part's counts, or why the part cannot be merged.

    Checked from the files (``info.json`` against the parquet footers, which a killed writer never
    wrote), not by loading lerobot's metadata: that starts threads, which Python refuses at
    interpreter exit, where an unclosed ``wrap()`` still publishes its dataset.
    """
    info = json.loads((part / INFO_FILE).read_text())
    episodes, frames = int(info.get("total_episodes", 0)), int(info.get("total_frames", 0))
    try:
        episode_rows = _parquet_rows(part / "meta" / "episodes")
        data_rows = _parquet_rows(part / "data")
        load_stats(part)  # a part whose writer was killed may have none, or half of one
    except Exception as exc:  # a killed writer leaves parquet files without footers
        return f"unreadable: {exc!r}"
    if (episode_rows, data_rows) != (episodes, frames):
        return f"its files hold {episode_rows} episodes / {data_rows} frames of {episodes} / {frames} (not finalized)"
    return _PartCounts(episodes, frames)


def _parquet_rows(directory: Path) -> int:
    """Rows of the ``chunk-*/file-*.parquet`` files under ``directory``, read from their footers."""
    return sum(parquet_rows(f) for f in sorted(directory.glob("*/*.parquet")))


def merge_parts(parts: Sequence[Path], dest: Path, *, repo_id: str, move_single: bool = False) -> MergeResult:
    """Merge dataset parts into ``dest`` (which must not exist).

    One readable part is laid out into ``dest`` in canonical order; several are aggregated by lerobot
    beside ``dest`` first. A part is never changed; with ``move_single`` a single part is consumed
    (removed once ``dest`` is in place). The result
    is checked: its episode and frame counts must be the sum of the parts'.
    """
    dest = Path(dest)
    if dest.exists():
        raise DatasetWriteError(f"{dest}: the merge target already exists")
    usable: list[Path] = []
    metas: list[_PartCounts] = []
    skipped: list[tuple[Path, str]] = []
    for part in (Path(p) for p in parts):
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
        lay_out_canonically(usable[0], dest, consume=move_single)
    else:
        from lerobot.datasets.aggregate import aggregate_datasets

        aggregated = dest.parent / f".{dest.name}.aggregated"
        shutil.rmtree(aggregated, ignore_errors=True)
        with quiet_aggregation():
            aggregate_datasets(
                repo_ids=[repo_id] * len(usable),
                aggr_repo_id=repo_id,
                roots=list(usable),
                aggr_root=aggregated,
                concatenate_data=False,  # laid out below, without re-reading what was merged so far
            )
        merge_sidecars(usable, [m.episodes for m in metas], aggregated)
        lay_out_canonically(aggregated, dest, consume=True)
    info = json.loads((dest / INFO_FILE).read_text())
    if (info.get("total_episodes"), info.get("total_frames")) != (expected_episodes, expected_frames):
        raise DatasetWriteError(
            f"{dest}: merged {info.get('total_episodes')} episodes / {info.get('total_frames')} frames, "
            f"expected {expected_episodes} / {expected_frames}"
        )
    return MergeResult(
        root=dest, episodes=expected_episodes, frames=expected_frames, parts=list(usable), skipped=skipped
    )


def merge_sidecars(parts: Sequence[Path], episode_counts: Sequence[int], dest: Path) -> None:
    """The parts' ``hud_episodes.jsonl`` as one, numbered as lerobot's merge numbers their episodes."""
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
