"""The data rows of a canonical layout (:mod:`.canonical`): read one episode at a time, renumbered, rewritten.

A merged dataset's rows lie in one file per part, in the order the parts were merged; the layout
reads each episode's rows where they lie (one row group at a time, so memory stays flat in the
episodes), renumbers ``index``, ``episode_index`` and ``task_index`` for the episode's new place,
and writes it as one row group of the file lerobot's rotation puts it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.dataset.lerobot_api import Stats, episode_stats
from hud_pipelines.errors import DatasetWriteError

RENUMBERED_COLUMNS = ("index", "episode_index", "task_index")
"""Columns whose values depend on an episode's place in the dataset; all others keep their values."""
DATA_DIR = "data"
TASKS_FILE = "meta/tasks.parquet"

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


def write_data(
    source: Path, partial: Path, order: list[int], tasks: Tasks, info: dict[str, Any], parquet: Any
) -> list[Placed]:
    """The data rows, episode by episode in ``order``, in the schema lerobot's writer gives them.

    One schema whatever the source: a part holds lerobot's writer's (scalars for shape-1 features,
    fixed-size lists), lerobot's merge its own round trip through pandas (plain lists), and an image
    part's metadata a fingerprint of the write."""
    schema = data_schema(info)
    rows = EpisodeRows(parquet_files(source, DATA_DIR), parquet)
    files = Rotation(float(info["data_files_size_in_mb"]), int(info["chunks_size"]))
    placed: list[Placed] = []
    writer: Any = None
    try:
        for new, old in enumerate(order):
            start = placed[-1].to_index if placed else 0
            table = renumbered(rows.episode(old), new, start, tasks).select(schema.names).cast(schema)
            at, fresh = files.place(table.nbytes)
            if fresh:
                if writer is not None:
                    writer.close()
                target = file_path(partial, DATA_DIR, at)
                target.parent.mkdir(parents=True, exist_ok=True)
                writer = parquet.ParquetWriter(str(target), schema, compression="snappy", use_dictionary=True)
            writer.write_table(table)
            placed.append(Placed(at, start, start + table.num_rows, bookkeeping_stats(table)))
    finally:
        rows.close()
        if writer is not None:
            writer.close()
    return placed


def data_schema(info: dict[str, Any]) -> Any:
    """The arrow schema lerobot's writer gives the data of these features (its ``get_hf_features_from_features``,
    with the shapes as tuples, as lerobot holds them in memory: ``info.json`` spells them as lists)."""
    from lerobot.datasets import feature_utils

    lerobot_features: Any = feature_utils
    features = {name: {**spec, "shape": tuple(spec["shape"])} for name, spec in info["features"].items()}
    hf_features: Any = lerobot_features.get_hf_features_from_features(features)
    return hf_features.arrow_schema


@dataclass
class Tasks:
    """``meta/tasks.parquet`` renumbered: tasks in the order of their first episode, unused ones after."""

    frame: Any
    new_index: dict[int, int]

    @classmethod
    def read(cls, root: Path, episode_tasks: Sequence[Sequence[str]]) -> Tasks:
        import pandas as pd

        old: Any = pd.read_parquet(root / TASKS_FILE)
        named = {str(task): int(index) for task, index in zip(old.index, old["task_index"], strict=True)}
        ordered = list(dict.fromkeys([t for tasks in episode_tasks for t in tasks if t in named] + list(named)))
        frame: Any = pd.DataFrame({"task_index": range(len(ordered))}, index=pd.Index(ordered, name="task"))
        return cls(frame, {named[task]: new for new, task in enumerate(ordered)})

    def write(self, root: Path) -> None:
        (root / TASKS_FILE).parent.mkdir(parents=True, exist_ok=True)
        self.frame.to_parquet(root / TASKS_FILE)

    def renumber(self, old: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
        unknown = sorted(set(np.unique(old).tolist()) - set(self.new_index))
        if unknown:
            raise DatasetWriteError(f"data rows have task_index {unknown}, which {TASKS_FILE} does not list")
        lookup = np.zeros(max(self.new_index) + 1, dtype=np.int64)
        lookup[list(self.new_index)] = list(self.new_index.values())
        return lookup[old]


class EpisodeRows:
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


def with_column(table: Any, name: str, values: Any) -> Any:
    """``table`` with column ``name`` holding ``values``, its field (type, metadata) kept; ``table``
    itself when it has no such column. ``set_column`` with a bare name would drop the field's
    metadata and infer another type, and lerobot reads both back."""
    import pyarrow as pa

    position: int = table.schema.get_field_index(name)
    if position < 0:
        return table
    kept = table.schema.field(position)
    return table.set_column(position, kept, pa.array(values, kept.type))


def renumbered(table: Any, episode: int, first_index: int, tasks: Tasks) -> Any:
    rows: int = table.num_rows
    values: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = {
        "episode_index": np.full(rows, episode, dtype=np.int64),
        "index": np.arange(first_index, first_index + rows, dtype=np.int64),
        "task_index": tasks.renumber(table.column("task_index").to_numpy()),
    }
    for name, column in values.items():
        table = with_column(table, name, column)
    return table


class Rotation:
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
class Placed:
    at: ChunkFile
    from_index: int
    to_index: int
    stats: Stats = field(default_factory=dict[str, dict[str, Any]])


def bookkeeping_stats(table: Any) -> Stats:
    features = {name: {"dtype": "int64", "shape": (1,), "names": None} for name in RENUMBERED_COLUMNS}
    return episode_stats({name: table.column(name).to_numpy() for name in RENUMBERED_COLUMNS}, features)
