"""A LeRobot policy with an observation history (Diffusion Policy, ``n_obs_steps = 2``) end to end.

Random weights, small networks and two denoising steps keep it fast. The proof is equality with
lerobot's own inference loop: ``select_action`` keeps its own observation and action queues, our
agent keeps a per-slot history and chunk queue and calls ``predict_action_chunk`` once per refill;
with the same noise (the same torch seed) both must take the same actions in the same env.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from agent_helpers import RecordingSink
from lerobot.utils.constants import OBS_STATE

from hud_pipelines.agent.lerobot import LeRobotPolicy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.process import SimProcess

pytestmark = pytest.mark.slow
PUSHT = "gym_pusht/PushT-v0"
PUSHT_ARGS = {"obs_type": "pixels_agent_pos"}
DIFFUSION_SMALL: dict[str, Any] = {
    "n_obs_steps": 2,
    "horizon": 16,
    "n_action_steps": 8,
    "down_dims": (32, 64),
    "diffusion_step_embed_dim": 32,
    "spatial_softmax_num_keypoints": 8,
    "crop_shape": (84, 84),
    "num_inference_steps": 2,
}


def diffusion(contract: Any) -> LeRobotPolicy:
    return LeRobotPolicy.random("diffusion", contract, device="cpu", overrides=DIFFUSION_SMALL)


def test_the_agent_takes_the_actions_of_lerobots_own_select_action_loop() -> None:
    steps = 20  # refills at ticks 0, 8 and 16
    with GymBridge(PUSHT, 1, build_args=PUSHT_ARGS) as bridge:
        policy = diffusion(bridge.contract)
        assert (policy.observation_steps, policy.horizon) == (2, 8)
        sink = RecordingSink()
        torch.manual_seed(0)
        RobotAgent(policy, bridge.contract).run(bridge, [{"seed": 3}], max_steps=steps, key=("dp", 0, 0), sinks=[sink])
        ours = np.stack([frame.action for frame in next(iter(sink.frames.values()))])

        policy.policy.reset()
        torch.manual_seed(0)
        observation = bridge.reset([{"seed": 3}]).observation
        theirs: list[np.ndarray] = []
        for _ in range(steps):
            batch = policy.preprocessor(policy.adapter.inputs(observation, [""]))
            with torch.inference_mode():
                action = policy.postprocessor(policy.policy.select_action(batch))
            theirs.append(action.numpy()[0])
            observation = bridge.step(action.numpy()).observation
    assert ours.shape == (steps, 2)
    assert np.allclose(ours, np.stack(theirs), atol=1e-4)
    assert len({tuple(row) for row in ours.round(3)}) > 2, "the actions vary (not a constant)"


def test_a_history_policy_drives_served_pusht_and_sees_each_slots_last_two_frames() -> None:
    with SimProcess.spawn(PUSHT, num_envs=2, build_args=PUSHT_ARGS) as process, process.connect() as client:
        policy = diffusion(client.contract)
        seen: list[np.ndarray] = []
        inputs = policy.adapter.inputs

        def capture(observation: Any, prompts: Any) -> Any:
            mapped = inputs(observation, prompts)
            seen.append(np.asarray(mapped[OBS_STATE]))
            return mapped

        policy.adapter.inputs = capture
        sink = RecordingSink()
        agent = RobotAgent(policy, client.contract)
        agent.run(client, [{"seed": 5}, {"seed": 6}], max_steps=12, key=("dp", 0, 0), sinks=[sink])
    assert agent.last_run.forwards == 2, "ticks 0 and 8 refill both slots with one forward"
    assert [s.shape for s in seen] == [(2, 2, 2), (2, 2, 2)], "[slots, history, agent position]"
    by_slot = sink.by_slot()
    for slot in (0, 1):
        frames = sink.frames[by_slot[slot]]
        state = [np.asarray(f.observation["agent_pos"], dtype=np.float32) for f in frames]
        assert np.array_equal(seen[0][slot], np.stack([state[0], state[0]])), "the reset frame, repeated"
        assert np.array_equal(seen[1][slot], np.stack([state[7], state[8]])), "the frames before steps 7 and 8"
