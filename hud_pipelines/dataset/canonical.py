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
  flat in the episodes. ``index``, ``episode_index`` and ``task_index`` are renumbered; tasks are
  numbered in the order of their first episode. A new file starts when the next episode would take
  the current one to ``data_files_size_in_mb`` of arrow bytes, and a new chunk every ``chunks_size``
  files.
- **``meta/episodes`` rows** move with their episodes. Their video columns are kept: a frame is
  found by file and timestamp, not by position. The per-episode stats of the renumbered columns are
  recomputed.
- **``stats.json``** is folded from the per-episode stats in that order, as lerobot's
  ``save_episode`` folds them. Episodes kept out of the stats (errored, or holding NaN) are left
  out.

The same pipeline and seeds give byte-equal data files, episodes metadata, tasks and stats however
they were scheduled. Video files hold the same frames for each episode, but in the order the merge
met them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.dataset.lerobot_api import Stats, aggregate_stats, episode_stats, write_stats
from hud_pipelines.dataset.part import EPISODES_SIDECAR, INFO_FILE
from hud_pipelines.errors import DatasetWriteError

RENUMBERED_COLUMNS = ("index", "episode_index", "task_index")
"""Columns whose values depend on an episode's place in the dataset; all others keep their values."""
DATA_DIR = "data"
EPISODES_DIR = "meta/episodes"
TASKS_FILE = "meta/tasks.parquet"
_STAGING_DIR = ".canonical"
_STATS_PREFIX = "stats/"

ChunkFile = tuple[int, int]
"""A file's ``(chunk_index, file_index)``, as lerobot numbers ``chunk-XXX/file-YYY.parquet``."""


def file_path(root: Path, directory: str, at: ChunkFile) -> Path:
    """lerobot's ``<directory>/chunk-XXX/file-YYY.parquet`` (``DEFAULT_DATA_PATH``'s pattern)."""
    return root / directory / f"chunk-{at[0]:03d}" / f"file-{at[1]:03d}.parquet"


def parquet_files(root: Path, directory: str) -> list[Path]:
    """Every ``chunk-XXX/file-YYY.parquet`` under ``root/directory``, in lerobot's numeric order."""
    found: list[tuple[ChunkFile, Path]] = []
    for path in (root / directory).glob("chunk-*/file-*.parquet"):
        try:
            at = (int(path.parent.name.removeprefix("chunk-")), int(path.stem.removeprefix("file-")))
        except ValueError as exc:
            raise DatasetWriteError(f"{path}: not a lerobot chunk-XXX/file-YYY.parquet name") from exc
        found.append((at, path))
    return [path for _, path in sorted(found)]


def episode_order(records: Sequence[dict[str, Any]]) -> list[int]:
    """The merged ``episode_index`` of each episode, in canonical order (records in merged order)."""

    def place(record: dict[str, Any]) -> tuple[Any, ...]:
        seed = record.get("seed")
        seeded = (0, seed) if isinstance(seed, int) else (1, 0)
        where = tuple(int(record.get(k) or 0) for k in ("instance", "slot", "episode"))
        return (int(record.get("task") or 0), *seeded, *where)

    return sorted(range(len(records)), key=lambda i: place(records[i]))


def lay_out_canonically(root: Path) -> None:
    """Rewrite the dataset at ``root`` in place with its episodes in canonical order (module docstring)."""
    import pyarrow.parquet as pq

    parquet: Any = pq
    records = _records(root)
    meta: Any = _read_episodes(root, parquet)
    if records and len(records) != meta.num_rows:
        raise DatasetWriteError(f"{root}: {EPISODES_SIDECAR} lists {len(records)} episodes of {meta.num_rows}")
    order = episode_order(records) if records else list(range(meta.num_rows))
    info = json.loads((root / INFO_FILE).read_text())
    tasks = _Tasks.read(root, [meta.column("tasks")[old].as_py() for old in order])
    staging = root / _STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    rows = _EpisodeRows(parquet_files(root, DATA_DIR), parquet)
    files = _Rotation(float(info["data_files_size_in_mb"]), int(info["chunks_size"]))
    placed: list[_Placed] = []
    writer: Any = None
    try:
        for new, old in enumerate(order):
            table = _renumbered(rows.episode(old), new, placed[-1].to_index if placed else 0, tasks)
            at, fresh = files.place(table.nbytes)
            if fresh:
                if writer is not None:
                    writer.close()
                target = file_path(staging, DATA_DIR, at)
                target.parent.mkdir(parents=True, exist_ok=True)
                writer = parquet.ParquetWriter(str(target), table.schema, compression="snappy", use_dictionary=True)
            writer.write_table(table)
            start = placed[-1].to_index if placed else 0
            placed.append(_Placed(at, start, start + table.num_rows, _bookkeeping_stats(table)))
    finally:
        rows.close()
        if writer is not None:
            writer.close()
    episodes = _placed_episodes(meta.take(order), placed)
    _write_episodes(episodes, staging, info, parquet)
    for directory in (DATA_DIR, EPISODES_DIR):
        shutil.rmtree(root / directory)
        (staging / directory).rename(root / directory)
    shutil.rmtree(staging)
    tasks.write(root)
    if records:
        _write_records(root, [records[old] for old in order])
    in_stats = [records[old].get("in_stats") is not False for old in order] if records else [True] * len(order)
    write_stats(_folded_stats(episodes, in_stats), root)


def _records(root: Path) -> list[dict[str, Any]]:
    sidecar = root / EPISODES_SIDECAR
    if not sidecar.is_file():
        return []
    records = [json.loads(line) for line in sidecar.read_text().splitlines() if line.strip()]
    return sorted(records, key=lambda r: int(r["episode_index"]))


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


@dataclass
class _Tasks:
    """``meta/tasks.parquet`` renumbered: tasks in the order of their first episode, unused ones after."""

    frame: Any
    new_index: dict[int, int]

    @classmethod
    def read(cls, root: Path, episode_tasks: Sequence[Sequence[str]]) -> _Tasks:
        import pandas as pd

        old: Any = pd.read_parquet(root / TASKS_FILE)
        named = {str(task): int(index) for task, index in zip(old.index, old["task_index"], strict=True)}
        ordered = list(dict.fromkeys([t for tasks in episode_tasks for t in tasks if t in named] + list(named)))
        frame: Any = pd.DataFrame({"task_index": range(len(ordered))}, index=pd.Index(ordered, name="task"))
        return cls(frame, {named[task]: new for new, task in enumerate(ordered)})

    def write(self, root: Path) -> None:
        self.frame.to_parquet(root / TASKS_FILE)

    def renumber(self, old: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
        lookup = np.full(max(self.new_index) + 1, -1, dtype=np.int64)
        lookup[list(self.new_index)] = list(self.new_index.values())
        return lookup[old]


class _EpisodeRows:
    """Reads one episode's data rows at a time from the merged files, wherever they lie.

    One file is open at a time (an eval's episodes mostly come in runs from the same part), so a merge
    of thousands of parts never holds thousands of open files."""

    def __init__(self, files: list[Path], parquet: Any) -> None:
        self._parquet = parquet
        self._paths = files
        self._open: tuple[int, Any] | None = None
        self._where: dict[int, list[tuple[int, int]]] = {}
        for number in range(len(files)):
            source = self._file(number)
            for group in range(source.num_row_groups):
                labels: np.ndarray[Any, np.dtype[np.int64]] = (
                    source.read_row_group(group, columns=["episode_index"]).column(0).to_numpy()
                )
                for episode in np.unique(labels).tolist():
                    self._where.setdefault(int(episode), []).append((number, group))

    def episode(self, index: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        arrow: Any = pa
        compute: Any = pc
        pieces: list[Any] = []
        for number, group in self._where.get(index, []):
            table = self._file(number).read_row_group(group)
            pieces.append(table.filter(compute.equal(table.column("episode_index"), index)))
        if not pieces:
            raise DatasetWriteError(f"episode {index} has no data rows")
        return arrow.concat_tables(pieces)

    def _file(self, number: int) -> Any:
        if self._open is None or self._open[0] != number:
            self.close()
            self._open = (number, self._parquet.ParquetFile(self._paths[number]))
        return self._open[1]

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None


def _renumbered(table: Any, episode: int, first_index: int, tasks: _Tasks) -> Any:
    import pyarrow as pa

    rows: int = table.num_rows
    values: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = {
        "episode_index": np.full(rows, episode, dtype=np.int64),
        "index": np.arange(first_index, first_index + rows, dtype=np.int64),
        "task_index": tasks.renumber(table.column("task_index").to_numpy()),
    }
    for name, column in values.items():
        position = table.schema.get_field_index(name)
        table = table.set_column(position, table.schema.field(position), pa.array(column, type=pa.int64()))
    return table


class _Rotation:
    """lerobot's file and chunk numbering: a new file when the next episode would fill this one."""

    def __init__(self, max_mb: float, chunk_size: int) -> None:
        self._max_bytes = max_mb * 1024**2
        self._chunk_size = chunk_size
        self._at: ChunkFile | None = None
        self._bytes = 0

    def place(self, size: int) -> tuple[ChunkFile, bool]:
        """The file that takes an episode of ``size`` bytes, and whether it is a new one."""
        fresh = self._at is None or self._bytes + size >= self._max_bytes
        if self._at is None:
            self._at = (0, 0)
        elif fresh:
            chunk, index = self._at
            self._at = (chunk + 1, 0) if index == self._chunk_size - 1 else (chunk, index + 1)
        self._bytes = size if fresh else self._bytes + size
        return self._at, fresh


@dataclass(frozen=True)
class _Placed:
    at: ChunkFile
    from_index: int
    to_index: int
    stats: Stats = field(default_factory=dict[str, dict[str, Any]])


def _bookkeeping_stats(table: Any) -> Stats:
    features = {name: {"dtype": "int64", "shape": (1,), "names": None} for name in RENUMBERED_COLUMNS}
    return episode_stats({name: table.column(name).to_numpy() for name in RENUMBERED_COLUMNS}, features)


def _placed_episodes(meta: Any, placed: list[_Placed]) -> Any:
    """``meta/episodes`` rows in their new order, pointing at the rows' new places."""
    import pyarrow as pa

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
        position = meta.schema.get_field_index(name)
        if position >= 0:
            meta = meta.set_column(
                position, meta.schema.field(position), pa.array(values, meta.schema.field(position).type)
            )
    return meta


def _write_episodes(meta: Any, staging: Path, info: dict[str, Any], parquet: Any) -> None:
    """The episodes' rows in files of at most ``data_files_size_in_mb`` (at least one row each)."""
    import pyarrow as pa

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
        position = meta.schema.get_field_index(name)
        if position >= 0:
            meta = meta.set_column(position, meta.schema.field(position), pa.array(values, pa.int64()))
    for start in range(0, meta.num_rows, rows_per_file):
        number = start // rows_per_file
        target = file_path(staging, EPISODES_DIR, (number // chunk_size, number % chunk_size))
        target.parent.mkdir(parents=True, exist_ok=True)
        parquet.write_table(meta.slice(start, rows_per_file), str(target))


def _folded_stats(meta: Any, in_stats: list[bool]) -> Stats:
    """Each feature's stats over the episodes that count, folded episode by episode in dataset order."""
    names = [c for c in meta.column_names if c.startswith(_STATS_PREFIX)]
    stats: Stats | None = None
    for row, counted in zip(_stats_rows(meta, names), in_stats, strict=True):
        if counted:
            stats = row if stats is None else aggregate_stats([stats, row])
    return {name: (stats or {})[name] for name in sorted(stats or {})}


def _stats_rows(meta: Any, names: list[str]) -> Iterator[Stats]:
    columns = {name: meta.column(name).to_pylist() for name in names}
    for row in range(meta.num_rows):
        one: Stats = {}
        for name in names:
            feature, stat = name.removeprefix(_STATS_PREFIX).rsplit("/", 1)
            one.setdefault(feature, {})[stat] = np.asarray(columns[name][row])
        yield one
