"""A merged dataset holds its episodes by task, then seed, whatever order its parts held them in.

The parts here hold one task's episodes each, in an order no schedule of the seeds would repeat:
the merge must give the same files in whatever order it is handed them, tasks numbered by their
first episode, every row pointing at its own episode's task string and values.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hud_pipelines.dataset.merge import find_parts, merge_parts, read_episode_records
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.recording.events import EpisodeKey, EpisodeStatus
from tests.dataset.support import SPEC, check_episodes, frame, load, outcome

REPO_ID = "local/ordered"
STEPS = 5
PARTS = {  # shard -> (task, seed) of its episodes, in the order they ended; None: an unseeded episode
    "a-late-task": [(1, 12), (1, 10), (1, None), (1, 11)],
    "b-first-task": [(0, 3), (0, None), (0, 1), (0, 2)],
}


def write_shards(root: Path) -> list[Path]:
    for instance, (shard, episodes) in enumerate(PARTS.items()):
        with LeRobotDatasetSink(SPEC, root / shard, fps=10) as sink:
            for slot, (task, seed) in enumerate(episodes):
                key = EpisodeKey(job="unit", task=task, instance=instance, slot=slot, episode=0, seed=seed)
                sink.begin(key, f"task {task}")
                for step in range(STEPS):  # the state says which seed (-1: none) each row belongs to
                    sink.add(key, frame(-1 if seed is None else seed, step, last=step == STEPS - 1))
                sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    return find_parts([root])


def files_of(root: Path) -> dict[str, bytes]:
    kept = (p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "hud_episodes.jsonl")
    return {str(p.relative_to(root)): p.read_bytes() for p in kept}


def test_episodes_come_out_by_task_then_seed_with_tasks_numbered_by_their_first_episode(tmp_path: Path) -> None:
    parts = write_shards(tmp_path / "shards")
    merged = merge_parts(parts, tmp_path / "merged", repo_id=REPO_ID).root

    records = read_episode_records(merged)
    placed = [(r["episode_index"], r["task"], r["seed"]) for r in records]
    assert placed == [
        (0, 0, 1), (1, 0, 2), (2, 0, 3), (3, 0, None), (4, 1, 10), (5, 1, 11), (6, 1, 12), (7, 1, None),
    ]  # fmt: skip
    tasks = pq.read_table(merged / "meta" / "tasks.parquet").to_pandas()
    assert tasks["task_index"].to_dict() == {"task 0": 0, "task 1": 1}  # lerobot's merge numbered "task 1" first

    dataset = load(merged)
    assert check_episodes(dataset) == [STEPS] * 8
    for index in range(dataset.num_frames):
        item = dataset[index]
        episode = int(item["episode_index"])
        _, task, seed = placed[episode]
        assert item["task"] == f"task {task}"
        assert int(item["task_index"]) == task
        assert int(item["index"]) == index
        assert float(item["observation.state"][0]) == (-1 if seed is None else seed)
    stats = json.loads((merged / "meta" / "stats.json").read_text())
    assert stats["episode_index"]["max"] == [7]
    assert stats["index"]["max"] == [8 * STEPS - 1]
    assert stats["task_index"]["mean"] == [0.5]
    state = np.asarray(dataset.hf_dataset.with_format("numpy")[:]["observation.state"])
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(axis=0), rtol=1e-6)


def test_the_merge_gives_the_same_files_whatever_order_it_is_handed_the_parts(tmp_path: Path) -> None:
    parts = write_shards(tmp_path / "shards")
    forward = merge_parts(parts, tmp_path / "forward", repo_id=REPO_ID).root
    backward = merge_parts(parts[::-1], tmp_path / "backward", repo_id=REPO_ID).root

    assert files_of(forward) == files_of(backward)
    assert [r["seed"] for r in read_episode_records(forward)] == [r["seed"] for r in read_episode_records(backward)]


def test_a_single_part_is_laid_out_in_the_same_order(tmp_path: Path) -> None:
    """One part is copied, or moved, rather than merged by lerobot: its episodes are ordered all the same."""
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        for slot, seed in enumerate([5, None, 4, 6]):
            key = EpisodeKey(job="unit", task=0, instance=0, slot=slot, episode=0, seed=seed)
            sink.begin(key, "the task")
            for step in range(STEPS):
                sink.add(key, frame(slot, step, last=step == STEPS - 1))
            sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    (part,) = find_parts([tmp_path / "shard"])
    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID, move_single=True).root

    assert not part.exists()
    assert [(r["seed"], r["slot"]) for r in read_episode_records(merged)] == [(4, 2), (5, 0), (6, 3), (None, 1)]
    dataset = load(merged)
    assert check_episodes(dataset) == [STEPS] * 4
    slots = dataset.hf_dataset.with_format("numpy")[:]["observation.state"][:, 0]
    np.testing.assert_array_equal(slots, np.repeat([2, 0, 3, 1], STEPS))
