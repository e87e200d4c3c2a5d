"""A LeRobot policy with an observation history (Diffusion Policy, ``n_obs_steps = 2``) end to end.

Random weights, small networks and two denoising steps keep it fast. The proof is equality with
lerobot's own inference loop: ``select_action`` keeps its own observation and action queues, our
agent keeps a per-slot history and chunk queue and calls ``predict_action_chunk`` once per refill;
fed the same noise (each refill's row stream) both must take the same actions in the same env.

Diffusion samples: every row draws its initial noise and DDPM's step noise from its own stream. The
real network's matrix products round a row differently at another batch size, so bit-identity across
batch compositions is proven with a row-wise denoiser in place of the U-Net, and the real one is held
to float rounding.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from agent_helpers import RecordingSink
from lerobot.utils.constants import OBS_STATE

from hud_pipelines.agent.lerobot import LeRobotPolicy
from hud_pipelines.agent.policy import PolicyBatch, RandomStream
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.agent.torch_runtime import row_generators
from hud_pipelines.contract import Contract, Feature, FeatureType
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
TINY: dict[str, Any] = {**DIFFUSION_SMALL, "crop_shape": (56, 56)}
"""For the 64x64 camera of :func:`tiny_contract` (the smallest ResNet input that keeps a 2x2 map)."""


def diffusion(contract: Any) -> LeRobotPolicy:
    return LeRobotPolicy.random("diffusion", contract, device="cpu", overrides=DIFFUSION_SMALL)


def tiny_contract() -> Contract:
    return Contract(
        control_rate=10.0,
        features={
            "pixels": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(64, 64, 3)),
            "agent_pos": Feature(role="observation", dtype="float32", shape=(2,), low=[0, 0], high=[512, 512]),
            "action": Feature(role="action", dtype="float32", shape=(2,), low=[0, 0], high=[512, 512]),
        },
    )


def tiny_diffusion(**overrides: Any) -> LeRobotPolicy:
    return LeRobotPolicy.random("diffusion", tiny_contract(), device="cpu", overrides={**TINY, **overrides})


def histories(rows: int) -> dict[str, np.ndarray]:
    """``rows`` different two-frame observation histories."""
    rng = np.random.default_rng(1)
    return {
        "pixels": rng.integers(0, 256, size=(rows, 2, 64, 64, 3), dtype=np.uint8),
        "agent_pos": rng.uniform(0, 512, size=(rows, 2, 2)).astype(np.float32),
    }


def stream(row: int, forward: int = 0) -> RandomStream:
    return (0, 0, row, 0, forward)


def rows_batch(observation: dict[str, np.ndarray], rows: list[int], streams: list[RandomStream]) -> PolicyBatch:
    return PolicyBatch(
        observation={k: v[rows] for k, v in observation.items()}, prompts=[""] * len(rows), streams=streams
    )


class RowwiseDenoiser(torch.nn.Module):
    """A U-Net stand-in that treats each row on its own (no matrix product): ``0.5 x + state[0]``.

    The first entry of the global conditioning is the row's normalised first state value (lerobot
    puts the state first), so each row's output depends on its own noise and observation only.
    """

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        return 0.5 * sample + global_cond[:, :1, None]


def with_rowwise_denoiser(policy: LeRobotPolicy) -> LeRobotPolicy:
    policy.policy.diffusion.unet = RowwiseDenoiser()
    return policy


@contextlib.contextmanager
def fed_noise(policy: LeRobotPolicy, row_stream: RandomStream) -> Generator[torch.Tensor]:
    """lerobot's own ``select_action`` fed one row's noise: the initial noise as ``noise=``, then every
    denoising step's noise from the same generator, passed to the scheduler as lerobot never does."""
    (generator,) = row_generators(PolicyBatch(observation={}, prompts=[""], streams=[row_stream]), policy.seed)
    config = policy.policy.config
    noise = torch.randn((1, config.horizon, config.action_feature.shape[0]), generator=generator)
    scheduler = policy.policy.diffusion.noise_scheduler
    step = scheduler.step

    def seeded_step(*args: Any, **kwargs: Any) -> Any:
        return step(*args, **{**kwargs, "generator": generator})

    with mock.patch.object(scheduler, "step", seeded_step):
        yield noise


def test_the_agent_takes_the_actions_of_lerobots_own_select_action_loop() -> None:
    steps = 20  # refills at ticks 0, 8 and 16
    with GymBridge(PUSHT, 1, build_args=PUSHT_ARGS) as bridge:
        policy = diffusion(bridge.contract)
        assert (policy.observation_steps, policy.horizon) == (2, 8)
        streams: list[RandomStream] = []
        infer = policy.infer

        def recorded(batch: PolicyBatch) -> Any:
            streams.extend(batch.streams or [])
            return infer(batch)

        policy.infer = recorded
        sink = RecordingSink()
        RobotAgent(policy, bridge.contract).run(bridge, [{"seed": 3}], max_steps=steps, key=("dp", 0, 0), sinks=[sink])
        ours = np.stack([frame.action for frame in next(iter(sink.frames.values()))])
        assert [s[-1] for s in streams] == [0, 1, 2], "one stream per refill, counted within the episode"

        policy.policy.reset()
        observation = bridge.reset([{"seed": 3}]).observation
        theirs: list[np.ndarray] = []
        for tick in range(steps):
            batch = policy.preprocessor(policy.adapter.inputs(observation, [""]))
            with torch.inference_mode(), fed_noise(policy, streams[tick // 8]) as noise:
                action = policy.postprocessor(policy.policy.select_action(batch, noise=noise))
            theirs.append(action.numpy()[0])
            observation = bridge.step(action.numpy()).observation
    assert ours.shape == (steps, 2)
    assert np.allclose(ours, np.stack(theirs), atol=1e-4)
    assert len({tuple(row) for row in ours.round(3)}) > 2, "the actions vary (not a constant)"


def test_a_rows_actions_are_bit_identical_alone_in_any_batch_order_or_split() -> None:
    policy = with_rowwise_denoiser(tiny_diffusion())
    observation = histories(4)
    streams = [stream(row) for row in range(4)]
    together = policy.infer(rows_batch(observation, [0, 1, 2, 3], streams))
    alone = np.concatenate([policy.infer(rows_batch(observation, [r], [streams[r]])) for r in range(4)])
    reversed_ = policy.infer(rows_batch(observation, [3, 2, 1, 0], streams[::-1]))[::-1]
    split = np.concatenate(
        [
            policy.infer(rows_batch(observation, [0, 2], streams[0::2])),
            policy.infer(rows_batch(observation, [1, 3], streams[1::2])),
        ]
    )[[0, 2, 1, 3]]
    assert together.shape == (4, 8, 2)
    assert len({row.tobytes() for row in together}) == 4, "every row its own chunk"
    for name, other in {"alone": alone, "reversed": reversed_, "split": split}.items():
        assert np.array_equal(together, other), f"{name}: max difference {np.abs(together - other).max()}"


def test_the_real_network_gives_a_row_the_same_actions_in_any_batch_up_to_float_rounding() -> None:
    policy = tiny_diffusion()
    observation = histories(3)
    streams = [stream(row) for row in range(3)]
    together = policy.infer(rows_batch(observation, [0, 1, 2], streams))
    alone = np.concatenate([policy.infer(rows_batch(observation, [r], [streams[r]])) for r in range(3)])
    reversed_ = policy.infer(rows_batch(observation, [2, 1, 0], streams[::-1]))[::-1]
    rounding = 0.01  # actions span 0..512, where a float32 ulp is 6e-5; measured here: 1.2e-4
    assert np.abs(together - alone).max() < rounding
    assert np.abs(together - reversed_).max() < rounding
    other_noise = policy.infer(rows_batch(observation, [0, 1, 2], [stream(row, forward=1) for row in range(3)]))
    assert np.abs(together - other_noise).mean() > 1000 * rounding, "the tolerance is far below what noise changes"


def test_different_streams_and_seeds_draw_different_noise_and_the_same_stream_the_same() -> None:
    policy = with_rowwise_denoiser(tiny_diffusion())
    same = {k: np.repeat(v[:1], 4, axis=0) for k, v in histories(1).items()}
    streams = [stream(0), stream(1), stream(0), stream(0, forward=1)]
    actions = policy.infer(rows_batch(same, [0, 1, 2, 3], streams))
    assert np.array_equal(actions[0], actions[2]), "one observation and one stream: one chunk"
    for row in (1, 3):
        assert np.abs(actions[0] - actions[row]).max() > 1.0, f"row {row} has another stream, so other noise"
    policy.seed = 1
    reseeded = policy.infer(rows_batch(same, [0], [stream(0)]))
    assert np.abs(actions[0] - reseeded[0]).max() > 1.0, "another policy seed, other noise"


def test_a_diffusion_policy_loaded_from_its_folder_draws_the_same_noise_per_stream(tmp_path: Path) -> None:
    built = tiny_diffusion()
    loaded = LeRobotPolicy.from_pretrained(built.save_pretrained(tmp_path / "dp"), tiny_contract(), device="cpu")
    assert loaded.sampling is not None
    batch = rows_batch(histories(2), [0, 1], [stream(0), stream(1)])
    assert np.array_equal(built.infer(batch), loaded.infer(batch))


@pytest.mark.parametrize("scheduler", ["DDPM", "DDIM"])
def test_a_forward_with_streams_draws_nothing_from_torchs_global_generator(scheduler: str) -> None:
    """Both the initial noise and every DDPM step's noise come from the rows' generators."""
    policy = tiny_diffusion(noise_scheduler_type=scheduler)
    batch = rows_batch(histories(2), [0, 1], [stream(0), stream(1)])
    torch.manual_seed(11)
    before = torch.get_rng_state()
    first = policy.infer(batch)
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(first, policy.infer(batch))


def test_without_streams_the_policy_draws_from_torchs_global_generator_as_lerobot_does() -> None:
    policy = tiny_diffusion()
    batch = rows_batch(histories(2), [0, 1], [stream(0), stream(1)])
    unnamed = PolicyBatch(observation=batch.observation, prompts=batch.prompts)
    policy.infer(batch)  # a forward with streams leaves nothing behind
    torch.manual_seed(5)
    ours = policy.infer(unnamed)
    torch.manual_seed(5)
    with torch.inference_mode():
        processed = policy.preprocessor(policy.adapter.inputs(unnamed.observation, unnamed.prompts))
        theirs = policy.postprocessor(policy.policy.predict_action_chunk(processed)).numpy()
    assert np.array_equal(ours, theirs)
    torch.manual_seed(6)
    assert not np.allclose(ours, policy.infer(unnamed), atol=1.0), "another global seed, other noise"


def test_the_rows_generators_reach_only_the_thread_whose_forward_they_belong_to() -> None:
    policy = tiny_diffusion()
    unnamed = PolicyBatch(observation=histories(1), prompts=[""])
    torch.manual_seed(8)
    expected = policy.infer(unnamed)
    seen: list[np.ndarray] = []

    def other_thread() -> None:
        torch.manual_seed(8)
        seen.append(policy.infer(unnamed))

    assert policy.sampling is not None
    with policy.sampling.rows(row_generators(rows_batch(histories(1), [0], [stream(0)]), 0)):
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join(timeout=30)
    assert len(seen) == 1
    assert np.array_equal(seen[0], expected), "the other thread kept torch's global generator"


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
    assert agent.last_run.infer.count == 2, "ticks 0 and 8 refill both slots with one forward"
    assert [s.shape for s in seen] == [(2, 2, 2), (2, 2, 2)], "[slots, history, agent position]"
    by_slot = sink.by_slot()
    for slot in (0, 1):
        frames = sink.frames[by_slot[slot]]
        state = [np.asarray(f.observation["agent_pos"], dtype=np.float32) for f in frames]
        assert np.array_equal(seen[0][slot], np.stack([state[0], state[0]])), "the reset frame, repeated"
        assert np.array_equal(seen[1][slot], np.stack([state[7], state[8]])), "the frames before steps 7 and 8"
