"""A sim whose observation holds an int64 tick counting past 2^24, which float32 would round."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

START = 2**25 + 1
"""33554433: float32 reads it 33554432."""


class TickEnv(gym.Env[dict[str, Any], np.ndarray]):
    """Five steps of reward 1; ``tick`` counts from :data:`START` plus the seed."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                "tick": spaces.Box(0, 2**40, shape=(1,), dtype=np.int64),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.tick = START

    def _observation(self) -> dict[str, Any]:
        return {"pos": np.zeros(2, np.float32), "tick": np.array([self.tick], np.int64)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        super().reset(seed=seed)
        self.tick = START + (seed or 0)
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict]:
        self.tick += 1
        return self._observation(), 1.0, self.tick - START >= 5, False, {}
