"""Sims whose ``reset`` needs its task's options, as many benchmarks' do: the start-up probe must give them.

Each env records the ``(seed, options)`` of every reset it gets, so a test can tell the probe reset
(the first, at build time) from the episodes' resets.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt


class NeedsOptions(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """Observation ``[difficulty] * size``; its ``reset`` raises ``KeyError`` without ``options['difficulty']``."""

    metadata: dict[str, Any] = {"render_fps": 10}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self, size: int = 2) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.size = size
        self.difficulty = 0.0
        self.resets: list[tuple[int | None, dict[str, Any] | None]] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.resets.append((seed, options))
        if not options or "difficulty" not in options:
            raise KeyError("reset needs options['difficulty']")
        self.difficulty = float(options["difficulty"])
        return np.full(self.size, self.difficulty, np.float32), {}

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        return np.full(self.size, self.difficulty, np.float32), 0.0, False, False, {}


def needs_options(size: int = 2) -> NeedsOptions:
    return NeedsOptions(size)


def needs_options_vector(num_envs: int, size: int = 2) -> gym.vector.SyncVectorEnv:
    """The same env as one vector env of ``num_envs`` (a factory that batches natively)."""
    return gym.vector.SyncVectorEnv([lambda: NeedsOptions(size) for _ in range(num_envs)])


def needs_options_async(num_envs: int, size: int = 2) -> gym.vector.AsyncVectorEnv:
    """The same env in worker processes: a worker whose reset raised exits, so a later probe needs envs built anew."""
    return gym.vector.AsyncVectorEnv([lambda: NeedsOptions(size) for _ in range(num_envs)], context="spawn")
