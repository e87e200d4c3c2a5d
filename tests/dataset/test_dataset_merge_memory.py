"""A merge holds one part's rows at a time, and lays them out in the files lerobot's own merge writes.

lerobot's ``aggregate_datasets`` re-reads the merged data file for every part it appends, so its
memory grows with the episodes merged (``bench/memory.md``). The merge asks it for one file per
part and lays the rows out again itself, one episode at a time (:mod:`hud_pipelines.dataset.canonical`);
where the parts already hold their episodes in canonical order, the reference for that layout is
lerobot's concatenating merge of the same parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.canonical import lay_out_canonically
from hud_pipelines.dataset.merge import find_parts, merge_parts
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.recording.events import EpisodeStatus, Frame
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions
from tests.dataset.support import SPEC, check_episodes, key, load, outcome, write_episodes

REPO_ID = "local/merged"
EPISODES_PER_PART = (2, 3, 1, 2)
STEPS = 6


def write_parts(root: Path) -> list[Path]:
    """One part per shard, ``EPISODES_PER_PART`` episodes of ``STEPS`` frames each."""
    for instance, count in enumerate(EPISODES_PER_PART):
        with LeRobotDatasetSink(SPEC, root / f"shard-{instance}", fps=10) as sink:
            write_episodes(sink, count, steps=STEPS, instance=instance)
    return find_parts([root])


def camera_contract() -> Contract:
    return Contract(
        control_rate=10,
        robot_type="unit",
        features={
            "front": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(8, 8, 3)),
            "pos": Feature(role="observation", dtype="float32", shape=(2,)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )


def write_camera_parts(root: Path, storage: CameraStorage) -> list[Path]:
    """As :func:`write_parts`, with an 8x8 camera stored as ``storage``; pixels differ per episode and step."""
    options = DatasetOptions(cameras=storage)
    for instance, count in enumerate(EPISODES_PER_PART):
        with LeRobotDatasetSink(camera_contract(), root / f"shard-{instance}", options=options) as sink:
            for episode in range(count):
                episode_key = key(0, episode, instance)
                sink.begin(episode_key, "look")
                for step in range(STEPS):
                    pixels = np.full((8, 8, 3), (instance * 40 + episode * 10 + step) % 256, dtype=np.uint8)
                    observation = {"front": pixels, "pos": np.array([instance, step], dtype=np.float32)}
                    action = np.array([episode], dtype=np.float32)
                    last = step == STEPS - 1
                    frame = Frame(step, observation, action, 0.0, terminated=last, truncated=False, success=False)
                    sink.add(episode_key, frame)
                sink.end(episode_key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    return find_parts([root])


def data_tables_read(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Rows of every data table read from parquet from now on: whole files (``pandas.read_parquet`` included),
    and through a ``ParquetFile`` (a row group, or the whole file)."""
    rows: dict[str, list[int]] = {"files": [], "row groups": []}

    def counting(read: Any, into: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            table = read(*args, **kwargs)
            if "frame_index" in table.column_names:
                rows[into].append(table.num_rows)
            return table

        return wrapped

    monkeypatch.setattr(pq, "read_table", counting(pq.read_table, "files"))
    monkeypatch.setattr(pq.ParquetFile, "read", counting(pq.ParquetFile.read, "files"))
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting(pq.ParquetFile.read_row_group, "row groups"))
    return rows


def layout(root: Path) -> dict[str, tuple[int, int]]:
    """Each data file of a dataset: its rows and row groups."""
    files = sorted((root / "data").glob("*/*.parquet"))
    return {str(f.relative_to(root)): (pq.read_metadata(f).num_rows, pq.read_metadata(f).num_row_groups) for f in files}


def episode_files(root: Path) -> list[tuple[int, int, int]]:
    table = pq.read_table(sorted((root / "meta" / "episodes").glob("*/*.parquet")))
    columns = ("episode_index", "data/chunk_index", "data/file_index")
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def lerobot_merge(parts: list[Path], dest: Path, **sizes: Any) -> None:
    from lerobot.datasets.aggregate import aggregate_datasets

    aggregate_datasets(repo_ids=[REPO_ID] * len(parts), aggr_repo_id=REPO_ID, roots=parts, aggr_root=dest, **sizes)


def test_a_merge_never_reads_more_than_one_part_of_data_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = write_parts(tmp_path / "shards")
    rows = data_tables_read(monkeypatch)
    merged = merge_parts(parts, tmp_path / "merged", repo_id=REPO_ID)

    assert merged.episodes == sum(EPISODES_PER_PART)
    # lerobot's merge reads each part's rows once, never the rows merged so far
    assert rows["files"] == [count * STEPS for count in EPISODES_PER_PART]
    # and the canonical layout one episode at a time, each once
    assert rows["row groups"] == [STEPS] * sum(EPISODES_PER_PART)
    dataset = load(merged.root)
    assert check_episodes(dataset) == [STEPS] * sum(EPISODES_PER_PART)


@pytest.mark.parametrize("cameras", [None, CameraStorage.VIDEO, CameraStorage.IMAGE])
def test_parts_in_canonical_order_are_laid_out_in_the_files_lerobots_merge_writes(
    tmp_path: Path, cameras: CameraStorage | None
) -> None:
    parts = write_parts(tmp_path / "shards") if cameras is None else write_camera_parts(tmp_path / "shards", cameras)
    ours = merge_parts(parts, tmp_path / "ours", repo_id=REPO_ID).root
    lerobot_merge(parts, tmp_path / "lerobot")
    theirs = tmp_path / "lerobot"

    assert (
        layout(ours)
        == layout(theirs)
        == {"data/chunk-000/file-000.parquet": (sum(EPISODES_PER_PART) * STEPS, sum(EPISODES_PER_PART))}
    )
    assert pq.read_table(ours / "data").to_pylist() == pq.read_table(theirs / "data").to_pylist()
    assert episode_files(ours) == episode_files(theirs)
    # in the schema lerobot's writer gives the parts (its merge goes through pandas: plain lists), without the
    # fingerprint of one write that an image part's metadata holds
    written = pq.read_schema(next(parts[0].glob("data/*/*.parquet")))
    laid_out = pq.read_schema(ours / "data" / "chunk-000" / "file-000.parquet")
    assert laid_out.equals(written)
    features = [json.loads(schema.metadata[b"huggingface"])["info"] for schema in (laid_out, written)]
    assert features[0] == features[1]


def test_the_layout_rotates_files_at_the_size_limit_and_chunks_at_the_chunk_size(tmp_path: Path) -> None:
    """A size limit of two and a half episodes' rows and two files per chunk: several files in several chunks."""
    parts = write_parts(tmp_path / "shards")
    episode_bytes = pq.read_table(parts[0] / "data").slice(0, STEPS).nbytes
    sizes = {"data_files_size_in_mb": 2.5 * episode_bytes / 1024**2, "chunk_size": 2}
    lerobot_merge(parts, tmp_path / "aggregated", concatenate_data=False, **sizes)
    lay_out_canonically(tmp_path / "aggregated", tmp_path / "ours", consume=False)

    files = layout(tmp_path / "ours")
    episodes = sum(EPISODES_PER_PART)
    assert list(files) == [f"data/chunk-00{i // 2}/file-00{i % 2}.parquet" for i in range((episodes + 1) // 2)]
    assert all(rows == groups * STEPS and groups <= 2 for rows, groups in files.values())
    assert [(c, f) for _, c, f in episode_files(tmp_path / "ours")] == [(i // 4, i // 2 % 2) for i in range(episodes)]
    info = json.loads((tmp_path / "ours" / "meta" / "info.json").read_text())
    assert info["chunks_size"] == 2
    assert check_episodes(load(tmp_path / "ours")) == [STEPS] * episodes
