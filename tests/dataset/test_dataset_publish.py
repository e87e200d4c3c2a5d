"""Merging shards and publishing atomically: the published path never holds a half-written dataset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hud_pipelines.dataset.merge import find_parts
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.dataset.publish import OWNER_FILE, DatasetBuild, publish_shards, swap_in
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.errors import DatasetWriteError, EmptyDatasetError
from hud_pipelines.spec.dataset_options import DatasetOptions
from tests.conftest import signal_state
from tests.dataset.rollouts import contract_of, rollout
from tests.dataset.support import SPEC, check_episodes, load, write_episodes

REPO = Path(__file__).resolve().parents[2]


def children_of(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for task in tasks.iterdir() for c in (task / "children").read_text().split()]


def publish(target: Path, episodes_per_shard: list[int], **options: object) -> None:
    with DatasetBuild(target, SPEC, fps=10, options=DatasetOptions.model_validate(options)) as build:
        for instance, count in enumerate(episodes_per_shard):
            write_episodes(build.sink(f"instance-{instance}"), count, instance=instance)
        build.publish()


def test_two_instances_shards_merge_into_one_dataset(tmp_path: Path) -> None:
    target = tmp_path / "cartpole"
    contract = contract_of("CartPole-v1")
    with DatasetBuild(target, contract, options=DatasetOptions(writers=2)) as build:
        _, first = rollout(build.sink(0), "CartPole-v1", num_envs=2, rounds=2, max_steps=30, instance=0)
        _, second = rollout(build.sink(1), "CartPole-v1", num_envs=1, rounds=3, max_steps=30, instance=1, seed=50)
        published = build.publish()

    parts = [part for report in published.sinks.values() for part in report.parts]
    assert len(parts) > 2  # two instances, two writers each: several parts were merged
    dataset = load(target)
    assert published.episodes == dataset.num_episodes == len(first) + len(second) == 7
    assert sorted(check_episodes(dataset)) == sorted(o.steps for o in first + second)
    records = read_episode_records(target)
    assert [r["episode_index"] for r in records] == list(range(7))
    assert sorted(r["instance"] for r in records) == [0, 0, 0, 0, 1, 1, 1]
    for record in records:  # the sidecar's offsets follow lerobot's merge order
        assert record["frames"] == dataset.meta.episodes[record["episode_index"]]["length"]


@pytest.mark.parametrize("keep_errored", [False, True])
def test_an_episode_of_one_frame_alone_in_its_part_merges_with_longer_ones(tmp_path: Path, keep_errored: bool) -> None:
    """lerobot gives a one-frame episode ``bool`` min/max stats of a boolean feature and a longer one ``float64``:
    its merge of the parts failed on the mix ("Cannot mix NumPy dtypes float64 and bool") and the whole dataset
    with it, whenever such an episode (an env that ends at its first step, an errored one kept) had a part alone."""
    target = tmp_path / "short"
    with DatasetBuild(target, SPEC, fps=10, options=DatasetOptions(keep_errored=keep_errored)) as build:
        write_episodes(build.sink("instance-0"), 2, steps=4)
        write_episodes(build.sink("instance-1"), 1, steps=1, instance=1)
        published = build.publish()
    dataset = load(target)
    assert published.episodes == dataset.num_episodes == 3
    assert sorted(check_episodes(dataset)) == [1, 4, 4]
    done = dataset.meta.stats["next.done"]
    assert (done["min"].dtype, done["max"].dtype) == (np.float64, np.float64)
    assert (float(done["min"][0]), float(done["max"][0])) == (0.0, 1.0)


def test_a_new_materialization_replaces_the_old_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "rollouts"
    publish(target, [2])
    assert load(target).num_episodes == 2
    publish(target, [3, 1], writers=1)
    dataset = load(target)
    assert dataset.num_episodes == 4
    check_episodes(dataset)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts"]  # no staging, no old copy left


def test_swap_in_exchanges_directories(tmp_path: Path) -> None:
    old, new = tmp_path / "published", tmp_path / "new"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "info.json").write_text('{"v": 1}')
    (new / "meta").mkdir(parents=True)
    (new / "meta" / "info.json").write_text('{"v": 2}')
    swap_in(new, old)
    assert json.loads((old / "meta" / "info.json").read_text()) == {"v": 2}
    assert not new.exists()


def test_publishing_never_replaces_what_is_not_a_dataset(tmp_path: Path) -> None:
    target = tmp_path / "home"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    with pytest.raises(DatasetWriteError, match="not a lerobot dataset"):
        DatasetBuild(target, SPEC, fps=10)
    assert (target / "notes.txt").read_text() == "precious"


def test_nothing_to_publish_keeps_the_old_dataset(tmp_path: Path) -> None:
    target = tmp_path / "rollouts"
    publish(target, [2])
    with DatasetBuild(target, SPEC, fps=10) as build:
        build.sink("instance-0")
        with pytest.raises(EmptyDatasetError):
            build.publish()
    assert load(target).num_episodes == 2


def test_leftovers_of_interrupted_builds_are_recovered(tmp_path: Path) -> None:
    target = tmp_path / "rollouts"
    publish(target, [2])
    aside = tmp_path / ".rollouts.old-dead"
    target.rename(aside)  # a publish died between its two renames
    dead = tmp_path / ".rollouts.staging-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 1}))
    alive = tmp_path / ".rollouts.staging-alive"
    alive.mkdir()
    (alive / OWNER_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid()}))
    with DatasetBuild(target, SPEC, fps=10) as build:
        assert load(target).num_episodes == 2
        assert not aside.exists()
        assert not dead.exists()
        assert alive.exists()
        write_episodes(build.sink("x"), 1)
        build.publish()
    assert load(target).num_episodes == 1


@pytest.mark.slow
def test_sigterm_mid_write_leaves_the_published_dataset_intact(tmp_path: Path) -> None:
    target = tmp_path / "rollouts"
    publish(target, [3])
    before = (target / "meta" / "info.json").read_text()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.dataset.sigterm_writer", str(target)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("READY"), process.communicate(timeout=60)[1][-3000:]
        staging = Path(line.split()[1])
        children = children_of(process.pid)
        assert not children, "writer threads start no process"
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            state = signal_state(process.pid)
            process.send_signal(signal.SIGUSR1)  # every thread's stack, then fail with them
            time.sleep(2)
            process.kill()
            _, stacks = process.communicate()
            pytest.fail(f"the writer did not end within 120 s of SIGTERM ({state}); its threads:\n{stacks[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert process.returncode != 0
    assert "Terminated" in stderr
    assert (target / "meta" / "info.json").read_text() == before
    dataset = load(target)
    assert dataset.num_episodes == 3
    check_episodes(dataset)
    # finalize ran on the way out: every part of the cancelled build is complete and loads.
    parts = find_parts([staging])
    assert parts
    assert sum(load(part).num_episodes for part in parts) >= 6


def test_shards_written_elsewhere_are_published_untouched(tmp_path: Path) -> None:
    shards = [tmp_path / "runs" / name for name in ("partition-a", "partition-b")]
    for instance, (shard, count) in enumerate(zip(shards, [2, 3], strict=True)):
        with LeRobotDatasetSink(SPEC, shard, fps=10) as sink:
            write_episodes(sink, count, instance=instance)
    target = tmp_path / "published"
    result = publish_shards(shards, target)
    assert result.episodes == load(target).num_episodes == 5
    assert [load(part).num_episodes for part in find_parts(shards)] == [2, 3]  # read, never moved
    assert sorted(r["instance"] for r in read_episode_records(target)) == [0, 0, 1, 1, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["published", "runs"]


def test_a_part_a_killed_writer_left_is_merged_out(tmp_path: Path) -> None:
    shards = [tmp_path / "runs" / name for name in ("partition-a", "partition-b", "partition-c")]
    for instance, shard in enumerate(shards):
        with LeRobotDatasetSink(SPEC, shard, fps=10) as sink:
            write_episodes(sink, 2, instance=instance)
    (data,) = (shards[1] / "part-000" / "data").glob("*/*.parquet")
    data.write_bytes(data.read_bytes()[:-64])  # no parquet footer: its writer never finalized
    (episodes,) = (shards[2] / "part-000" / "meta" / "episodes").glob("*/*.parquet")
    episodes.unlink()  # the episode metadata never reached the disk

    result = publish_shards(shards, tmp_path / "published")
    assert [(part.parent.name, reason.split(":")[0]) for part, reason in result.skipped_parts] == [
        ("partition-b", "unreadable"),
        ("partition-c", "its files hold 0 episodes / 8 frames of 2 / 8 (not finalized)"),
    ]
    dataset = load(tmp_path / "published")
    assert dataset.num_episodes == result.episodes == 2
    check_episodes(dataset)
