"""Sims for the sharding tests: an env that logs when each of its steps ran, in which process.

Loaded by path (``tests/sim/shard_sims.py:timed``) in the sim children.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt


class TimedEnv(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """Observation ``[t]``; every step sleeps ``delay_s`` and appends ``{pid, start, end}`` to ``log``."""

    metadata: dict[str, Any] = {}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self, log: str, delay_s: float) -> None:
        self.log = Path(log)
        self.delay_s = delay_s
        self.observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t], dtype=np.float32), {}

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        start = time.time()
        time.sleep(self.delay_s)
        self.t += 1
        with self.log.open("a") as out:
            out.write(json.dumps({"pid": os.getpid(), "start": start, "end": time.time()}) + "\n")
        return np.array([self.t], dtype=np.float32), 1.0, False, False, {}


def timed(log: str, delay_s: float = 0.1) -> TimedEnv:
    """A :class:`TimedEnv` logging to ``log``."""
    return TimedEnv(log, delay_s)


class JammingEnv(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """Observation ``[t]``; an episode whose seed is below ``below`` raises in its own words at ``phase``
    (``reset``, or ``step`` at step 2)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self, below: int, phase: str) -> None:
        self.below = below
        self.phase = phase
        self.observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.seed_value = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.t, self.seed_value = 0, seed if seed is not None else self.below
        if self.phase == "reset" and self.seed_value < self.below:
            raise RuntimeError(f"the gripper of seed {seed} jammed at reset")
        return np.array([self.t], dtype=np.float32), {}

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.phase == "step" and self.t == 2 and self.seed_value < self.below:
            raise RuntimeError(f"the gripper of seed {self.seed_value} jammed at step {self.t}")
        return np.array([self.t], dtype=np.float32), 1.0, False, False, {}


def jamming(below: int, phase: str = "step") -> JammingEnv:
    """A :class:`JammingEnv`."""
    return JammingEnv(below, phase)
