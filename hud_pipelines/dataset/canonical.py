"""One order for a merged dataset's episodes, whatever order the schedule wrote them in.

Which instance and slot run a seed depends on ``num_envs``; the order episodes end in, and which
writer thread writes each, on timing. lerobot's merge keeps the order of its parts and of the
episodes within each, so the same seeds would come out as different datasets: other
``episode_index`` and ``index`` values, other file contents, and stats whose last bits differ
(lerobot adds the parts' stats up in another grouping).

So a merged dataset is laid out again in one order: by task and seed (unseeded episodes last, by
instance, slot and episode), from ``hud_episodes.jsonl``. Not by job: an eval's instances may come
from several runs, each its own job.

- **Data rows** are written in that order, one episode (one row group) at a time, so memory stays
  flat in the episodes, in the schema lerobot's writer gives them. ``index``, ``episode_index`` and
  ``task_index`` are renumbered; tasks are numbered in the order of their first episode. A new file
  starts when the next episode would take the current one to ``data_files_size_in_mb`` of arrow
  bytes, and a new chunk every ``chunks_size`` files.
- **``meta/episodes`` rows** move with their episodes. The per-episode stats of the renumbered
  columns are recomputed.
- **Video files**: each camera's episodes are copied (their packets, not decoded) into new files in
  that order, rotated at ``video_files_size_in_mb`` (:mod:`.layout_videos`); ``meta/episodes`` says
  where each now lies. The last episode is in the last file, so lerobot's resume appends after it.
- **``stats.json``** is folded from the per-episode stats in that order, as lerobot's
  ``save_episode`` folds them. Episodes kept out of the stats (errored, or holding NaN) are left
  out.

The same pipeline and seeds give byte-equal data files, episodes metadata, tasks, stats and video
files however they were scheduled.

It writes a new dataset beside the source and renames it into place, so an interrupt never leaves
a half-ordered dataset, and a part being consumed stays whole until the result is in place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.dataset.layout_rows import (
    DATA_DIR,
    RENUMBERED_COLUMNS,
    TASKS_FILE,
    ChunkFile,
    Placed,
    Tasks,
    file_path,
    parquet_files,
    with_column,
    write_data,
)
from hud_pipelines.dataset.layout_videos import EpisodeVideo, remux_in_order
from hud_pipelines.dataset.lerobot_api import Stats, write_stats
from hud_pipelines.dataset.part import EPISODES_SIDECAR, INFO_FILE, read_episode_records
from hud_pipelines.dataset.stats_fold import fold_in_order
from hud_pipelines.errors import DatasetWriteError

EPISODES_DIR = "meta/episodes"
STATS_FILE = "meta/stats.json"
_STATS_PREFIX = "stats/"


def episode_order(records: Sequence[dict[str, Any]]) -> list[int]:
    """The merged ``episode_index`` of each episode, in canonical order (records in merged order)."""

    def place(record: dict[str, Any]) -> tuple[Any, ...]:
        seed = record.get("seed")
        seeded = (0, seed) if isinstance(seed, int) else (1, 0)
        where = tuple(int(record.get(k) or 0) for k in ("instance", "slot", "episode"))
        return (int(record.get("task") or 0), *seeded, *where)

    return sorted(range(len(records)), key=lambda i: place(records[i]))


def lay_out_canonically(source: Path, dest: Path, *, consume: bool) -> None:
    """Write the dataset at ``source`` to ``dest`` (which must not exist) with its episodes in canonical order.

    Everything is written beside ``dest`` first and renamed into place at the end, and ``source`` is
    left whole until then: an interrupted layout leaves the source as it was, never a half-ordered
    dataset. With ``consume`` the files kept as they are (``info.json``, anything lerobot adds) are hard-linked rather
    than copied, where the file system allows, and ``source`` is removed once ``dest`` is in place.
    """
    import pyarrow.parquet as pq

    parquet: Any = pq
    partial = dest.parent / f".{dest.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    records = _records(source)
    meta: Any = _read_episodes(source, parquet)
    if records and len(records) != meta.num_rows:
        raise DatasetWriteError(f"{source}: {EPISODES_SIDECAR} lists {len(records)} episodes of {meta.num_rows}")
    order = episode_order(records) if records else list(range(meta.num_rows))
    info = json.loads((source / INFO_FILE).read_text())
    tasks = Tasks.read(source, [meta.column("tasks")[old].as_py() for old in order])
    placed = write_data(source, partial, order, tasks, info, parquet)
    episodes = _placed_episodes(meta.take(order), placed)
    episodes = _remux_videos(source, partial, episodes, info)
    _write_episodes(episodes, partial, info, parquet)
    tasks.write(partial)
    if records:
        _write_records(partial, [records[old] for old in order])
    in_stats = [records[old].get("in_stats") is not False for old in order] if records else [True] * len(order)
    write_stats(_folded_stats(episodes, in_stats), partial)
    _keep_the_rest(source, partial, consume)
    partial.rename(dest)
    if consume:
        shutil.rmtree(source)


def _remux_videos(source: Path, partial: Path, meta: Any, info: dict[str, Any]) -> Any:
    """Each camera's episodes re-muxed in dataset order (:mod:`.layout_videos`), ``meta``'s video columns
    pointing at where they now lie."""
    videos = [name for name, spec in info["features"].items() if spec.get("dtype") == "video"]
    for key in videos:
        columns = {
            part: f"videos/{key}/{part}" for part in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
        }
        chunks, files, starts, ends = (meta.column(column).to_pylist() for column in columns.values())
        rows = np.subtract(meta.column("dataset_to_index").to_numpy(), meta.column("dataset_from_index").to_numpy())
        episodes = [
            EpisodeVideo(source / _video_path(info, key, (chunk, file)), (start, end), int(frames))
            for chunk, file, start, end, frames in zip(chunks, files, starts, ends, rows, strict=True)
        ]
        placed = remux_in_order(
            episodes,
            lambda at, key=key: partial / _video_path(info, key, at),
            max_mb=float(info["video_files_size_in_mb"]),
            chunk_size=int(info["chunks_size"]),
        )
        meta = with_column(meta, columns["chunk_index"], [p.at[0] for p in placed])
        meta = with_column(meta, columns["file_index"], [p.at[1] for p in placed])
        meta = with_column(meta, columns["from_timestamp"], [p.seconds[0] for p in placed])
        meta = with_column(meta, columns["to_timestamp"], [p.seconds[1] for p in placed])
    return meta


def _video_path(info: dict[str, Any], key: str, at: ChunkFile) -> str:
    return str(info["video_path"]).format(video_key=key, chunk_index=at[0], file_index=at[1])


def _keep_the_rest(source: Path, partial: Path, consume: bool) -> None:
    """Every file of ``source`` the layout does not write itself (``info.json``, anything lerobot adds)."""
    written = {DATA_DIR, EPISODES_DIR, "videos", TASKS_FILE, STATS_FILE, EPISODES_SIDECAR}
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_file() and not any(relative.is_relative_to(w) for w in written):
            target = partial / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            _keep(path, target, consume)


def _keep(path: Path, target: Path, consume: bool) -> None:
    """``path`` at ``target``: a hard link when the source is consumed (nothing copied), else a copy."""
    if consume:
        try:
            os.link(path, target)
            return
        except OSError:  # another file system, or one without hard links
            pass
    shutil.copy2(path, target)


def _records(root: Path) -> list[dict[str, Any]]:
    return sorted(read_episode_records(root), key=lambda r: int(r["episode_index"]))


def _write_records(root: Path, records: list[dict[str, Any]]) -> None:
    lines = [json.dumps({**record, "episode_index": new}) for new, record in enumerate(records)]
    (root / EPISODES_SIDECAR).write_text("\n".join(lines) + "\n")


def _read_episodes(root: Path, parquet: Any) -> Any:
    import pyarrow as pa

    arrow: Any = pa
    tables = [parquet.read_table(path) for path in parquet_files(root, EPISODES_DIR)]
    if not tables:
        raise DatasetWriteError(f"{root}: no {EPISODES_DIR} files")
    return arrow.concat_tables([t.replace_schema_metadata(None) for t in tables]).sort_by("episode_index")


def _placed_episodes(meta: Any, placed: list[Placed]) -> Any:
    """``meta/episodes`` rows in their new order, pointing at the rows' new places."""
    columns: dict[str, list[Any]] = {
        "episode_index": list(range(len(placed))),
        "data/chunk_index": [p.at[0] for p in placed],
        "data/file_index": [p.at[1] for p in placed],
        "dataset_from_index": [p.from_index for p in placed],
        "dataset_to_index": [p.to_index for p in placed],
    }
    for name in RENUMBERED_COLUMNS:
        for stat in placed[0].stats[name] if placed else {}:
            columns[f"{_STATS_PREFIX}{name}/{stat}"] = [p.stats[name][stat].tolist() for p in placed]
    for name, values in columns.items():
        meta = with_column(meta, name, values)
    return meta


def _write_episodes(meta: Any, staging: Path, info: dict[str, Any], parquet: Any) -> None:
    """The episodes' rows in files of at most ``data_files_size_in_mb`` (at least one row each).

    The dataset's own limit rather than lerobot's fixed 100 MB for metadata: one file either way for
    any eval of fewer than tens of thousands of episodes, and a limit the dataset states."""
    per_row = max(1, meta.nbytes // max(1, meta.num_rows))
    rows_per_file = max(1, int(float(info["data_files_size_in_mb"]) * 1024**2 // per_row))
    chunk_size = int(info["chunks_size"])
    chunks: list[int] = []
    files: list[int] = []
    for row in range(meta.num_rows):
        number = row // rows_per_file
        chunks.append(number // chunk_size)
        files.append(number % chunk_size)
    for name, values in (("meta/episodes/chunk_index", chunks), ("meta/episodes/file_index", files)):
        meta = with_column(meta, name, values)
    for start in range(0, meta.num_rows, rows_per_file):
        number = start // rows_per_file
        target = file_path(staging, EPISODES_DIR, (number // chunk_size, number % chunk_size))
        target.parent.mkdir(parents=True, exist_ok=True)
        parquet.write_table(meta.slice(start, rows_per_file), str(target))


def _folded_stats(meta: Any, in_stats: list[bool]) -> Stats:
    """Each feature's stats over the episodes that count, folded episode by episode in dataset order."""
    columns: dict[str, dict[str, np.ndarray[Any, Any]]] = {}
    for name in meta.column_names:
        if name.startswith(_STATS_PREFIX):
            feature, stat = name.removeprefix(_STATS_PREFIX).rsplit("/", 1)
            columns.setdefault(feature, {})[stat] = _stats_array(meta.column(name))
    stats = fold_in_order(columns, (row for row, counted in enumerate(in_stats) if counted))
    return {name: stats[name] for name in sorted(stats)}


def _stats_array(column: Any) -> np.ndarray[Any, Any]:
    """A per-episode stats column (nested lists, one per episode) as one array of ``(episodes, *shape)``,
    read without a Python object per value."""
    import pyarrow as pa

    arrow: Any = pa
    values: Any = column.combine_chunks()
    rows: int = len(values)
    shape = np.asarray(values[0].as_py()).shape if rows else ()
    while arrow.types.is_list(values.type) or arrow.types.is_fixed_size_list(values.type):
        values = values.flatten()
    flat: np.ndarray[Any, Any] = values.to_numpy(zero_copy_only=False)
    return flat.reshape(rows, *shape)
