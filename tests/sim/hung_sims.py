"""Sims that hang where real ones do: in a renderer that never returns, at start-up or on a step."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


def create_offscreen_gl_context() -> None:
    """Stands for an EGL/OSMesa context that never comes up (a missing or broken GPU driver)."""
    while True:
        time.sleep(0.05)


def hangs_rendering_at_start() -> gym.Env[Any, Any]:
    create_offscreen_gl_context()
    raise AssertionError("unreachable")


class _WaitsOnALock(gym.Env[np.ndarray, np.ndarray]):
    """Steps once, then its second step waits on a lock nobody releases (a deadlocked simulator)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        if self.steps > 1:
            wait_for_the_physics_lock()
        return np.zeros(2, np.float32), 0.0, False, False, {}


def wait_for_the_physics_lock() -> None:
    import threading

    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def hangs_on_its_second_step() -> gym.Env[Any, Any]:
    return _WaitsOnALock()
