"""Shared helpers of the dataset tests: synthetic episodes whose values say where they came from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame

os.environ["HF_HUB_OFFLINE"] = "1"

SPEC: dict[str, Any] = {"pos": {"shape": [2]}, "action": {"shape": [1]}}
"""A state-only dict spec (fps given separately)."""


def load(root: Path) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{root.name}", root=root)


def check_episodes(dataset: Any) -> list[int]:
    """Per episode: frames = actions = rows, frame_index 0..n-1, timestamps step by 1/fps, done at the end."""
    table = dataset.hf_dataset.with_format("numpy")[:]
    lengths: list[int] = []
    for episode in range(dataset.num_episodes):
        rows = table["episode_index"] == episode
        length = int(dataset.meta.episodes[episode]["length"])
        assert int(rows.sum()) == length
        assert len(table["action"][rows]) == length
        np.testing.assert_array_equal(table["frame_index"][rows], np.arange(length))
        np.testing.assert_allclose(np.diff(table["timestamp"][rows]), 1.0 / dataset.fps, atol=1e-6)
        assert bool(np.asarray(table["next.done"][rows])[-1])
        lengths.append(length)
    return lengths


def key(slot: int, episode: int = 0, instance: int = 0) -> EpisodeKey:
    return EpisodeKey(job="unit", task=0, instance=instance, slot=slot, episode=episode, seed=slot)


def frame(slot: int, step: int, *, last: bool = False) -> Frame:
    return Frame(
        index=step,
        observation={"pos": np.array([slot, step], dtype=np.float32)},
        action=np.array([slot * 100 + step], dtype=np.float32),
        reward=1.0,
        terminated=last,
        truncated=False,
        success=last,
    )


def outcome(status: EpisodeStatus, steps: int) -> EpisodeOutcome:
    return EpisodeOutcome(
        status=status, score=1.0, success=status is EpisodeStatus.SUCCEEDED, total_reward=steps, steps=steps
    )


def write_episodes(sink: EpisodeSink, count: int, *, steps: int = 4, instance: int = 0, first: int = 0) -> None:
    """``count`` successful episodes of ``steps`` frames, one slot after another."""
    for episode in range(first, first + count):
        episode_key = key(0, episode, instance)
        sink.begin(episode_key, f"episode {episode}")
        for step in range(steps):
            sink.add(episode_key, frame(episode, step, last=step == steps - 1))
        sink.end(episode_key, outcome(EpisodeStatus.SUCCEEDED, steps))
