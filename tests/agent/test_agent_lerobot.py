"""LeRobot policies through lerobot's own factory and processors, offline; the contract adapter.

Importing lerobot costs ~15 s, paid once for this file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agent_helpers import RecordingSink
from lerobot.utils.constants import OBS_IMAGE, OBS_IMAGES, OBS_STATE
from pydantic import ValidationError

from hud_pipelines.agent.factory import build_policy
from hud_pipelines.agent.lerobot import LeRobotPolicy
from hud_pipelines.agent.lerobot_features import LeRobotAdapter
from hud_pipelines.agent.policy import PolicyBatch
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.errors import PolicyError
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.spec.agent import LeRobotPolicyConfig

pytestmark = pytest.mark.slow
PUSHT = "gym_pusht/PushT-v0"
ACT_SMALL = {"n_action_steps": 5, "chunk_size": 10, "dim_model": 64, "n_heads": 2, "dim_feedforward": 128}


def two_camera_contract() -> Contract:
    return Contract(
        control_rate=10.0,
        features={
            "wrist": Feature(role="observation", type=FeatureType.BGR, dtype="uint8", shape=(4, 6, 3)),
            "top": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(4, 6, 3)),
            "joints": Feature(role="observation", dtype="float32", shape=(3,)),
            "gripper": Feature(role="observation", dtype="float64", shape=(1,)),
            "action": Feature(role="action", dtype="float32", shape=(4,)),
        },
    )


def observation(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "wrist": rng.integers(0, 256, size=(rows, 4, 6, 3), dtype=np.uint8),
        "top": rng.integers(0, 256, size=(rows, 4, 6, 3), dtype=np.uint8),
        "joints": rng.standard_normal((rows, 3)).astype(np.float32),
        "gripper": rng.standard_normal((rows, 1)),
    }


def test_adapter_maps_cameras_state_and_prompt_with_lerobot_keys() -> None:
    adapter = LeRobotAdapter(two_camera_contract())
    obs = observation(2)
    for array in obs.values():
        array.flags.writeable = False  # as decoded from the wire
    inputs = adapter.inputs(obs, ["pick", "place"])
    assert set(inputs) == {f"{OBS_IMAGES}.wrist", f"{OBS_IMAGES}.top", OBS_STATE, "task"}
    top = inputs[f"{OBS_IMAGES}.top"]
    assert isinstance(top, torch.Tensor)
    assert top.shape == (2, 3, 4, 6)
    assert top.dtype == torch.float32
    assert torch.allclose(top[1, :, 2, 5], torch.from_numpy(obs["top"][1, 2, 5].astype(np.float32) / 255))
    wrist = inputs[f"{OBS_IMAGES}.wrist"]
    assert isinstance(wrist, torch.Tensor)
    assert torch.allclose(wrist[0, :, 0, 0], torch.from_numpy(obs["wrist"][0, 0, 0, ::-1].astype(np.float32) / 255))
    state = inputs[OBS_STATE]
    assert isinstance(state, torch.Tensor)
    assert state.shape == (2, 4)
    expected = np.concatenate([obs["joints"], obs["gripper"]], axis=1).astype(np.float32)
    assert np.allclose(state.numpy(), expected), "state features concatenated in contract order"
    assert inputs["task"] == ["pick", "place"]


def test_adapter_treats_unbatched_observations_through_the_same_code() -> None:
    adapter = LeRobotAdapter(two_camera_contract())
    batched = adapter.inputs(observation(3), ["a", "b", "c"])
    single = adapter.inputs({k: v[1] for k, v in observation(3).items()}, "b")
    for key, value in single.items():
        if key == "task":
            assert value == ["b"]
        else:
            assert isinstance(value, torch.Tensor)
            other = batched[key]
            assert isinstance(other, torch.Tensor)
            assert torch.equal(value[0], other[1])
    chunk = adapter.actions(torch.zeros(7, 4), batched=False)
    assert chunk.shape == (1, 7, 4)


def camera_and_position(**more: Feature) -> Contract:
    """A 4x6 camera, a 2-D position and a 2-D action, and ``more`` observation features."""
    return Contract(
        control_rate=10.0,
        features={
            "pixels": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(4, 6, 3)),
            "agent_pos": Feature(role="observation", dtype="float32", shape=(2,)),
            **more,
            "action": Feature(role="action", dtype="float32", shape=(2,)),
        },
    )


def test_adapter_renames_and_falls_back_to_the_policys_single_image_key() -> None:
    from lerobot.configs.types import FeatureType as LeRobotType
    from lerobot.configs.types import PolicyFeature

    contract = camera_and_position(goal=Feature(role="observation", dtype="float32", shape=(3,)))
    expected = {
        OBS_IMAGE: PolicyFeature(type=LeRobotType.VISUAL, shape=(3, 4, 6)),
        OBS_STATE: PolicyFeature(type=LeRobotType.STATE, shape=(2,)),
        "observation.environment_state": PolicyFeature(type=LeRobotType.ENV, shape=(3,)),
    }
    adapter = LeRobotAdapter(contract, expected_inputs=expected, rename={"goal": "observation.environment_state"})
    rows = {"pixels": np.zeros((1, 4, 6, 3), np.uint8), "agent_pos": np.ones((1, 2), np.float32)}
    inputs = adapter.inputs({**rows, "goal": np.full((1, 3), 2.0, np.float32)}, "")
    assert set(inputs) == {OBS_IMAGE, OBS_STATE, "observation.environment_state", "task"}
    assert inputs[OBS_STATE].shape == (1, 2)  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(PolicyError, match=r"expects inputs \['observation.environment_state'\]"):
        LeRobotAdapter(contract, expected_inputs=expected)
    with pytest.raises(PolicyError, match="not observation features"):
        LeRobotAdapter(contract, rename={"nope": "x"})


def test_a_state_the_dataset_kept_apart_is_given_apart_to_a_policy_that_expects_it_so() -> None:
    """A dataset keeps an integer float32 would round as observation.<name>; a policy trained on it expects it there,
    and one trained when it was inside observation.state still gets it there."""
    from lerobot.configs.types import FeatureType as LeRobotType
    from lerobot.configs.types import PolicyFeature

    contract = camera_and_position(tick=Feature(role="observation", dtype="int64", shape=(1,)))
    rows = {"pixels": np.zeros((1, 4, 6, 3), np.uint8), "agent_pos": np.ones((1, 2), np.float32)}
    rows["tick"] = np.array([[33554433]], np.int64)
    expected = {
        OBS_IMAGE: PolicyFeature(type=LeRobotType.VISUAL, shape=(3, 4, 6)),
        OBS_STATE: PolicyFeature(type=LeRobotType.STATE, shape=(2,)),
        "observation.tick": PolicyFeature(type=LeRobotType.STATE, shape=(1,)),
    }
    inputs = LeRobotAdapter(contract, expected_inputs=expected).inputs(rows, "")
    assert inputs[OBS_STATE].shape == (1, 2)  # pyright: ignore[reportAttributeAccessIssue]
    assert inputs["observation.tick"].shape == (1, 1)  # pyright: ignore[reportAttributeAccessIssue]
    inside = {OBS_IMAGE: expected[OBS_IMAGE], OBS_STATE: PolicyFeature(type=LeRobotType.STATE, shape=(3,))}
    inputs = LeRobotAdapter(contract, expected_inputs=inside).inputs(rows, "")
    assert set(inputs) == {OBS_IMAGE, OBS_STATE, "task"}
    assert inputs[OBS_STATE].shape == (1, 3)  # pyright: ignore[reportAttributeAccessIssue]


def test_a_checkpoint_whose_inputs_have_other_shapes_is_refused_naming_both_sides() -> None:
    from lerobot.configs.types import FeatureType as LeRobotType
    from lerobot.configs.types import PolicyFeature

    contract = camera_and_position()

    def expecting(image: tuple[int, ...], state: tuple[int, ...]) -> dict[str, PolicyFeature]:
        return {
            OBS_IMAGE: PolicyFeature(type=LeRobotType.VISUAL, shape=image),
            OBS_STATE: PolicyFeature(type=LeRobotType.STATE, shape=state),
        }

    LeRobotAdapter(contract, expected_inputs=expecting((3, 96, 96), (2,)))  # another image size: backbones take it
    with pytest.raises(PolicyError) as state:
        LeRobotAdapter(contract, expected_inputs=expecting((3, 4, 6), (5,)))
    assert "observation.state: the policy expects shape [5], the contract gives [2]" in str(state.value)
    assert "concatenates ['agent_pos']" in str(state.value)
    with pytest.raises(PolicyError, match=r"observation.image: the policy expects shape \[1, 4, 6\]"):
        LeRobotAdapter(contract, expected_inputs=expecting((1, 4, 6), (2,)))


@pytest.fixture(scope="module")
def pusht() -> Iterator[Any]:
    process = SimProcess.spawn(PUSHT, num_envs=4, build_args={"obs_type": "pixels_agent_pos"})
    with process, process.connect() as client:
        yield client


def test_random_act_drives_served_pusht_with_one_forward_per_refill_tick(pusht: Any) -> None:
    policy = LeRobotPolicy.random("act", pusht.contract, device="cpu", overrides=ACT_SMALL)
    assert policy.horizon == 5
    forwards: list[int] = []
    predict = policy.policy.predict_action_chunk

    def counted(batch: dict[str, Any]) -> Any:
        forwards.append(int(batch[OBS_STATE].shape[0]))
        return predict(batch)

    policy.policy.predict_action_chunk = counted
    sink = RecordingSink()
    agent = RobotAgent(policy, pusht.contract)
    outcomes = agent.run(pusht, [{"seed": s} for s in range(4)], max_steps=12, key=("act", 0, 0), sinks=[sink])

    assert forwards == [4, 4, 4], "ticks 0, 5 and 10 refill all four slots with one forward each"
    assert agent.last_run.infer.count == len(forwards)
    assert agent.last_run.ticks == 12
    for trace_id, records in sink.inferences.items():
        assert [r.step for r in records] == [0, 5, 10]
        assert all(r.chunk.shape == (5, 2) and r.batch_size == 4 for r in records)
        actions = np.stack([f.action for f in sink.frames[trace_id]])
        assert actions.shape == (12, 2)
        assert np.abs(actions).max() > 20, "unnormalised with statistics from the contract's bounds (0..512)"
    assert all(o.status is EpisodeStatus.FAILED and o.truncated for o in outcomes)


def test_pretrained_folder_round_trip_gives_the_same_actions(tmp_path: Path, pusht: Any) -> None:
    config = LeRobotPolicyConfig(type="act", device="cpu", overrides=ACT_SMALL)
    built = build_policy(config, pusht.contract, base_dir=tmp_path)
    assert isinstance(built, LeRobotPolicy)
    folder = built.save_pretrained(tmp_path / "act")
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"} <= {
        p.name for p in folder.iterdir()
    }
    loaded = build_policy(LeRobotPolicyConfig(path="act", device="cpu"), pusht.contract, base_dir=tmp_path)
    observation = pusht.reset([{"seed": s} for s in range(4)])
    batch = PolicyBatch(observation=observation.observation, prompts=["push"] * 4)
    first, again = built.infer(batch), loaded.infer(batch)
    assert first.shape == (4, 10, 2)
    assert np.allclose(first, again, atol=1e-5)
    with pytest.raises(PolicyError, match=r"no config\.json"):
        build_policy(LeRobotPolicyConfig(path="missing", device="cpu"), pusht.contract, base_dir=tmp_path)
    with pytest.raises(PolicyError, match="has no fields"):
        LeRobotPolicy.from_pretrained(folder, pusht.contract, overrides={"n_action_stepz": 3})
    with pytest.raises(PolicyError, match="unknown lerobot policy type 'actt'"):
        LeRobotPolicy.random("actt", pusht.contract)
    with pytest.raises(ValidationError, match=r"give 'path' \(a pretrained folder\), 'type' \(random weights\)"):
        LeRobotPolicyConfig()  # nothing to load is the YAML's problem, said at its line by validate and run


def test_act_samples_nothing_so_random_streams_change_nothing(pusht: Any) -> None:
    policy = LeRobotPolicy.random("act", pusht.contract, device="cpu", overrides=ACT_SMALL)
    assert policy.sampling is None
    unnamed = PolicyBatch(observation=pusht.reset([{"seed": s} for s in range(4)]).observation, prompts=[""] * 4)
    named = dataclasses.replace(unnamed, streams=[(0, 0, slot, 0, 0) for slot in range(4)])
    torch.manual_seed(2)
    before = torch.get_rng_state()
    assert np.array_equal(policy.infer(unnamed), policy.infer(named))
    assert torch.equal(torch.get_rng_state(), before), "ACT's inference draws nothing"


def test_adapter_carries_an_observation_history_axis_through() -> None:
    """Policies with n_obs_steps > 1 get ``[B, n, ...]`` inputs (the agent keeps each slot's last n frames)."""
    adapter = LeRobotAdapter(two_camera_contract())
    history = {k: np.stack([v, v], axis=1) for k, v in observation(3).items()}
    inputs = adapter.inputs(history, ["", "", ""])
    top = inputs[f"{OBS_IMAGES}.top"]
    state = inputs[OBS_STATE]
    assert isinstance(top, torch.Tensor)
    assert isinstance(state, torch.Tensor)
    assert top.shape == (3, 2, 3, 4, 6)
    assert state.shape == (3, 2, 4)


def lerobots_own_loop(policy: LeRobotPolicy, seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """lerobot's inference loop in one env: ``select_action`` per step; also each step's raw chunk head."""
    policy.policy.reset()
    ensembled: list[np.ndarray] = []
    heads: list[np.ndarray] = []
    with GymBridge(PUSHT, 1, build_args={"obs_type": "pixels_agent_pos"}) as bridge:
        observation = bridge.reset([{"seed": seed}]).observation
        for _ in range(steps):
            batch = policy.preprocessor(policy.adapter.inputs(observation, [""]))
            with torch.inference_mode():
                heads.append(policy.postprocessor(policy.policy.predict_action_chunk(batch)[:, 0]).numpy()[0])
                action = policy.postprocessor(policy.policy.select_action(batch)).numpy()
            ensembled.append(action[0])
            observation = bridge.step(action).observation
    return np.stack(ensembled), np.stack(heads)


def test_act_temporal_ensembling_matches_lerobots_own_loop_in_every_slot() -> None:
    overrides = {**ACT_SMALL, "n_action_steps": 1, "temporal_ensemble_coeff": 0.01}
    steps, seeds = 12, [4, 5]
    with GymBridge(PUSHT, len(seeds), build_args={"obs_type": "pixels_agent_pos"}) as bridge:
        policy = LeRobotPolicy.random("act", bridge.contract, device="cpu", overrides=overrides)
        assert policy.horizon == 1
        sink = RecordingSink()
        agent = RobotAgent(policy, bridge.contract)
        agent.run(bridge, [{"seed": s} for s in seeds], max_steps=steps, key=("ens", 0, 0), sinks=[sink])
    assert agent.last_run.infer.rows_each == [2] * steps, "one forward per step over both slots"
    by_slot = sink.by_slot()
    for slot, seed in enumerate(seeds):
        ours = np.stack([frame.action for frame in sink.frames[by_slot[slot]]])
        theirs, heads = lerobots_own_loop(policy, seed, steps)
        assert np.allclose(ours, theirs, atol=1e-4), f"slot {slot} (seed {seed})"
        assert not np.allclose(ours[1:], heads[1:], atol=1e-3), "ensembling changes the actions after step 0"
    with pytest.raises(PolicyError, match="must name its episode"):
        policy.infer(PolicyBatch(observation=bridge_observation(), prompts=[""]))


def bridge_observation() -> dict[str, np.ndarray]:
    """One reset observation of a one-slot PushT."""
    with GymBridge(PUSHT, 1, build_args={"obs_type": "pixels_agent_pos"}) as bridge:
        return bridge.reset([{"seed": 0}]).observation
