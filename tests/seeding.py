"""The check that a sim's slots took the seeds they are credited with (in process and served alike)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SEEDS = [100, 999, 5, 7]
"""Reset after ``100, 101, 102, 103``: slot 0 repeats its seed, the others change theirs."""
FIRST = [100, 101, 102, 103]


def assert_honest_seeds(first: Any, second: Any, credited: list[int], env_id: str = "CartPole-v1") -> None:
    """Slot 0 (same seed) repeats, every other slot changed, and each equals a lone env reset with its seed."""
    assert credited == SEEDS
    np.testing.assert_array_equal(first[0], second[0])
    for slot in (1, 2, 3):
        assert not np.array_equal(first[slot], second[slot]), f"slot {slot} ignored its seed"
    for slot, seed in enumerate(SEEDS):
        alone, _ = gym.make(env_id).reset(seed=seed)
        np.testing.assert_array_equal(second[slot], alone)
