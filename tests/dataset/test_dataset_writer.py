"""The shard sink with real lerobot: a CartPole eval, interleaved slots, errored and aborted episodes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.dataset.publish import DatasetBuild
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.errors import DatasetWriteError, SlotStateError
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.dataset_options import DatasetOptions
from tests.dataset.rollouts import contract_of, rollout
from tests.dataset.support import SPEC, check_episodes, frame, key, load, outcome, write_episodes


def test_cartpole_eval_writes_a_dataset_lerobot_loads(tmp_path: Path) -> None:
    target = tmp_path / "cartpole"
    contract = contract_of("CartPole-v1")
    assert not contract.cameras
    with DatasetBuild(target, contract) as build:
        _, outcomes = rollout(build.sink("instance-0"), "CartPole-v1", num_envs=2, rounds=2, max_steps=40)
        published = build.publish()

    dataset = load(target)
    written = [o for o in outcomes if o.status is not EpisodeStatus.ERRORED]
    assert published.episodes == dataset.num_episodes == len(written) == 4
    assert dataset.fps == 50
    assert sorted(check_episodes(dataset)) == sorted(o.steps for o in written)
    assert {"observation.state", "action", "next.reward"} <= set(dataset.meta.stats)
    assert dataset.meta.features["observation.state"]["names"] == ["state_0", "state_1", "state_2", "state_3"]
    records = read_episode_records(target)
    assert [r["episode_index"] for r in records] == list(range(4))
    assert sorted((r["slot"], r["episode"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for record in records:
        assert record["frames"] == dataset.meta.episodes[record["episode_index"]]["length"]
    assert not list(tmp_path.glob(".cartpole.staging-*"))  # the staging directory is gone once published


def test_interleaved_slots_commit_whole_episodes_and_leave_errored_out(tmp_path: Path) -> None:
    sink = LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=DatasetOptions(writers=1))
    with sink:
        assert sink.wait_ready(timeout_s=120)
        for slot in range(3):
            sink.begin(key(slot), f"slot {slot}")
        for step in range(5):
            for slot in range(3):
                sink.add(key(slot), frame(slot, step, last=step == 4))
        sink.end(key(1), outcome(EpisodeStatus.ERRORED, 5))
        sink.end(key(2), outcome(EpisodeStatus.FAILED, 5))
        sink.end(key(0), outcome(EpisodeStatus.SUCCEEDED, 5))
        sink.begin(key(1, 1), "never ends")
        sink.add(key(1, 1), frame(1, 0))
        sink.begin(key(2, 1), "errored at reset")
        sink.end(key(2, 1), outcome(EpisodeStatus.ERRORED, 0))
    report = sink.report
    assert (report.episodes_written, report.frames_written) == (2, 10)
    assert (report.errored_dropped, report.aborted, report.empty_dropped) == (1, 1, 1)

    dataset = load(report.parts[0])
    table = dataset.hf_dataset.with_format("numpy")[:]
    # Whole episodes, in end order: slot 2 ended first, then slot 0; each slot's frames in step order.
    assert table["observation.state"][:, 0].tolist() == [2.0] * 5 + [0.0] * 5
    assert table["observation.state"][:, 1].tolist() == [0, 1, 2, 3, 4] * 2
    assert [dataset.meta.episodes[i]["tasks"] for i in range(2)] == [["slot 2"], ["slot 0"]]


def test_keep_errored_flags_errored_episodes(tmp_path: Path) -> None:
    options = DatasetOptions(writers=1, keep_errored=True)
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=options) as sink:
        for slot, status in enumerate([EpisodeStatus.SUCCEEDED, EpisodeStatus.ERRORED]):
            sink.begin(key(slot), "task")
            for step in range(3):
                sink.add(key(slot), frame(slot, step, last=step == 2))
            sink.end(key(slot), outcome(status, 3))
    assert sink.report.errored_kept == 1
    table = load(sink.report.parts[0]).hf_dataset.with_format("numpy")[:]
    assert np.asarray(table["episode.errored"]).reshape(-1).tolist() == [False] * 3 + [True] * 3
    records = read_episode_records(sink.report.parts[0])
    assert [r["status"] for r in records] == ["succeeded", "errored"]
    assert records[1]["score"] is None, "an errored episode has no score to average in, as in grades.json"
    assert [r["success"] for r in records] == [True, None], "nor a false to count as a failure"
    from hud_pipelines.dataset.summary import summarize_dataset

    assert summarize_dataset(sink.report.parts[0], thumbnail_episodes=0).success_rate == 1.0, "1 of 1 answered"


def test_sink_protocol_errors_name_the_episode(tmp_path: Path) -> None:
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        with pytest.raises(SlotStateError, match="not open"):
            sink.add(key(0), frame(0, 0))
        sink.begin(key(0), "task")
        with pytest.raises(SlotStateError, match="begun twice"):
            sink.begin(key(0), "task")
        with pytest.raises(SlotStateError, match="not open"):
            sink.end(key(1), outcome(EpisodeStatus.FAILED, 1))
    with pytest.raises(SlotStateError, match="closed"):
        sink.begin(key(3), "task")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "part-000").mkdir()
    with pytest.raises(DatasetWriteError, match="not empty"):
        LeRobotDatasetSink(SPEC, tmp_path / "used", fps=10)


def test_a_failing_writer_surfaces_at_close(tmp_path: Path) -> None:
    sink = LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10)
    (tmp_path / "shard" / "part-000").write_text("in the way")  # lerobot refuses to create over it
    sink.begin(key(0), "task")
    sink.add(key(0), frame(0, 0, last=True))
    sink.end(key(0), outcome(EpisodeStatus.SUCCEEDED, 1))
    with pytest.raises(DatasetWriteError, match="writer failed"):
        sink.close()
    assert not any(thread.is_alive() for thread in sink._writers)  # pyright: ignore[reportPrivateUsage]


def test_a_writer_failing_mid_run_keeps_its_committed_episodes_loadable(tmp_path: Path) -> None:
    sink = LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10)
    write_episodes(sink, 2)
    while sink.report.episodes_written < 2:
        time.sleep(0.05)
    sidecar = tmp_path / "shard" / "part-000" / "meta" / "hud_episodes.jsonl"
    sidecar.unlink()
    sidecar.mkdir()  # the next episode's bookkeeping fails after lerobot saved it
    write_episodes(sink, 1, first=2)
    with pytest.raises(DatasetWriteError, match="writer failed"):
        sink.close()
    dataset = load(tmp_path / "shard" / "part-000")
    assert dataset.num_episodes == 3
    check_episodes(dataset)


def test_several_writers_hold_the_same_episodes_in_each_part_however_fast_each_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers took episodes from one queue, whichever was free first: a part's episodes, and so the merged dataset's
    order, its episode indices and its stats, changed from run to run with the threads' timing."""
    from hud_pipelines.dataset.part import PartWriter

    write = PartWriter.write

    def slow_first_part(part: PartWriter, *args: object, **kwargs: object) -> None:
        if part.path.name.endswith("000"):
            time.sleep(0.3)  # a first part slow to write: before, the others took its episodes meanwhile
        write(part, *args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(PartWriter, "write", slow_first_part)
    sink = LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=DatasetOptions(writers=3, queued_episodes=9))
    with sink:
        assert sink.wait_ready(timeout_s=120)
        write_episodes(sink, 7)
    parts = sink.report.parts
    assert [[record["episode"] for record in read_episode_records(part)] for part in parts] == [
        [0, 3, 6],
        [1, 4],
        [2, 5],
    ]


def test_a_writer_whose_write_never_returns_stalls_nothing_past_close_timeout_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Episodes go to their writer in turn: one stuck in a write held the rollout that waits for it, and close(),
    for ever, where ``close_timeout_s`` bounds what a writer may take."""
    import threading

    from hud_pipelines.dataset.part import PartWriter

    write, released = PartWriter.write, threading.Event()

    def stuck_first_part(part: PartWriter, *args: object, **kwargs: object) -> None:
        if part.path.name.endswith("000"):
            released.wait(30)
        write(part, *args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(PartWriter, "write", stuck_first_part)
    options = DatasetOptions(writers=2, queued_episodes=2, close_timeout_s=1.0)
    sink = LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=options)
    try:
        assert sink.wait_ready(timeout_s=120)
        started = time.monotonic()
        with pytest.raises(DatasetWriteError, match="dataset-writer-shard-0 took no episode for 1 s"):
            write_episodes(sink, 8)
        with pytest.raises(DatasetWriteError, match=r"did not finish within 1\.0s"):
            sink.close()
        assert time.monotonic() - started < 10
    finally:
        released.set()
