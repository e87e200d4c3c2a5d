"""The scripted PushT expert (``envs/pusht_expert.py``): its rules against gym-pusht's own physics, and a real run.

gym-pusht is in the agent's environment, so these tests step its env in process where a rule is
about the physics, and run the bundled pipeline where the claim is the expert's success.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.pusht_expert import (
    AGENT_RADIUS,
    ANGLE_SCALE,
    CENTRE,
    CONTACTS,
    GAP,
    GOAL,
    PushTExpert,
    choose_contacts,
    pusht_with_camera,
    rotate,
    route,
    twist_vectors,
)
from hud_pipelines.cli.validate import add_validate_arguments, run_validate
from hud_pipelines.eval.steps import Evaluation, evaluate
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.loader import load_pipeline
from tests.conftest import REPO

PIPELINE = REPO / "pipelines" / "pusht_expert.yaml"
CAMERA_PIPELINE = REPO / "pipelines" / "pusht_expert_camera.yaml"
MAX_STEPS = 300
"""gym-pusht registers PushT-v0 with at most 300 steps."""


def pusht(state: list[float]) -> tuple[Any, np.ndarray[Any, Any]]:
    """gym-pusht's PushT (``obs_type: state``) reset to ``state`` (agent x, y, block x, y, angle), and its reset."""
    import gym_pusht  # noqa: F401  # pyright: ignore[reportUnusedImport] - registers gym_pusht/PushT-v0
    import gymnasium as gym

    env = gym.make("gym_pusht/PushT-v0", obs_type="state")
    observation, _ = env.reset(options={"reset_to_state": state})
    return env, observation


def pusht_with_disc_at(body_point: np.ndarray[Any, Any], block: list[float]) -> tuple[Any, np.ndarray[Any, Any]]:
    """PushT with the T at ``block`` (x, y, angle) and the disc at ``body_point`` of the T's frame.

    gym-pusht sets the angle after the position, turning the T about its centre of mass, so the T's
    pose is read from a first reset (the disc out of the way) before the disc is placed.
    """
    _, placed = pusht([0.0, 0.0, *block])
    disc = placed[2:4] + world(placed, body_point)
    env, observation = pusht([*disc, *block])
    np.testing.assert_allclose(observation[2:], placed[2:], atol=1e-9, err_msg="the disc moved the T at its reset")
    return env, observation


def step(env: Any, action: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """One step of ``env`` towards the target ``action``: its state observation."""
    observation, *_ = env.step(action)
    return np.asarray(observation, dtype=np.float64)


def centre_of(state: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The T's centre of mass in the world, ``[2]``, from a state observation."""
    return state[2:4] + rotate(CENTRE[None], state[4:5])[0]


def world(state: np.ndarray[Any, Any], body: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A body-frame vector ``[2]`` of the T of ``state`` as a world direction."""
    return rotate(body[None], state[4:5])[0]


def contact_index(x: float, y: float) -> int:
    (index,) = np.flatnonzero((CONTACTS[:, 0] == x) & (CONTACTS[:, 1] == y))
    return int(index)


GOAL_STATE = np.array([0.0, 0.0, *GOAL])
"""A state observation of the T at the goal."""
ALONG_EDGES = [GOAL[2] + quarter * np.pi / 2 for quarter in range(4)]
"""Directions along the T's edge normals when it is at the goal's angle."""


@pytest.mark.parametrize(
    ("heading", "least_cosine"),
    # along an edge's normal one push translates the T straight; between two, the best single push is 45 degrees off
    [*((heading, 0.8) for heading in ALONG_EDGES), (GOAL[2] + np.pi / 4, 0.65), (GOAL[2] + 2.0, 0.65)],
)
def test_a_t_off_the_goal_is_pushed_from_behind_towards_the_goal(heading: float, least_cosine: float) -> None:
    """The T at the goal's angle, 90 px off along ``heading``, the disc between it and the goal.

    The expert picks a contact whose line-up point is behind it as seen from the goal and whose push
    points at the goal; from that line-up point, its next steps in gym-pusht bring the T nearer the goal.
    """
    away = 90.0 * np.array([np.cos(heading), np.sin(heading)])
    _, placed = pusht([0.0, 0.0, *(GOAL[:2] + away), GOAL[2]])
    state = np.array([[*(GOAL[:2] + 0.3 * away), *placed[2:]]])
    to_goal = (GOAL[:2] - placed[2:4]) / np.linalg.norm(GOAL[:2] - placed[2:4])
    point, normal = np.split(CONTACTS[choose_contacts(state)[0]], 2)
    line_up = point + (AGENT_RADIUS + GAP) * normal
    distance = {
        name: np.linalg.norm(placed[2:4] + world(placed, body) - GOAL[:2])
        for name, body in (("contact", point), ("line-up", line_up))
    }
    assert distance["line-up"] > distance["contact"], f"the disc lines up at {line_up}, between {point} and the goal"
    push = world(placed, -normal)  # along the inward normal
    assert push @ to_goal > least_cosine, f"pushing at {point} moves the T along {push}, not to the goal {to_goal}"

    env, observation = pusht_with_disc_at(line_up, [*(GOAL[:2] + away), GOAL[2]])
    off = np.linalg.norm(centre_of(observation) - centre_of(GOAL_STATE))
    for _ in range(20):
        observation = step(env, PushTExpert()({"state": observation[None]})[0])
    nearer = off - np.linalg.norm(centre_of(observation) - centre_of(GOAL_STATE))
    assert nearer > 20.0, f"twenty steps from the line-up point brought the T {nearer:.1f} px nearer the goal"


@pytest.mark.parametrize(
    ("x", "y"),
    [(0.0, 0.0), (48.0, 0.0), (-48.0, 0.0), (-15.0, 98.0), (15.0, 56.0), (60.0, 15.0), (0.0, 120.0)],
)
def test_a_push_moves_the_t_as_the_frictionless_quasi_static_model_says(x: float, y: float) -> None:
    """Pushed by the disc in gym-pusht, the T moves along the twist the expert expects of that contact."""
    index = contact_index(x, y)
    point, normal = CONTACTS[index, :2], CONTACTS[index, 2:]
    env, before = pusht_with_disc_at(point + (AGENT_RADIUS + GAP) * normal, [256.0, 230.0, 0.4])
    push_to = before[2:4] + world(before, point + (AGENT_RADIUS - 6.0) * normal)  # 6 px past the contact
    after = before
    for _ in range(10):
        after = step(env, push_to)
    moved = rotate((centre_of(after) - centre_of(before))[None], before[4:5] * -1)[0]
    measured = np.array([*moved, ANGLE_SCALE * (after[4] - before[4])])
    expected = twist_vectors()[index]
    assert np.linalg.norm(measured) > 2.0, f"the push at {point} did not move the T ({measured})"
    cosine = measured @ expected / (np.linalg.norm(measured) * np.linalg.norm(expected))
    assert cosine > 0.95, f"pushed at {point}, the T moved by {measured}; the model says along {expected}"


def test_the_disc_goes_around_the_t_without_touching_it() -> None:
    """From the bar's top to the stem's end: routed, the disc arrives and the T never moves."""
    start_body, goal_body = np.array([0.0, -(AGENT_RADIUS + GAP)]), np.array([0.0, 120.0 + AGENT_RADIUS + GAP])
    env, first = pusht_with_disc_at(start_body, [256.0, 200.0, 1.0])
    observation, agent_body = first, start_body[None]
    for _ in range(60):
        agent_body = rotate((observation[:2] - observation[2:4])[None], -observation[4:5])
        if np.linalg.norm(agent_body[0] - goal_body) < 2.0:
            break
        target = observation[2:4] + rotate(route(agent_body, goal_body[None]), observation[4:5])[0]
        observation = step(env, target)
        np.testing.assert_allclose(observation[2:], first[2:], atol=1e-9, err_msg="the disc touched the T")
    else:
        pytest.fail(f"the disc did not reach the stem's end in 60 steps: it is at {agent_body[0]}")


def test_the_expert_refuses_a_wrong_observation() -> None:
    with pytest.raises(KeyError, match="reads feature 'state'"):
        PushTExpert()({"agent_pos": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"feature 'state' must be gym-pusht's state \[B, 5\].*got \[2, 2\]"):
        PushTExpert()({"state": np.zeros((2, 2))})
    actions = PushTExpert(key="obs")({"obs": np.array([[100.0, 100.0, 300.0, 300.0, 0.0]])})
    assert actions.shape == (1, 2)
    assert actions.dtype == np.float32


def test_the_camera_sim_serves_gym_pushts_state_beside_its_frame() -> None:
    ours = pusht_with_camera(size=32)
    theirs, _ = pusht([0.0, 0.0, 0.0, 0.0, 0.0])
    # seed 0 starts the T at -2.88 rad, which gym-pusht's state observation gives modulo 2 pi
    state, _ = theirs.reset(seed=0)
    observation, _ = ours.reset(seed=0)
    for _ in range(40):
        np.testing.assert_array_equal(observation["environment_state"], state)
        np.testing.assert_array_equal(observation["state"], state[:2])
        assert observation["pixels"].shape == (32, 32, 3)
        action = PushTExpert()({"state": state[None]})[0]
        state, *_ = theirs.step(action)
        observation, *_ = ours.step(action)


def test_the_bundled_pusht_expert_pipelines_pass_the_deep_check() -> None:
    parser = argparse.ArgumentParser()
    add_validate_arguments(parser)
    out = io.StringIO()
    assert run_validate(parser.parse_args([str(PIPELINE), str(CAMERA_PIPELINE)]), out) == 0, out.getvalue()


@pytest.fixture(scope="module")
def state_run(tmp_path_factory: pytest.TempPathFactory) -> Evaluation:
    """The bundled ``pusht_expert`` pipeline, evaluated once for the tests of this module."""
    return evaluate(load_pipeline(PIPELINE), outputs_dir=tmp_path_factory.mktemp("outputs"), project_dir=REPO)


def test_the_expert_solves_pusht_in_the_bundled_pipeline(state_run: Evaluation) -> None:
    assert not state_run.failed_instances
    assert sorted(row.seed or 0 for row in state_run.rows) == list(range(100, 108))  # held out: tuned on 0-49
    statuses = [row.status for row in state_run.rows]
    # 100 of 100 held-out seeds (100-199) succeeded when measured (README); a bound with room for another platform
    assert statuses.count(EpisodeStatus.SUCCEEDED) >= 7
    succeeded = [row for row in state_run.rows if row.status is EpisodeStatus.SUCCEEDED]
    assert all(row.steps < MAX_STEPS for row in succeeded)  # ended by gym-pusht's coverage > 0.95, not the limit
    assert state_run.passed


def test_the_camera_pipeline_runs_the_same_episodes_into_a_dataset_with_video(
    state_run: Evaluation, tmp_path: Path
) -> None:
    camera_run = evaluate(load_pipeline(CAMERA_PIPELINE), outputs_dir=tmp_path / "outputs", project_dir=REPO)
    assert camera_run.passed
    state_episodes = {row.seed: row for row in state_run.rows}
    for row in camera_run.rows:
        twin = state_episodes[row.seed]
        assert (row.status, row.steps) == (twin.status, twin.steps), f"seed {row.seed}"
        assert row.total_reward == pytest.approx(twin.total_reward, rel=1e-12), f"seed {row.seed}"
    assert len(camera_run.rows) == len(state_episodes)
    assert camera_run.dataset is not None
    assert camera_run.dataset.episodes == len(camera_run.rows)
    assert camera_run.dataset.frames == sum(row.steps for row in camera_run.rows)
    info = json.loads((camera_run.dataset.path / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.pixels"]["dtype"] == "video"
    assert info["features"]["observation.state"]["shape"] == [2]  # the agent's position, as lerobot's PushT has it
    assert info["features"]["observation.environment_state"]["shape"] == [5]
