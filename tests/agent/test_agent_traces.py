"""TraceRecorder: typed JSON lines per slot per episode, deterministic ids, optional camera video."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
from agent_helpers import CountdownSim

from hud_pipelines.agent.builtin import RandomPolicy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.recording.events import (
    EpisodeKey,
    EpisodeOutcome,
    EpisodeStatus,
    Frame,
    FrameBatch,
    Inference,
    InferenceBatch,
)
from hud_pipelines.recording.trace_reader import read_trace, read_traces
from hud_pipelines.recording.traces import StepType, TraceRecorder


def camera_contract() -> Contract:
    return Contract(
        control_rate=10.0,
        features={
            "front": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(33, 47, 3)),
            "joints": Feature(role="observation", dtype="float32", shape=(2,), names=["shoulder", "elbow"]),
            "action": Feature(role="action", dtype="float32", shape=(2,), names=["d_shoulder", "d_elbow"]),
        },
    )


def frame(index: int, *, done: bool = False) -> Frame:
    image = np.zeros((33, 47, 3), dtype=np.uint8)
    image[:, index % 47] = 255
    return Frame(
        index=index,
        observation={"front": image, "joints": np.array([index, -index], dtype=np.float32)},
        action=np.array([0.5, -0.5], dtype=np.float32),
        reward=float(index),
        terminated=done,
        truncated=False,
        success=done,
    )


def test_a_trace_holds_named_typed_steps_and_the_grade(tmp_path: Path) -> None:
    key = EpisodeKey("job/with slash", 1, 2, 3, 0, 42)
    with TraceRecorder(tmp_path, camera_contract(), video=True) as recorder:
        recorder.begin(key, "reach the cup")
        recorder.add_inferences(
            InferenceBatch.of(
                key, Inference(step=0, chunk=np.ones((4, 2), dtype=np.float32), latency_s=0.01, batch_size=8)
            )
        )
        for i in range(12):
            recorder.add_frames(FrameBatch.of(key, frame(i, done=i == 11)))
        outcome = EpisodeOutcome(EpisodeStatus.SUCCEEDED, 1.0, True, 66.0, 12, terminated=True)
        recorder.end(key, outcome)
    path = recorder.path(key)
    assert path == tmp_path / "job_with_slash" / f"{key.trace_id}.jsonl"
    trace = read_trace(path)
    assert trace.header["prompt"] == "reach the cup"
    assert trace.header["action_names"] == ["d_shoulder", "d_elbow"]
    assert trace.header["state_names"] == {"joints": ["shoulder", "elbow"]}
    (inference,) = trace.of_type(StepType.INFERENCE)
    assert inference["length"] == 4
    assert inference["names"] == ["d_shoulder", "d_elbow"]
    assert inference["batch_size"] == 8
    observations = trace.of_type(StepType.OBSERVATION)
    assert [o["state"]["joints"] for o in observations[:2]] == [
        {"shoulder": 0.0, "elbow": 0.0},
        {"shoulder": 1.0, "elbow": -1.0},
    ]
    assert all("front" not in o["state"] for o in observations), "camera pixels go to video, not JSON"
    assert trace.of_type(StepType.ACTION)[0]["action"] == {"d_shoulder": 0.5, "d_elbow": -0.5}
    assert [r["reward"] for r in trace.of_type(StepType.REWARD)] == [float(i) for i in range(12)]
    assert trace.grade is not None
    assert trace.grade["status"] == "succeeded"
    assert trace.grade["steps"] == 12
    (video,) = trace.videos
    with av.open(str(video)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 12
    assert frames[0].shape == (34, 48, 3), "odd sizes are padded for 4:2:0 encoding"


def test_errored_episodes_say_why_and_unfinished_ones_have_no_grade(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path)
    broken, open_ = EpisodeKey("j", 0, 0, 0, 0, 1), EpisodeKey("j", 0, 0, 1, 0, 2)
    recorder.begin(broken, "")
    recorder.begin(open_, "")
    recorder.add_frames(FrameBatch.of(open_, frame(0)))
    recorder.end(broken, EpisodeOutcome(EpisodeStatus.ERRORED, 0.0, False, 0.0, 0, error="sim crashed"))
    recorder.close()
    errored = read_trace(recorder.path(broken))
    assert errored.of_type(StepType.ERROR) == [{"type": "error", "message": "sim crashed"}]
    assert errored.grade is not None
    assert errored.grade["status"] == "errored"
    assert errored.grade["score"] is None, "no score, as grades.json says: a 0 would be averaged in as a failure"
    assert errored.grade["success"] is None, "nor a success or a failure"
    assert read_trace(recorder.path(open_)).grade is None
    with pytest.raises(KeyError, match="never begun"):
        recorder.add_frames(FrameBatch.of(broken, frame(1)))


def test_agent_traces_are_deterministic_per_key_and_cover_every_slot(tmp_path: Path) -> None:
    def rollout(root: Path) -> list[list[dict[str, object]]]:
        sim = CountdownSim([3, 5])
        agent = RobotAgent(RandomPolicy(sim.contract, seed=0, chunk_size=2), sim.contract)
        with TraceRecorder(root, sim.contract) as recorder:
            agent.run(sim, [{"seed": 10}, {"seed": 11}], max_steps=20, key=("det", 0, 0), sinks=[recorder])
        return [t.without_timing() for t in read_traces(root / "det")]

    first, second = rollout(tmp_path / "a"), rollout(tmp_path / "b")
    assert first == second
    assert [t[0]["slot"] for t in first] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "a" / "det").iterdir()) == sorted(
        p.name for p in (tmp_path / "b" / "det").iterdir()
    )
    assert [len([s for s in t if s["type"] == "reward"]) for t in first] == [3, 5]


def test_a_malformed_trace_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "trace", "trace_id": "x"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON line"):
        read_trace(path)
    path.write_text(json.dumps({"type": "telemetry"}) + "\n")
    with pytest.raises(ValueError, match="unknown step type 'telemetry'"):
        read_trace(path)
