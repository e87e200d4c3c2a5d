"""``make train-demo`` (scripts/train_demo.py): expert demonstrations -> dataset -> lerobot-train -> sweep.

The end-to-end test runs the real command shortened (4 demonstrations, 20 training steps, 2
checkpoints, one sweep instance of 4 held-out episodes): it proves the plumbing, not the success
rate, which the README reports from the full run. It needs MetaWorld's environment
(``sims/metaworld/.venv``, which ``scripts/setup`` creates) and lerobot-train's own dependencies, and
says so when it skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import pytest

from scripts import train_demo
from scripts.train_demo_env import ENVIRONMENT_STATE, STATE, RobotAndEnvironmentState
from tests.agent.checkpoint_runs import write_lerobot_run
from tests.conftest import REPO

if TYPE_CHECKING:
    import torch

METAWORLD_PYTHON = REPO / "sims" / "metaworld" / ".venv" / "bin" / "python"
needs_metaworld = pytest.mark.skipif(
    not METAWORLD_PYTHON.exists(),
    reason=f"{METAWORLD_PYTHON} is not set up: run scripts/setup (or uv sync --project sims/metaworld)",
)
MISSING_TRAINING = [name for name in train_demo.TRAINING_MODULES if importlib.util.find_spec(name) is None]
needs_lerobot_train = pytest.mark.skipif(
    bool(MISSING_TRAINING),
    reason=f"lerobot-train needs {', '.join(MISSING_TRAINING)} (lerobot's 'training' extra), not installed here",
)
SHORT = ["--demo-group", "1", "--sweep-group", "1", "--steps", "20", "--save-freq", "10", "--batch-size", "8"]
"""4 demonstrations, 20 training steps, checkpoints 10 and 20, 4 held-out episodes per checkpoint."""
RENAME = {ENVIRONMENT_STATE: "observation.environment_state"}


class FlatMetaWorld(gym.Env[Any, Any]):
    """MetaWorld's observation shape without MetaWorld: a flat float64 vector counting up from 0."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (39,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return np.arange(39, dtype=np.float64) / 10.0, {}


def test_the_sim_serves_the_robot_state_and_the_whole_vector_as_float32() -> None:
    env = RobotAndEnvironmentState(FlatMetaWorld())
    observation, _ = env.reset(seed=0)
    flat = np.arange(39, dtype=np.float64) / 10.0
    assert list(observation) == [STATE, ENVIRONMENT_STATE]
    np.testing.assert_array_equal(observation[STATE], flat[:4].astype(np.float32))
    np.testing.assert_array_equal(observation[ENVIRONMENT_STATE], flat.astype(np.float32))
    assert all(value.dtype == np.float32 for value in observation.values())
    assert env.observation_space.contains(observation)


def test_the_sim_refuses_a_task_with_a_camera() -> None:
    class WithCamera(FlatMetaWorld):
        observation_space = gym.spaces.Dict({"state": FlatMetaWorld.observation_space})  # pyright: ignore[reportAssignmentType]

    with pytest.raises(ValueError, match="expected a state-only MetaWorld task"):
        RobotAndEnvironmentState(WithCamera())


def test_lerobot_train_without_its_extra_is_refused_before_any_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    missing = {"accelerate", "psutil"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name in missing else real(name))
    with pytest.raises(
        train_demo.TrainDemoError, match=r"lerobot-train needs accelerate, psutil \(lerobot's 'training'"
    ):
        train_demo.check_training_dependencies()


@pytest.mark.slow
def test_a_complete_training_run_is_kept_and_another_one_is_replaced_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = write_lerobot_run(tmp_path / "train" / "metaworld_reach_act", (10, 20)).output_dir
    commands: list[list[str]] = []

    def stage(name: str, command: list[str], env: dict[str, str]) -> train_demo.Stage:
        commands.append(command)
        return train_demo.Stage(name, 1.0)

    monkeypatch.setattr(train_demo, "_stage", stage)
    dataset = tmp_path / "datasets" / "demos"

    def train(**settings: Any) -> train_demo.Stage:
        return train_demo.train(train_demo.Settings(outputs=tmp_path, **settings), {}, dataset, "local/demos", run_dir)

    assert train(steps=20) == train_demo.Stage("training", 0.0, kept=True)
    assert commands == [], "the complete run of 20 steps is kept"
    with pytest.raises(train_demo.TrainDemoError, match=r"not 30 steps\); pass --retrain"):
        train(steps=30)
    assert run_dir.is_dir()
    assert commands == []
    assert train(steps=30, retrain=True).wall_s == 1.0
    assert not run_dir.exists(), "the old run is gone before lerobot-train writes the new one"
    [command] = commands
    assert Path(command[0]).name == "lerobot-train"
    assert {"--steps=30", f"--output_dir={run_dir}", f"--dataset.root={dataset}", "--policy.device=cpu"} <= set(command)


def _dataset_episodes(root: Path) -> list[dict[str, np.ndarray[Any, Any]]]:
    import pyarrow.parquet as pq

    table = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    episodes: dict[int, dict[str, list[Any]]] = {}
    for row, episode in enumerate(table["episode_index"]):
        frames = episodes.setdefault(int(episode), {key: [] for key in table})
        for key in table:
            frames[key].append(table[key][row])
    return [{key: np.asarray(values) for key, values in frames.items()} for frames in episodes.values()]


def _trace_observations(trace: Any) -> dict[str, np.ndarray[Any, Any]]:
    """A trace's observations as ``[T, D]`` arrays per feature, in the order of its names."""
    names: dict[str, list[str]] = trace.header["state_names"]
    steps = trace.of_type("observation")
    return {feature: np.asarray([[s["state"][feature][n] for n in names[feature]] for s in steps]) for feature in names}


def _policy_inputs_match_the_dataset(outputs: Path, trained: Path) -> None:
    """The adapter the sweep uses turns the demonstrations' observations into exactly the dataset's frames."""
    from hud_pipelines.agent.lerobot import LeRobotAdapter
    from hud_pipelines.contract import load_contract
    from hud_pipelines.recording.trace_reader import read_trace

    config = json.loads((trained / "config.json").read_text())
    adapter = LeRobotAdapter(load_contract(outputs / train_demo.DEMOS / "contract.json"), rename=RENAME)
    expected = {key: tuple(feature["shape"]) for key, feature in config["input_features"].items()}
    assert {key: tuple(f.shape) for key, f in adapter.input_features().items()} == expected
    episodes = _dataset_episodes(outputs / "datasets" / train_demo.DEMOS)
    traces = [read_trace(p) for p in sorted((outputs / train_demo.DEMOS / "traces").rglob("*.jsonl"))]
    assert len(traces) == len(episodes) == 4
    for trace in traces:
        inputs = adapter.inputs(_trace_observations(trace), trace.header["prompt"])
        fed = {key: cast("torch.Tensor", inputs[key]).numpy() for key in expected}
        matching = [e for e in episodes if all(np.array_equal(fed[key], e[key]) for key in expected)]
        assert len(matching) == 1, f"episode of seed {trace.header['seed']}: no dataset episode holds its inputs"


@pytest.mark.slow
@needs_metaworld
@needs_lerobot_train
def test_make_train_demo_shortened_records_trains_and_sweeps_every_checkpoint_on_held_out_seeds(tmp_path: Path) -> None:
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.spec.loader import load_pipeline

    outputs = tmp_path / "outputs"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "HUD_PIPELINES_OUTPUTS": str(outputs)}
    command = [sys.executable, str(REPO / "scripts" / "train_demo.py"), *SHORT]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    summary = json.loads((outputs / train_demo.SUMMARY_FILE).read_text())
    assert set(summary["stages"]) == {"demonstrations", "training", "sweep"}
    assert all(wall > 0 for wall in summary["stages"].values())
    assert summary["kept"] == []
    assert summary["expert"]["episodes"] == 4
    assert summary["expert"]["errored"] == 0
    assert [c["checkpoint"] for c in summary["checkpoints"]] == ["000010", "000020"]
    assert [c["episodes"] for c in summary["checkpoints"]] == [4, 4]

    run_dir = outputs / "train" / "metaworld_reach_act"
    trained = run_dir / "checkpoints" / "000020" / "pretrained_model"
    _policy_inputs_match_the_dataset(outputs, trained)

    def seeds(path: Path, label: str | None = None) -> list[int | None]:
        rows = [GradeRow.from_dict(r) for r in json.loads(path.read_text())]
        return [r.seed for r in rows if label is None or r.checkpoint == label]

    demonstrated = set(seeds(outputs / train_demo.DEMOS / "grades.json"))
    sweep_grades = outputs / train_demo.SWEEP / "grades.json"
    assert seeds(sweep_grades, "000010") == seeds(sweep_grades, "000020"), "every checkpoint on the same episodes"
    assert not demonstrated & set(seeds(sweep_grades)), "the sweep's episodes are held out"
    assert "000020" in (outputs / train_demo.SWEEP / "report.md").read_text()
    swept = load_pipeline(REPO / train_demo.SWEEP_FILE, deep=True, env=env)
    assert train_demo.training_dir(swept) == run_dir
