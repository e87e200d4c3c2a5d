"""A dataset writer that fails mid-run (a full disk, a codec that refuses a frame) decides nothing of the
episodes: their grades stand, the instance's shard is marked incomplete, and the dataset is not published
until that instance runs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.dataset.part import FinishedEpisode, PartWriter
from hud_pipelines.errors import DatasetWriteError
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.loader import load_pipeline

REPO = Path(__file__).resolve().parents[2]


def _pipeline(path: Path, **fields: Any) -> Path:
    """A CartPole eval of two instances of two slots, named for its file, with ``fields`` over it."""
    spec: dict[str, Any] = {
        "name": path.stem,
        "sim": {"factory": "CartPole-v1", "num_envs": 2},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "group": 2,
        "max_steps": 15,
        "graders": [{"kind": "return", "threshold": 10}],
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    return path


def test_a_failed_dataset_writer_keeps_the_grades_and_holds_the_dataset_back_until_its_instance_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    target = tmp_path / "published"
    path = _pipeline(tmp_path / "pipelines" / "full_disk.yaml", dataset={"root": str(target), "repo_id": "local/fd"})
    pipeline = load_pipeline(path)
    write = PartWriter.write

    def full_disk_in_instance_1(self: PartWriter, item: FinishedEpisode, layout: Any) -> None:
        if item.key.instance == 1:
            raise OSError(28, "No space left on device")
        write(self, item, layout)

    monkeypatch.setattr(PartWriter, "write", full_disk_in_instance_1)
    with pytest.raises(DatasetWriteError) as raised:
        evaluate(pipeline, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    said = str(raised.value)
    assert "the dataset writer of 1 instance(s) failed, so their shards hold only part of their episodes" in said
    assert "(task0-i1: OSError: [Errno 28] No space left on device)" in said
    command = f"hud-pipelines run {path} --outputs {tmp_path / 'outputs'}"  # where its results are
    assert said.endswith(f"run them again: {command} --partition task0-i1"), said
    assert not target.exists(), "nothing published without the episodes of task0-i1"
    grades = json.loads((tmp_path / "outputs" / "full_disk" / "grades.json").read_text())
    assert len(grades) == 4
    assert {row["status"] for row in grades} == {EpisodeStatus.SUCCEEDED.value}, "recording decides no grade"
    stopped = "recording stopped in 1 instance(s), whose grades stand: task0-i1: dataset writer: OSError: [Errno 28]"
    report = tmp_path / "outputs" / "full_disk" / "report.md"
    assert stopped in report.read_text(), "the report says which instance's recording is partial"

    monkeypatch.setattr(PartWriter, "write", write)
    again = evaluate(
        pipeline,
        outputs_dir=tmp_path / "outputs",
        project_dir=REPO,
        partitions=[pipeline.partition_for_key("task0-i1")],
    )
    assert again.dataset is not None
    assert LeRobotDataset("local/fd", root=target).num_episodes == 4
    assert "recording stopped" not in report.read_text(), "run again, the instance recorded whole"


def test_a_trace_writer_that_fails_leaves_the_eval_passing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.recording.traces import TraceRecorder

    path = _pipeline(tmp_path / "traced.yaml")
    add_frames = TraceRecorder.add_frames

    def full_disk_in_instance_0(self: TraceRecorder, batch: Any) -> None:
        if batch.keys[0].instance == 0 and int(batch.index[0]) >= 3:
            raise OSError(28, "No space left on device")
        add_frames(self, batch)

    monkeypatch.setattr(TraceRecorder, "add_frames", full_disk_in_instance_0)
    evaluation = evaluate(load_pipeline(path), outputs_dir=tmp_path / "outputs", project_dir=REPO)
    assert evaluation.passed
    assert {row.status for row in evaluation.rows} == {EpisodeStatus.SUCCEEDED}
    [partial] = [result for result in evaluation.results if result.recording]
    assert (partial.key, partial.recording) == ("task0-i0", ("traces: OSError: [Errno 28] No space left on device",))
    assert "task0-i0: traces: OSError" in (tmp_path / "outputs" / "traced" / "report.md").read_text()


def test_a_dataset_writer_that_cannot_even_start_leaves_the_instance_running_and_its_shard_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dataset.shards import ShardStore

    path = _pipeline(tmp_path / "no_start.yaml", dataset={"root": str(tmp_path / "published")})
    sink = ShardStore.sink

    def no_space_for_task0_i1(self: ShardStore, partition_key: str, contract: Any) -> Any:
        if partition_key == "task0-i1":
            raise OSError(28, "No space left on device")
        return sink(self, partition_key, contract)

    monkeypatch.setattr(ShardStore, "sink", no_space_for_task0_i1)
    with pytest.raises(DatasetWriteError, match=r"\(task0-i1: OSError: \[Errno 28\] No space left on device\)"):
        evaluate(load_pipeline(path), outputs_dir=tmp_path / "outputs", project_dir=REPO)
    grades = json.loads((tmp_path / "outputs" / "no_start" / "grades.json").read_text())
    assert [row["status"] for row in grades] == [EpisodeStatus.SUCCEEDED.value] * 4, "the instance ran all the same"


def test_a_resumed_run_runs_again_the_instances_whose_dataset_shard_is_partial(tmp_path: Path) -> None:
    """ "Re-execute from failure" keeps the instances its run finished; one whose writer failed must run again, or
    the resumed run fails at the dataset step as its parent did."""
    import dataclasses

    from hud_pipelines.dataset.shards import INCOMPLETE_FILE
    from hud_pipelines.eval.results import InstanceResult
    from hud_pipelines.eval.rollouts import finished_by

    path = _pipeline(tmp_path / "resumed.yaml", max_steps=5, dataset={"root": str(tmp_path / "published")})
    pipeline = load_pipeline(path)
    first = evaluate(pipeline, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    traces_only = dataclasses.replace(first.results[0], recording=("traces: OSError: [Errno 28] full",))
    traces_only.write(first.outputs.result(traces_only.key))  # its shard is whole: kept
    assert InstanceResult.read(first.outputs.result(traces_only.key)).recording == traces_only.recording
    (first.outputs.shard("task0-i1") / INCOMPLETE_FILE).write_text("OSError: [Errno 28] full")
    todo, kept = finished_by(pipeline, first.outputs, pipeline.partitions(), {first.run_id})
    assert [r.key for r in kept] == ["task0-i0"]
    assert [pipeline.partition_key(*p) for p in todo] == ["task0-i1"]


def test_a_dataset_root_where_no_folder_can_be_made_is_named_with_the_grades_kept(tmp_path: Path) -> None:
    """Before, the dataset step failed with a bare ``NotADirectoryError`` of the first folder it could not make."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    target = blocker / "datasets" / "cartpole"
    path = _pipeline(tmp_path / "pipelines" / "blocked.yaml", dataset={"root": str(target)})
    with pytest.raises(DatasetWriteError, match=f"blocked: cannot write the dataset at {target}: ") as raised:
        evaluate(load_pipeline(path), outputs_dir=tmp_path / "outputs", project_dir=REPO)
    assert "Not a directory" in str(raised.value)
    grades = json.loads((tmp_path / "outputs" / "blocked" / "grades.json").read_text())
    assert {row["status"] for row in grades} == {EpisodeStatus.SUCCEEDED.value}, "the grades stand"
