"""A state-only MetaWorld task observed as lerobot's state-only policies train on: robot state + environment state.

lerobot's ACT and Diffusion Policy refuse to be built from a dataset without a camera unless it holds
``observation.environment_state`` (their ``validate_features``), and ACT reads ``observation.state``
as well (its latent is placed on that tensor's device). ``envs.metaworld_tasks`` serves MetaWorld's
39-dim vector as one feature, ``state``, which the project's dataset writes as ``observation.state``
alone. This factory serves the same task as two features, as lerobot's own MetaWorld env splits it:

- ``state``: the robot's own state, hand xyz and gripper opening (the first four values, lerobot's
  ``agent_pos``), which the dataset concatenates into ``observation.state``;
- ``environment_state``: the whole 39-dim vector (objects, the previous frame, the goal), which
  ``dataset.state_features: [state]`` leaves out of the state, so the dataset writes it as
  ``observation.environment_state``; a sweep feeds it back to the policy under that key with
  ``rename: {environment_state: observation.environment_state}``, and the expert reads it with
  ``key: environment_state``.

Both are float32, as lerobot's datasets and policies hold them (MetaWorld's float64 would reach a
policy's float32 layers as float64). MetaWorld is imported in :func:`make` only, inside the sim child
that runs under ``sims/metaworld``; the agent's environment reads the signature alone.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

STATE = "state"
ENVIRONMENT_STATE = "environment_state"
ROBOT_STATE_SIZE = 4
"""Hand xyz and gripper opening: the head of MetaWorld's flat observation."""
MAX_EPISODE_STEPS = 500
"""MetaWorld's own horizon (``envs.metaworld_tasks.MAX_EPISODE_STEPS``)."""

Observation = dict[str, Any]
"""``{"state": float32 [4], "environment_state": float32 [39]}`` (gymnasium types Dict samples loosely)."""


class RobotAndEnvironmentState(gym.ObservationWrapper[Observation, Any, Any]):
    """A state-only MetaWorld task whose observation is ``{"state": [4], "environment_state": [39]}``."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"expected a state-only MetaWorld task (a flat Box observation), got {space}")
        self.observation_space = gym.spaces.Dict(
            {
                STATE: gym.spaces.Box(-np.inf, np.inf, (ROBOT_STATE_SIZE,), np.float32),
                ENVIRONMENT_STATE: gym.spaces.Box(-np.inf, np.inf, space.shape, np.float32),
            }
        )

    def observation(self, observation: Any) -> Observation:
        flat = np.asarray(observation, dtype=np.float32)
        return {STATE: flat[:ROBOT_STATE_SIZE].copy(), ENVIRONMENT_STATE: flat}


def make(
    task: str = "reach-v3", max_episode_steps: int = MAX_EPISODE_STEPS, benchmark_seed: int = 0
) -> gym.Env[Any, Any]:
    """A state-only MetaWorld task (``envs.metaworld_tasks.make``) observed as robot and environment state."""
    from envs.metaworld_tasks import make as make_task

    return RobotAndEnvironmentState(make_task(task, max_episode_steps=max_episode_steps, benchmark_seed=benchmark_seed))
