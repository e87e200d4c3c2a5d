"""An env whose success is reported on some steps only: it reaches its goal, and on odd seeds leaves it.

Every episode runs ``length`` steps (then truncates). The goal is reached at step 2; an even seed
holds it to the end, an odd seed leaves it at step 3. So success at any step is every episode's,
success at the end only the even seeds'.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

Obs = npt.NDArray[np.float32]


class HeldGoal(gym.Env[Obs, Obs]):
    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t = 0
        self._holds = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Obs, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._holds = seed is None or seed % 2 == 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Obs) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        self._t += 1
        at_goal = self._t >= 2 and (self._holds or self._t < 3)
        return np.full(1, self._t, np.float32), float(at_goal), False, self._t >= self.length, {"is_success": at_goal}


def make(**kwargs: Any) -> HeldGoal:
    return HeldGoal(**kwargs)
