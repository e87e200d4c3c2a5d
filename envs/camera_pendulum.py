"""A pendulum seen through a 96x96 RGB camera: a cheap sim whose observation is mostly pixels.

The dynamics are gymnasium's Pendulum; every step also renders the rod into a ``96x96x3`` ``uint8``
image with numpy (a few tens of microseconds), so the cost of moving camera frames shows up next to
a sim that is not free. :func:`camera_pendulum` takes ``num_envs`` and returns a ``SyncVectorEnv``,
so a served sim and an in-process loop vectorize it the same way.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

SIZE = 96
ROD_HALF_WIDTH = 3.0
MAX_EPISODE_STEPS = 200


class CameraPendulumEnv(gym.Env[Any, npt.NDArray[np.float32]]):
    """Observation ``{"pixels": uint8[96, 96, 3], "state": float32[3]}``; action: torque in ``[-2, 2]``."""

    metadata: dict[str, Any] = {"render_fps": 30}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self) -> None:
        self.pendulum = gym.make("Pendulum-v1").unwrapped
        self.observation_space = gym.spaces.Dict(
            {
                "pixels": gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8),
                "state": self.pendulum.observation_space,
            }
        )
        self.action_space = self.pendulum.action_space
        rows, columns = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
        self._x = columns - SIZE / 2
        self._y = SIZE / 2 - rows
        self._frame = np.empty((SIZE, SIZE, 3), dtype=np.uint8)

    def _render(self, state: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        """Background, then the rod as every pixel within a few pixels of the segment from the pivot."""
        cos, sin = float(state[0]), float(state[1])
        tip_x, tip_y = sin * SIZE * 0.4, cos * SIZE * 0.4
        along = np.clip((self._x * tip_x + self._y * tip_y) / (tip_x**2 + tip_y**2), 0.0, 1.0)
        distance = np.hypot(self._x - along * tip_x, self._y - along * tip_y)
        rod = distance < ROD_HALF_WIDTH
        frame = self._frame
        frame[:] = (32, 32, 48)
        frame[rod] = (220, 120, 40)
        return frame.copy()

    def _observation(self, state: npt.NDArray[np.float32]) -> dict[str, npt.NDArray[Any]]:
        return {"pixels": self._render(state), "state": state}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
        super().reset(seed=seed)
        state, info = self.pendulum.reset(seed=seed, options=options)
        return self._observation(state), info

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[dict[str, npt.NDArray[Any]], float, bool, bool, dict[str, Any]]:
        state, reward, terminated, truncated, info = self.pendulum.step(action)
        return self._observation(state), float(reward), terminated, truncated, info


def camera_pendulum(num_envs: int = 1, max_episode_steps: int = MAX_EPISODE_STEPS) -> gym.vector.SyncVectorEnv:
    """``num_envs`` camera pendulums in one ``SyncVectorEnv``."""

    def make() -> gym.Env[Any, Any]:
        return gym.wrappers.TimeLimit(CameraPendulumEnv(), max_episode_steps)

    return gym.vector.SyncVectorEnv([make for _ in range(num_envs)])
