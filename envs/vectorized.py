"""Natively vectorized sims: factories with ``num_envs`` in their signature.

A factory that accepts ``num_envs`` tells hud-pipelines that it batches internally, so the bridge
hands it the slot count and steps it with one ``[N, A]`` array instead of building N copies.

- :func:`point_mass` (numpy): N point masses pushed towards per-slot goals; reports ``is_success``
  when a mass reaches its goal; takes per-slot seeds; autoresets finished slots on the next step
  (gymnasium's ``NEXT_STEP`` mode), as vector envs do.
- :func:`torch_point_mass` (torch): the same dynamics on torch tensors on a device. Observations
  are tensors and actions must arrive as tensors on that device, as with GPU-batched simulators.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.vector.utils import batch_space

MAX_STEPS = 40
GOAL_RADIUS = 0.1
SPEED = 0.2


class PointMassVectorEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """N point masses in ``[-1, 1]^2``; observation ``[x, y, goal_x, goal_y]``, action a 2-D push."""

    metadata: dict[str, Any] = {  # noqa: RUF012 - gymnasium's own class attribute
        "render_fps": 20,
        "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP,
    }
    per_slot_seeds = True
    """``reset(seed=[...])`` seeds each slot from its own seed."""

    def __init__(self, num_envs: int = 1, max_steps: int = MAX_STEPS) -> None:
        self.num_envs = num_envs
        self.max_steps = max_steps
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._rngs: list[np.random.Generator] = [np.random.default_rng() for _ in range(num_envs)]
        self.position = np.zeros((num_envs, 2), dtype=np.float32)
        self.goal = np.zeros((num_envs, 2), dtype=np.float32)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self.limit = np.full(num_envs, max_steps, dtype=np.int64)
        self._needs_reset = np.zeros(num_envs, dtype=np.bool_)
        self.received: list[npt.NDArray[np.float32]] = []
        """Every ``[N, 2]`` action frame this env was stepped with (tests inspect the hold rows)."""

    def _reset_slots(self, slots: npt.NDArray[np.bool_]) -> None:
        for slot in range(self.num_envs):
            if not slots[slot]:
                continue
            rng = self._rngs[slot]
            self.position[slot] = rng.uniform(-0.8, 0.8, 2).astype(np.float32)
            self.goal[slot] = rng.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.elapsed[slots] = 0
        self._needs_reset[slots] = False

    def _observation(self) -> npt.NDArray[np.float32]:
        return np.concatenate([self.position, self.goal], axis=1)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        """``options={"max_steps": int | [int per slot]}`` sets the episode length of this batch."""
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        for slot, slot_seed in enumerate(seeds):
            if slot_seed is not None:
                self._rngs[slot] = np.random.default_rng(slot_seed)
        self.limit[:] = (options or {}).get("max_steps", self.max_steps)
        self._reset_slots(np.ones(self.num_envs, dtype=np.bool_))
        return self._observation(), {}

    def step(
        self, actions: Any
    ) -> tuple[
        npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_], dict[str, Any]
    ]:
        received = np.asarray(actions, dtype=np.float32).reshape(self.num_envs, 2)
        self.received.append(received.copy())
        push = np.clip(received, -1.0, 1.0)
        restarting = self._needs_reset.copy()
        self.position = np.clip(self.position + SPEED * push, -1.0, 1.0).astype(np.float32)
        self.elapsed += 1
        distance = np.linalg.norm(self.position - self.goal, axis=1)
        success = distance < GOAL_RADIUS
        terminated = success.copy()
        truncated = (self.elapsed >= self.limit) & ~terminated
        reward = -distance.astype(np.float64)
        self._reset_slots(restarting)  # NEXT_STEP autoreset: these slots start over and report nothing
        reward[restarting] = 0.0
        terminated[restarting] = False
        truncated[restarting] = False
        success[restarting] = False
        self._needs_reset = terminated | truncated
        info = {"is_success": success, "_is_success": ~restarting}
        return self._observation(), reward, terminated, truncated, info


def point_mass(num_envs: int = 1, max_steps: int = MAX_STEPS) -> PointMassVectorEnv:
    """A natively vectorized numpy env of ``num_envs`` point masses."""
    return PointMassVectorEnv(num_envs=num_envs, max_steps=max_steps)


class TorchPointMassVectorEnv(PointMassVectorEnv):
    """The point masses with torch tensors in and out, as a GPU-batched simulator would have them."""

    def __init__(self, num_envs: int = 1, max_steps: int = MAX_STEPS, device: str = "cpu") -> None:
        import torch

        super().__init__(num_envs=num_envs, max_steps=max_steps)
        self.device = torch.device(device)
        self.actions_seen: list[str] = []
        """Type and device of every action received (tests check the bridge sent tensors)."""

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> Any:
        import torch

        observation, info = super().reset(seed=seed, options=options)
        return torch.as_tensor(observation, device=self.device), info

    def step(self, actions: Any) -> Any:
        import torch

        if not isinstance(actions, torch.Tensor) or actions.device != self.device:
            raise TypeError(f"expected a torch tensor on {self.device}, got {type(actions).__name__}")
        self.actions_seen.append(f"{type(actions).__name__}:{actions.device}")
        observation, reward, terminated, truncated, info = super().step(actions.cpu().numpy())

        def tensor(value: Any) -> Any:
            return torch.as_tensor(value, device=self.device)

        return tensor(observation), tensor(reward), tensor(terminated), tensor(truncated), info


def torch_point_mass(num_envs: int = 1, max_steps: int = MAX_STEPS, device: str = "cpu") -> TorchPointMassVectorEnv:
    """A natively vectorized torch env of ``num_envs`` point masses on ``device``."""
    return TorchPointMassVectorEnv(num_envs=num_envs, max_steps=max_steps, device=device)
