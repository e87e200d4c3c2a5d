"""A trace's step lines are the JSON ``json.dumps`` writes for the same records, whatever the values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hud_pipelines.contract import Contract, Feature
from hud_pipelines.recording.events import EpisodeKey, Frame, FrameBatch, InferenceBatch
from hud_pipelines.recording.trace_reader import read_trace
from hud_pipelines.recording.traces import TraceRecorder


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


KEYS = [EpisodeKey("job", 0, 0, slot, 0, 7) for slot in range(3)]
"""Three slots stepped together: a batch's rows share each feature's formatting, yet each is its own."""


def _stacked(frames: list[Frame]) -> FrameBatch:
    """One tick of ``KEYS``'s slots as the agent loop hands it to a sink."""
    return FrameBatch(
        keys=KEYS,
        index=np.array([f.index for f in frames], dtype=np.int64),
        observation={name: np.stack([f.observation[name] for f in frames]) for name in frames[0].observation},
        action=np.stack([f.action for f in frames]),
        reward=np.array([f.reward for f in frames]),
        terminated=np.array([f.terminated for f in frames]),
        truncated=np.array([f.truncated for f in frames]),
        success=np.array([f.success for f in frames]),
    )


@pytest.mark.parametrize("seed", range(5))
def test_step_lines_are_what_json_dumps_writes(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    joints = ['shoulder "pitch"', "elbow", "wrist/roll", "grip\u00e9"]  # names JSON must escape
    names = {
        "joints": joints,
        "count": ["n"],
        "contact": ["left", "right"],
        "grid": [f"g{i}" for i in range(6)],
        "half": ["h0", "h1"],
        "ticks": ["t"],
        "action": ["a0", "a1"],
    }
    contract = Contract(
        control_rate=10.0,
        features={
            "joints": Feature(role="observation", dtype="float64", shape=(4,), names=names["joints"]),
            "count": Feature(role="observation", dtype="int64", shape=(1,), names=names["count"]),
            "contact": Feature(role="observation", dtype="bool", shape=(2,), names=names["contact"]),
            "grid": Feature(role="observation", dtype="float32", shape=(2, 3), names=names["grid"]),
            "half": Feature(role="observation", dtype="float16", shape=(2,), names=names["half"]),
            "ticks": Feature(role="observation", dtype="uint64", shape=(1,), names=names["ticks"]),
            "action": Feature(role="action", dtype="float32", shape=(2,), names=names["action"]),
        },
    )
    recorder = TraceRecorder(tmp_path, contract)
    for key in KEYS:
        recorder.begin(key, "prompt")
    special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 123456789.123]
    frames: dict[EpisodeKey, list[Frame]] = {key: [] for key in KEYS}
    for index in range(20):
        tick: list[Frame] = []
        for slot in range(len(KEYS)):
            joints = rng.normal(size=4) * 10.0 ** rng.integers(-8, 8)
            grid = (rng.normal(size=(2, 3)) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
            if slot == index % len(KEYS):  # one row of the tick holds a special value, the others none
                joints[rng.integers(0, 4)] = special[index % len(special)]
                grid[1, 2] = np.float32(special[(index + 1) % len(special)])
            tick.append(
                Frame(
                    index=index,
                    observation={
                        "joints": joints,
                        "count": np.array([int(rng.integers(-5, 5))]),
                        "contact": rng.random(2) > 0.5,
                        "grid": grid,
                        "half": rng.normal(size=2).astype(np.float16),
                        "ticks": np.array([2**63 + int(rng.integers(0, 1000))], dtype=np.uint64),
                    },
                    action=rng.normal(size=2).astype(np.float32),
                    reward=float(rng.normal()) if (index + slot) % 3 else special[index % len(special)],
                    terminated=bool((index + slot) % 2),
                    truncated=slot == 2,
                    success=index == 19,
                )
            )
        for key, frame in zip(KEYS, tick, strict=True):
            frames[key].append(frame)
        recorder.add_frames(_stacked(tick))
    recorder.close()
    for key in KEYS:
        lines = recorder.path(key).read_text().splitlines()[1:]  # after the header
        expected = [json.dumps(r, separators=(",", ":")) for f in frames[key] for r in _expected(names, f)]
        assert lines == expected, f"slot {key.slot}"
        assert len(read_trace(recorder.path(key)).of_type("observation")) == len(frames[key]), "and it reads back"


def test_a_chunk_that_is_not_n_by_t_by_a_is_refused_naming_its_shape() -> None:
    with pytest.raises(ValueError, match=r"\[n, T, A\]; got shape \[3, 2\]"):
        InferenceBatch(
            keys=KEYS, step=np.zeros(3, dtype=np.int64), chunk=np.zeros((3, 2), np.float32), latency_s=0.0, batch_size=3
        )


def test_a_batch_of_one_writes_what_its_row_in_a_larger_batch_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tick = [
        Frame(
            index=4,
            observation={"joints": rng.normal(size=4)},
            action=rng.normal(size=2).astype(np.float32),
            reward=float(rng.normal()),
            terminated=False,
            truncated=False,
            success=False,
        )
        for _ in KEYS
    ]
    together, alone = TraceRecorder(tmp_path / "together"), TraceRecorder(tmp_path / "alone")
    for key in KEYS:
        together.begin(key, "")
        alone.begin(key, "")
    together.add_frames(_stacked(tick))
    for key, frame in zip(KEYS, tick, strict=True):
        alone.add_frames(FrameBatch.of(key, frame))
    together.close()
    alone.close()
    for key in KEYS:
        assert together.path(key).read_text().splitlines()[1:] == alone.path(key).read_text().splitlines()[1:]


@pytest.mark.parametrize("seed", range(3))
def test_inference_lines_are_what_json_dumps_writes(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    action_names = ['x "1"', "y", "z\u00e9"]
    contract = Contract(
        control_rate=10.0, features={"action": Feature(role="action", dtype="float32", shape=(3,), names=action_names)}
    )
    recorder = TraceRecorder(tmp_path, contract)
    for key in KEYS:
        recorder.begin(key, "prompt")
    expected: dict[EpisodeKey, list[str]] = {key: [] for key in KEYS}
    for index in range(8):
        length = int(rng.integers(1, 6))
        chunks = (rng.normal(size=(len(KEYS), length, 3)) * 10.0 ** rng.integers(-8, 8)).astype(np.float32)
        if index == 5:
            chunks[1, 0, 1] = math.nan  # a caller may hand anything: the text still matches json.dumps
        if index == 6:
            chunks[2, -1, 0] = -math.inf
        batch = InferenceBatch(
            keys=KEYS,
            step=np.array([index * 3 + slot for slot in range(len(KEYS))], dtype=np.int64),
            chunk=chunks,
            latency_s=float(rng.uniform(0, 0.1)),
            batch_size=index + 1,
        )
        recorder.add_inferences(batch)
        for row, key in enumerate(KEYS):
            record = {
                "type": "inference",
                "step": index * 3 + row,
                "length": length,
                "names": action_names,
                "chunk": chunks[row].tolist(),
                "latency_s": batch.latency_s,
                "batch_size": batch.batch_size,
            }
            expected[key].append(json.dumps(record, separators=(",", ":")))
    recorder.close()
    for key in KEYS:
        assert recorder.path(key).read_text().splitlines()[1:] == expected[key], f"slot {key.slot}"
        assert len(read_trace(recorder.path(key)).of_type("inference")) == 8, "and it reads back"
