"""A trace's step lines are the JSON ``json.dumps`` writes for the same records, whatever the values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hud_pipelines.contract import Contract, Feature
from hud_pipelines.recording.events import EpisodeKey, Frame
from hud_pipelines.recording.trace_reader import read_trace
from hud_pipelines.recording.traces import TraceRecorder

KEY = EpisodeKey("job", 0, 0, 0, 0, 7)


def _expected(names: dict[str, list[str]], frame: Frame) -> list[dict[str, Any]]:
    """The three records of a step as the trace format defines them."""
    state = {
        feature: dict(zip(names[feature], np.asarray(v).reshape(-1).tolist(), strict=True))
        for feature, v in frame.observation.items()
    }
    action = dict(zip(names["action"], np.asarray(frame.action).reshape(-1).tolist(), strict=True))
    return [
        {"type": "observation", "step": frame.index, "state": state},
        {"type": "action", "step": frame.index, "action": action},
        {
            "type": "reward",
            "step": frame.index,
            "reward": frame.reward,
            "terminated": frame.terminated,
            "truncated": frame.truncated,
            "success": frame.success,
        },
    ]


@pytest.mark.parametrize("seed", range(5))
def test_step_lines_are_what_json_dumps_writes(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    joints = ['shoulder "pitch"', "elbow", "wrist/roll", "grip\u00e9"]  # names JSON must escape
    names = {"joints": joints, "count": ["n"], "contact": ["left", "right"], "action": ["a0", "a1"]}
    contract = Contract(
        control_rate=10.0,
        features={
            "joints": Feature(role="observation", dtype="float64", shape=(4,), names=names["joints"]),
            "count": Feature(role="observation", dtype="int64", shape=(1,), names=names["count"]),
            "contact": Feature(role="observation", dtype="bool", shape=(2,), names=names["contact"]),
            "action": Feature(role="action", dtype="float32", shape=(2,), names=names["action"]),
        },
    )
    recorder = TraceRecorder(tmp_path, contract)
    recorder.begin(KEY, "prompt")
    special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 123456789.123]
    frames = []
    for index in range(20):
        joints = rng.normal(size=4) * 10.0 ** rng.integers(-8, 8)
        joints[rng.integers(0, 4)] = special[index % len(special)]
        frame = Frame(
            index=index,
            observation={
                "joints": joints,
                "count": np.array([int(rng.integers(-5, 5))]),
                "contact": rng.random(2) > 0.5,
            },
            action=rng.normal(size=2).astype(np.float32),
            reward=float(rng.normal()) if index % 3 else special[index % len(special)],
            terminated=bool(index % 2),
            truncated=False,
            success=index == 19,
        )
        frames.append(frame)
        recorder.add(KEY, frame)
    recorder.close()
    lines = recorder.path(KEY).read_text().splitlines()[1:]  # after the header
    expected = [json.dumps(r, separators=(",", ":")) for f in frames for r in _expected(names, f)]
    assert lines == expected
    assert len(read_trace(recorder.path(KEY)).of_type("observation")) == len(frames), "and it reads back"
