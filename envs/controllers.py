"""Scripted experts for the classic-control sims, written batched: ``fn(observation_batch) -> actions``.

Each controller reads the contract feature ``state`` (the name a bare ``Box`` observation gets) as
``[B, D]`` and returns ``[B, A]`` actions, so it plugs into the agent as a ``scripted`` policy::

    policy: {kind: scripted, target: "envs.controllers:cartpole_pd"}
    policy: {kind: scripted, target: "envs.controllers:PendulumSwingUp", args: {kp: 12.0}}

- CartPole-v1: a PD law on pole angle and cart position; it holds the pole for the full 500-step
  time limit (CartPole reports no success signal: success is reaching the limit without terminating).
- Pendulum-v1: energy-pumping swing-up, then PD balance near the top. Pendulum reports no success
  signal either; :data:`PENDULUM_SUCCESS_RETURN` is the return a solved episode beats (a random
  policy scores about -1200, this controller -0 to -330 over 200 steps).
- InvertedPendulum-v5: a PD law on angle and cart position; it keeps the pole up for all 1000 steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

STATE = "state"
CARTPOLE_SUCCESS_STEPS = 500
"""CartPole-v1's time limit: an episode that reaches it without terminating is solved."""
PENDULUM_SUCCESS_RETURN = -400.0
"""Return over Pendulum-v1's 200 steps above which the pendulum was swung up and held."""
INVERTED_PENDULUM_SUCCESS_RETURN = 1000.0
"""InvertedPendulum-v5 pays 1 per step the pole stays up, for at most 1000 steps."""

Observation = dict[str, npt.NDArray[Any]]


class CartPolePD:
    """Push right when ``kx*x + kv*x_dot + kt*theta + kw*theta_dot > 0`` (discrete action 0/1)."""

    def __init__(self, kx: float = 0.1, kv: float = 0.5, kt: float = 10.0, kw: float = 2.0, key: str = STATE) -> None:
        self.gains = np.array([kx, kv, kt, kw], dtype=np.float64)
        self.key = key

    def __call__(self, observation: Observation) -> npt.NDArray[np.float32]:
        state = np.asarray(observation[self.key], dtype=np.float64).reshape(-1, 4)
        return (state @ self.gains > 0).astype(np.float32)[:, None]


class PendulumSwingUp:
    """Energy pumping far from the top, PD on the angle near it; torque clipped to ``[-2, 2]``.

    The pendulum obeys ``theta'' = 15 sin(theta) + 3 u`` (g = 10, m = l = 1), so the energy
    ``E = theta'^2 / 2 + 15 cos(theta)`` changes as ``dE/dt = 3 u theta'``: pushing along the
    velocity pumps energy until ``E`` reaches the upright value 15.
    """

    def __init__(
        self, k_energy: float = 0.6, kp: float = 12.0, kd: float = 2.5, capture_cos: float = 0.85, key: str = STATE
    ) -> None:
        self.k_energy = k_energy
        self.kp = kp
        self.kd = kd
        self.capture_cos = capture_cos
        self.key = key

    def __call__(self, observation: Observation) -> npt.NDArray[np.float32]:
        state = np.asarray(observation[self.key], dtype=np.float64).reshape(-1, 3)
        cos, sin, velocity = state[:, 0], state[:, 1], state[:, 2]
        angle = np.arctan2(sin, cos)
        balance = -(self.kp * angle + self.kd * velocity)
        energy = 0.5 * velocity**2 + 15.0 * cos
        direction = np.where(np.abs(velocity) > 1e-3, np.sign(velocity), 1.0)
        pump = self.k_energy * (15.0 - energy) * direction
        torque = np.where(cos > self.capture_cos, balance, pump)
        return np.clip(torque, -2.0, 2.0).astype(np.float32)[:, None]


class InvertedPendulumPD:
    """Cart force ``kx*x + kt*theta + kv*x_dot + kw*theta_dot`` clipped to ``[-3, 3]``."""

    def __init__(self, kx: float = 1.0, kt: float = 30.0, kv: float = 1.0, kw: float = 3.0, key: str = STATE) -> None:
        self.gains = np.array([kx, kt, kv, kw], dtype=np.float64)
        self.key = key

    def __call__(self, observation: Observation) -> npt.NDArray[np.float32]:
        state = np.asarray(observation[self.key], dtype=np.float64).reshape(-1, 4)
        return np.clip(state @ self.gains, -3.0, 3.0).astype(np.float32)[:, None]


cartpole_pd = CartPolePD()
pendulum_swing_up = PendulumSwingUp()
inverted_pendulum_pd = InvertedPendulumPD()
