"""A small sim the tiny ACT checkpoints of ``tests/agent/checkpoint_runs.py`` can drive.

Its observation is the 2-d position (``pos``, concatenated into ``observation.state``) and a 3-d goal
(``goal``, renamed to ``observation.environment_state``), its action a 2-d velocity; an episode
succeeds when the point comes within reach of the goal. The goal is drawn from the reset seed, so
every checkpoint meets the same goals on the same (task, instance, slot), and checkpoints with
different weights act, and succeed, differently.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

REACH = 0.6
CRASH = "REACH2D_CRASH"
"""Set in the environment of the run, its sims die on their first step (a crash that changes no configuration)."""


class Reach2D(gym.Env[dict[str, np.ndarray], np.ndarray]):
    def __init__(self, reach: float = REACH) -> None:
        self.reach = reach
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-5.0, 5.0, (2,), np.float32),
                "goal": gym.spaces.Box(-5.0, 5.0, (3,), np.float32),
            }
        )
        self.action_space = gym.spaces.Box(-50.0, 50.0, (2,), np.float32)
        self._pos = np.zeros(2, np.float32)
        self._goal = np.zeros(3, np.float32)

    def _observation(self) -> dict[str, np.ndarray]:
        return {"pos": self._pos.copy(), "goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._pos = np.zeros(2, np.float32)
        self._goal = self.np_random.uniform(-1.0, 1.0, 3).astype(np.float32)
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if os.environ.get(CRASH):
            os._exit(9)
        self._pos = np.clip(self._pos + 0.1 * np.asarray(action, np.float32), -5.0, 5.0).astype(np.float32)
        distance = float(np.linalg.norm(self._pos - self._goal[:2]))
        success = distance < self.reach
        return self._observation(), -distance, success, False, {"is_success": success}


def sweep_pipeline(checkpoints: Any, **fields: Any) -> dict[str, Any]:
    """A sweep of the tiny ACT checkpoints of ``tests/agent/checkpoint_runs.py`` over :class:`Reach2D`."""
    return {
        "name": "reach_sweep",
        "sim": {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 2},
        "agent": {
            "policy": {
                "kind": "lerobot",
                "checkpoints": checkpoints,
                "device": "cpu",
                "rename": {"goal": "observation.environment_state"},
            }
        },
        "tasks": [{"name": "near", "seed": 10}, {"name": "far", "seed": 500}],
        "group": 2,
        "max_steps": 6,
        **fields,
    }
