"""``sim.lerobot_env``: a lerobot env config resolved in the parent, refused at its key when it cannot be built,
and observations of such a sim fed to a LeRobot policy exactly as lerobot's own processing gives them."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import numpy as np
import pytest

from hud_pipelines.spec import SpecError
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.sim_section import SimSpec

PIPELINE = """\
name: lr
sim:
  lerobot_env:
    type: pusht
    {field}
agent:
  policy: {{kind: random}}
"""


def problem(field: str) -> tuple[int, str]:
    """The line and message of the one problem of a pipeline whose ``lerobot_env`` has ``field`` under ``type``."""
    with pytest.raises(SpecError) as caught:
        load_pipeline_text(PIPELINE.format(field=field), source="lr.yaml")
    [found] = caught.value.problems
    return found.line, found.message


def test_the_config_gives_lerobots_gym_id_and_gym_kwargs_and_dumps_as_written() -> None:
    from lerobot.envs.configs import PushtEnv

    sim = SimSpec.model_validate({"lerobot_env": {"type": "pusht", "episode_length": 20}, "num_envs": 2})
    lerobot = PushtEnv(episode_length=20)
    assert sim.factory == lerobot.gym_id == "gym_pusht/PushT-v0"
    assert sim.args == {"disable_env_checker": lerobot.disable_env_checker, **lerobot.gym_kwargs}
    json.dumps(sim.args)  # plain data: the sim child gets it on its command line, never lerobot itself
    dumped = sim.model_dump()
    assert "factory" not in dumped, "derived again on load, not frozen into the dump"
    assert "args" not in dumped
    assert SimSpec.model_validate(dumped) == sim


def test_a_run_that_changes_a_config_field_rebuilds_the_build_arguments() -> None:
    spec = load_pipeline_text(PIPELINE.format(field="episode_length: 50"), source="lr.yaml")
    from hud_pipelines.dagster.resources import effective_spec, pipeline_resources

    parts = pipeline_resources(spec, project_dir=spec.base_dir)
    assert effective_spec(spec, parts.sim, parts.contract, parts.agent, parts.graders).sim == spec.sim
    sim = {**parts.sim.section(), "lerobot_env": {"type": "pusht", "episode_length": 7}}
    changed = spec.with_sections(sim={k: v for k, v in sim.items() if v is not None and k not in ("factory", "args")})
    assert changed.sim.args["max_episode_steps"] == 7
    assert changed.overrides(spec) == {"sim.lerobot_env.episode_length": 7}


@pytest.mark.parametrize(
    ("field", "line", "expected"),
    [
        pytest.param(
            "episod_length: 3", 5, "has no field 'episod_length' (did you mean 'episode_length'?)", id="field"
        ),
        pytest.param("episode_length: long", 5, "PushtEnv.episode_length expects int, got 'long'", id="value"),
        pytest.param("factory: CartPole-v1", 5, "'factory' and 'lerobot_env' exclude each other", id="factory"),
    ],
)
def test_a_field_the_config_does_not_have_is_an_error_at_its_line(field: str, line: int, expected: str) -> None:
    if field.startswith("factory"):  # a sibling of lerobot_env, not one of its fields
        text = PIPELINE.format(field="episode_length: 3").replace("  lerobot_env:", f"  {field}\n  lerobot_env:")
        with pytest.raises(SpecError) as caught:
            load_pipeline_text(text, source="lr.yaml")
        [found] = caught.value.problems
        assert (found.line, found.path) == (3, "sim.factory")
        assert expected in found.message
        return
    assert problem(field)[0] == line
    assert expected in problem(field)[1]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        pytest.param(
            "pushtt", "unknown lerobot env type 'pushtt' (did you mean 'pusht'?); known types: aloha,", id="unknown"
        ),
        pytest.param(
            "aloha", "needs the package 'gym_aloha' (pip: gym-aloha), which is not installed", id="not-installed"
        ),
        pytest.param("metaworld", "is built by lerobot's own wrapper (MetaworldEnv.create_envs", id="lerobot-wrapper"),
        pytest.param("libero", "is built by lerobot's own wrapper (LiberoEnv.create_envs", id="libero"),
        pytest.param("isaaclab_arena", "downloads and runs its env from the Hugging Face Hub", id="hub"),
    ],
)
def test_a_type_the_sim_cannot_build_is_an_error_at_the_type_naming_what_is_missing(kind: str, expected: str) -> None:
    text = textwrap.dedent(PIPELINE.format(field="")).replace("type: pusht", f"type: {kind}")
    with pytest.raises(SpecError) as caught:
        load_pipeline_text(text, source="lr.yaml")
    [found] = caught.value.problems
    assert (found.line, found.path) == (4, "sim.lerobot_env.type")
    assert expected in found.message


def test_a_config_without_a_type_lists_the_known_types() -> None:
    with pytest.raises(SpecError, match=r"sim.lerobot_env: missing key 'type': the lerobot env type, one of: aloha"):
        load_pipeline_text("name: lr\nsim:\n  lerobot_env: {episode_length: 3}\nagent:\n  policy: {kind: random}\n")


# -- the agent side ---------------------------------------------------------------------------------


def pusht_observation(obs_type: str, rows: int) -> tuple[Any, dict[str, np.ndarray]]:
    """The contract and a batch of real observations of lerobot's pusht env of ``obs_type`` (read-only, as decoded)."""
    from hud_pipelines.sim.bridge import GymBridge
    from hud_pipelines.spec.lerobot_env import resolve_lerobot_env

    env = resolve_lerobot_env({"type": "pusht", "obs_type": obs_type})
    with GymBridge(env.gym_id, build_args=env.build_args, num_envs=rows) as bridge:
        reply = bridge.reset([{"seed": 5 + row} for row in range(rows)])
        contract = bridge.contract
    observation = {k: np.asarray(v) for k, v in reply.observation.items()}
    for array in observation.values():
        array.flags.writeable = False
    return contract, observation


@pytest.mark.slow
@pytest.mark.parametrize("obs_type", ["pixels_agent_pos", "environment_state_agent_pos"])
def test_the_policy_gets_exactly_what_lerobots_preprocess_observation_gives(obs_type: str) -> None:
    import torch
    from lerobot.envs.utils import preprocess_observation

    from hud_pipelines.agent.lerobot import make_adapter

    contract, observation = pusht_observation(obs_type, rows=3)
    adapter = make_adapter(
        contract,
        device=torch.device("cpu"),
        rename=None,
        lerobot_env={"type": "pusht", "obs_type": obs_type},
        policy_config=None,
    )
    inputs = adapter.inputs(observation, "push")
    theirs = preprocess_observation({k: np.array(v) for k, v in observation.items()})
    assert {k for k in inputs if k.startswith("observation.")} == set(theirs)  # the env processor adds empty keys
    for key, value in theirs.items():
        assert torch.equal(inputs[key], value), key  # pyright: ignore[reportArgumentType]
    assert inputs["task"] == ["push"] * 3


@pytest.mark.slow
def test_an_environment_state_is_its_own_input_not_part_of_the_state() -> None:
    import torch
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    from hud_pipelines.agent.lerobot import LeRobotPolicy

    contract, observation = pusht_observation("environment_state_agent_pos", rows=2)
    policy = LeRobotPolicy.random(
        "act",
        contract,
        overrides={"chunk_size": 4, "n_action_steps": 4, "dim_model": 32, "n_heads": 2},
        lerobot_env={"type": "pusht", "obs_type": "environment_state_agent_pos"},
    )
    features = policy.policy.config.input_features
    assert features[OBS_STATE].shape == (2,)
    assert features[OBS_ENV_STATE].shape == (16,)
    assert str(features[OBS_ENV_STATE].type) == "FeatureType.ENV"
    inputs = policy.adapter.inputs(observation, "")
    assert torch.equal(inputs[OBS_ENV_STATE], torch.from_numpy(np.array(observation["environment_state"])).float())  # pyright: ignore[reportArgumentType]
    from hud_pipelines.agent.policy import PolicyBatch

    actions = policy.infer(PolicyBatch(observation=observation, prompts=["", ""]))
    assert actions.shape == (2, 4, 2)
