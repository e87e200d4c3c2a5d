"""A sim whose observation size is a build argument, so a pipeline edit can change its contract's shape.

Loaded by path (``tests/contract_sims.py:sized``) from pipeline files the contract tests write.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt


class SizedEnv(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """Observation ``[dim]`` (or of shape ``dim``) of zeros, a one-dimensional Box action; episodes end after
    three steps."""

    def __init__(self, dim: int | list[int]) -> None:
        shape = tuple(dim) if isinstance(dim, list) else (dim,)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape, np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: Any) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.zeros(self.observation_space.shape, np.float32), 1.0, False, self.t >= 3, {}


def sized(dim: int | list[int] = 3) -> SizedEnv:
    return SizedEnv(dim)
