"""Pack a merged dataset's data files, one episode at a time, so a merge's memory stays flat in its episodes.

lerobot's ``aggregate_datasets`` appends each part's rows to the merged data file by reading that
whole file back into pandas, concatenating and writing it again: for every part, the rows of all the
parts before it. Its working set grows with the episodes merged, and the allocators keep what it
touched (``bench/memory.md``: ~0.4 MiB of the parent's RSS per 50-step episode, never given back).

So :mod:`.merge` asks lerobot for one data file per part (``concatenate_data=False``: each part's
rows are read and written once) and :func:`pack_data_files` lays them out as lerobot's concatenation
would: the parts' rows in order, a new file whenever the next part would take the current one to
the dataset's ``data_files_size_in_mb``, a new chunk every ``chunks_size`` files, one row group per
episode. Row groups are copied one at a time through one ``ParquetWriter`` per file, so at most one
episode's rows are in memory. The episodes' ``data/chunk_index`` and ``data/file_index`` follow.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hud_pipelines.errors import DatasetWriteError

DATA_DIR = "data"
EPISODES_DIR = "meta/episodes"
CHUNK_KEY = "data/chunk_index"
FILE_KEY = "data/file_index"
_PACKING_DIR = ".packing-data"

ChunkFile = tuple[int, int]
"""A file's ``(chunk_index, file_index)``, as lerobot numbers ``chunk-XXX/file-YYY.parquet``."""


@dataclass(frozen=True)
class PackedFile:
    """One data file of the packed layout and the source files whose rows it holds, in order."""

    target: ChunkFile
    sources: list[ChunkFile]


def file_path(root: Path, directory: str, at: ChunkFile) -> Path:
    """lerobot's ``<directory>/chunk-XXX/file-YYY.parquet`` (``DEFAULT_DATA_PATH``'s pattern)."""
    return root / directory / f"chunk-{at[0]:03d}" / f"file-{at[1]:03d}.parquet"


def chunk_files(root: Path, directory: str) -> list[ChunkFile]:
    """The ``(chunk, file)`` of every parquet file under ``root/directory``, in lerobot's numeric order."""
    found: list[ChunkFile] = []
    for path in (root / directory).glob("chunk-*/file-*.parquet"):
        try:
            found.append((int(path.parent.name.removeprefix("chunk-")), int(path.stem.removeprefix("file-"))))
        except ValueError as exc:
            raise DatasetWriteError(f"{path}: not a lerobot chunk-XXX/file-YYY.parquet name") from exc
    return sorted(found)


def plan_packing(sizes_mb: list[tuple[ChunkFile, float]], *, max_mb: float, chunk_size: int) -> list[PackedFile]:
    """Group source files into packed files with lerobot's rotation rule.

    lerobot starts a new file when the current one's size plus the next source's reaches ``max_mb``
    (sizes as ``get_parquet_file_size_in_mb`` counts them: uncompressed column bytes); the current
    file's size is taken as the sum of its sources'.
    """
    packed: list[PackedFile] = []
    size = 0.0
    for source, source_mb in sizes_mb:
        if not packed:
            packed.append(PackedFile((0, 0), [source]))
        elif size + source_mb >= max_mb:
            chunk, index = packed[-1].target
            target = (chunk + 1, 0) if index == chunk_size - 1 else (chunk, index + 1)
            packed.append(PackedFile(target, [source]))
            size = 0.0
        else:
            packed[-1].sources.append(source)
        size += source_mb
    return packed


def pack_data_files(root: Path) -> None:
    """Repack ``root``'s data files (one per merged part) into lerobot's concatenated layout, in place."""
    info = json.loads((root / "meta" / "info.json").read_text())
    sources = chunk_files(root, DATA_DIR)
    sizes = [(source, _uncompressed_mb(file_path(root, DATA_DIR, source))) for source in sources]
    plan = plan_packing(sizes, max_mb=float(info["data_files_size_in_mb"]), chunk_size=int(info["chunks_size"]))
    moved = {source: packed.target for packed in plan for source in packed.sources}
    if all(source == target for source, target in moved.items()):
        return
    staging = root / _PACKING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    for packed in plan:
        _copy_row_groups(
            [file_path(root, DATA_DIR, s) for s in packed.sources], file_path(staging, DATA_DIR, packed.target)
        )
    _repoint_episodes(root, moved)
    shutil.rmtree(root / DATA_DIR)
    (staging / DATA_DIR).rename(root / DATA_DIR)
    staging.rmdir()


def _uncompressed_mb(path: Path) -> float:
    import pyarrow.parquet as pq

    metadata = cast(Any, pq.read_metadata(path))
    total = 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        total += sum(row_group.column(c).total_uncompressed_size for c in range(row_group.num_columns))
    return total / (1024**2)


def _copy_row_groups(sources: list[Path], target: Path) -> None:
    """Append every row group of ``sources`` to a new file ``target`` with lerobot's writer settings."""
    import pyarrow.parquet as pq

    target.parent.mkdir(parents=True, exist_ok=True)
    schema = cast(Any, pq.read_schema(sources[0]))
    writer = cast(Any, pq.ParquetWriter)(str(target), schema, compression="snappy", use_dictionary=True)
    try:
        for source in sources:
            parquet = cast(Any, pq.ParquetFile(source))
            if not parquet.schema_arrow.equals(schema, check_metadata=False):
                raise DatasetWriteError(f"{source}: its columns differ from {sources[0]}'s; the parts cannot be packed")
            for group in range(parquet.num_row_groups):
                writer.write_table(parquet.read_row_group(group))
    finally:
        writer.close()


def _repoint_episodes(root: Path, moved: dict[ChunkFile, ChunkFile]) -> None:
    """Rewrite each episode's ``data/chunk_index`` / ``data/file_index`` to the packed file that holds its rows."""
    import pyarrow.parquet as pq

    for at in chunk_files(root, EPISODES_DIR):
        path = file_path(root, EPISODES_DIR, at)
        table = cast(Any, pq.read_table(path))
        chunks = cast(list[int], table.column(CHUNK_KEY).to_pylist())
        files = cast(list[int], table.column(FILE_KEY).to_pylist())
        missing = sorted({old for old in zip(chunks, files, strict=True) if old not in moved})
        if missing:
            raise DatasetWriteError(f"{path}: episodes point at data files {missing}, which the dataset does not hold")
        targets = [moved[old] for old in zip(chunks, files, strict=True)]
        table = _replaced(_replaced(table, CHUNK_KEY, [c for c, _ in targets]), FILE_KEY, [f for _, f in targets])
        pq.write_table(table, path)


def _replaced(table: Any, key: str, values: list[int]) -> Any:
    """``table`` with column ``key`` holding ``values``, its type and schema metadata kept."""
    import pyarrow as pa

    position = cast(int, table.schema.get_field_index(key))
    field = table.schema.field(position)
    return table.set_column(position, field, pa.array(values, type=field.type))
