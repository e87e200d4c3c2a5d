"""MetaWorld under its own Python (``sims/metaworld``), driven by the numpy experts in the agent's.

Everything that runs MetaWorld needs ``sims/metaworld/.venv`` (``scripts/setup`` creates it, so CI
has it) and is skipped, saying so, where it is missing.
"""

from __future__ import annotations

import argparse
import ctypes.util
import importlib.util
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.metaworld_experts import EXPERTS, MetaWorldExpert
from hud_pipelines.cli.validate import add_validate_arguments, run_validate
from hud_pipelines.contract import load_contract
from hud_pipelines.errors import SimStartError
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.factory import resolve_factory
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.spec.loader import load_pipeline
from tests.conftest import REPO

METAWORLD_ENV = REPO / "sims" / "metaworld"
METAWORLD_PYTHON = METAWORLD_ENV / ".venv" / "bin" / "python"
needs_metaworld = pytest.mark.skipif(
    not METAWORLD_PYTHON.exists(),
    reason=f"{METAWORLD_PYTHON} is not set up: run scripts/setup (or uv sync --project sims/metaworld)",
)
FACTORY = "envs.metaworld_tasks:make"

EXPERT_TRACES = r"""
import json, sys, warnings
import numpy as np
import metaworld.policies as policies
from envs.metaworld_tasks import make

warnings.simplefilter("ignore")  # MetaWorld's experts warn about their own large gains
POLICIES = {
    "reach-v3": policies.SawyerReachV3Policy,
    "push-v3": policies.SawyerPushV3Policy,
    "pick-place-v3": policies.SawyerPickPlaceV3Policy,
}
traces = {}
for task, policy_class in POLICIES.items():
    env, policy, noise = make(task), policy_class(), np.random.default_rng(0)
    observations, actions = [], []
    for seed in range(3):
        observation, _ = env.reset(seed=seed)
        for _ in range(80):
            action = policy.get_action(observation)
            observations.append(observation.tolist())
            actions.append(action.tolist())
            # noise takes the arm off the expert's path, so every rule of the expert is exercised
            noisy = np.clip(action + noise.normal(0.0, 0.3, 4), -1, 1).astype(np.float32)
            observation, _, terminated, truncated, _ = env.step(noisy)
            if terminated or truncated:
                break
    traces[task] = {"observations": observations, "actions": actions}
    env.close()
json.dump(traces, sys.stdout)
"""


def run_in_metaworld(code: str) -> str:
    completed = subprocess.run(
        [METAWORLD_PYTHON, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def test_the_factory_module_loads_where_metaworld_is_not_installed() -> None:
    assert importlib.util.find_spec("metaworld") is None, "the agent's environment should not have metaworld"
    factory = resolve_factory(FACTORY)
    assert {"task", "camera", "size", "max_episode_steps"} <= factory.build_params


@needs_metaworld
def test_the_bundled_metaworld_pipelines_pass_the_deep_check() -> None:
    parser = argparse.ArgumentParser()
    add_validate_arguments(parser)
    # a sweep's checkpoints exist once trained: tests/eval/test_train_demo.py checks it on a run it trains
    paths = sorted(str(p) for p in (REPO / "pipelines").glob("metaworld_*.yaml") if not p.stem.endswith("_sweep"))
    out = io.StringIO()
    assert len(paths) == 4
    assert run_validate(parser.parse_args(paths), out) == 0, out.getvalue()


def test_the_expert_refuses_an_unknown_task_and_a_wrong_observation() -> None:
    with pytest.raises(ValueError, match="no MetaWorld expert for task 'sweep-v3'"):
        MetaWorldExpert("sweep-v3")
    with pytest.raises(ValueError, match=r"feature 'state' must be MetaWorld's flat observation \[B, 39\]"):
        MetaWorldExpert("push-v3")({"state": np.zeros((2, 4))})
    with pytest.raises(KeyError, match="reads feature 'state'"):
        MetaWorldExpert("push-v3")({"agent_pos": np.zeros((2, 39))})


@needs_metaworld
def test_the_numpy_experts_act_as_metaworlds_own_policies() -> None:
    traces: dict[str, dict[str, list[list[float]]]] = json.loads(run_in_metaworld(EXPERT_TRACES))
    assert set(traces) == set(EXPERTS)
    for task, trace in traces.items():
        observations = np.asarray(trace["observations"], dtype=np.float64)
        theirs = np.asarray(trace["actions"], dtype=np.float32)
        ours = MetaWorldExpert(task)({"state": observations})
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6, err_msg=task)
        if task != "reach-v3":  # the trace reached both grip rules: open and closing
            assert len(np.unique(theirs[:, 3])) == 2, task


@needs_metaworld
def test_a_reset_seed_decides_the_placement(spawn: Any) -> None:
    sim: SimProcess = spawn(FACTORY, num_envs=3, python=METAWORLD_ENV)
    with sim.connect() as client:
        state = client.reset([{"seed": 5}, {"seed": 5}, {"seed": 6}]).observation["state"]
    assert np.array_equal(state[0], state[1])
    assert not np.array_equal(state[0, -3:], state[2, -3:])  # another goal


def write_pipeline(path: Path, **sim: Any) -> Path:
    text = {
        "name": path.stem,
        "sim": {"factory": FACTORY, "python": str(METAWORLD_ENV), "num_envs": 2, **sim},
        "agent": {
            "policy": {
                "kind": "scripted",
                "target": "envs.metaworld_experts:MetaWorldExpert",
                "args": {"task": "push-v3"},
            }
        },
        "tasks": [{"name": "push", "seed": 10}],
        "max_steps": 120,
        "graders": [{"kind": "success"}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(text))
    return path


@needs_metaworld
def test_the_expert_pushes_the_puck_in_a_real_run_with_a_camera(tmp_path: Path) -> None:
    from hud_pipelines.eval.steps import evaluate

    path = write_pipeline(
        tmp_path / "pipelines" / "metaworld_smoke.yaml", args={"task": "push-v3", "camera": "corner2", "size": 32}
    )
    evaluation = evaluate(load_pipeline(path), outputs_dir=tmp_path / "outputs", project_dir=REPO)
    assert not evaluation.failed_instances
    assert load_contract(evaluation.outputs.contract).observation_features["pixels"].shape == (32, 32, 3)
    assert [row.status for row in evaluation.rows] == [EpisodeStatus.SUCCEEDED] * 2
    assert all(row.steps < 120 for row in evaluation.rows)  # ended by MetaWorld's success, not the step limit


@needs_metaworld
@pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None, reason="OSMesa is installed: it would render")
def test_a_renderer_that_cannot_start_fails_the_start_up_with_what_to_install(spawn: Any) -> None:
    with pytest.raises(SimStartError) as caught:
        spawn(FACTORY, build_args={"camera": "corner2"}, python=METAWORLD_ENV, env={"MUJOCO_GL": "osmesa"})
    message = str(caught.value)
    assert "MuJoCo cannot render offscreen with MUJOCO_GL=osmesa" in message.splitlines()[0]
    assert "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri" in message
