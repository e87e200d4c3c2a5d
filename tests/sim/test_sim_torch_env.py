"""A torch-native vectorized env: actions arrive as tensors on its device, observations leave as numpy.

Importing torch costs seconds, so these tests are marked slow (CI runs them all the same).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import pytest

from envs.vectorized import TorchPointMassVectorEnv
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.envs import VectorEnvs
from hud_pipelines.sim.process import SimProcess
from tests.conftest import POINT_MASS, REPO, action_frames, assert_same_trajectory, driven

TORCH_POINT_MASS = f"{REPO / 'envs' / 'vectorized.py'}:torch_point_mass"

pytestmark = pytest.mark.slow


def test_a_torch_env_gets_tensors_on_its_device_and_matches_the_numpy_twin() -> None:
    tasks = [{"seed": s, "options": {"max_steps": 12}} for s in (1, 2, 3)]
    with GymBridge(TORCH_POINT_MASS, 3) as bridge:
        frames = action_frames(bridge.envs.single_action_space, 3, 15)
        torch_run = driven(bridge.reset, bridge.step, tasks, frames)
        env = cast(TorchPointMassVectorEnv, cast(VectorEnvs, bridge.envs).env)
        assert set(env.actions_seen) == {"Tensor:cpu"}
        reply = bridge.step(np.zeros((3, 2))) if bridge.slots.running().any() else bridge.reset(tasks)
        assert isinstance(reply.observation["state"], np.ndarray)
        assert reply.observation["state"].dtype == np.float32
    with GymBridge(POINT_MASS, 3) as bridge:
        numpy_run = driven(bridge.reset, bridge.step, tasks, frames)
    assert_same_trajectory(torch_run, numpy_run)


def test_a_served_torch_env(spawn: Callable[..., SimProcess]) -> None:
    sim = spawn(TORCH_POINT_MASS, num_envs=2, build_args={"device": "cpu"})
    with sim.connect() as client:
        reply = client.reset([{"seed": 4}, {"seed": 5}])
        assert reply.observation["state"].shape == (2, 4)
        reply = client.step(np.full((2, 2), 0.5, np.float32))
        assert reply.status == ["running", "running"]
        assert reply.reward.dtype == np.float64
