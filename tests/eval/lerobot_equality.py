"""One random-weight ACT on PushT through ``lerobot-eval`` and through a ``sim.lerobot_env`` pipeline.

Shared by ``tests/eval/test_lerobot_eval_equality.py`` (a few short episodes) and
``bench/lerobot_equality.py`` (a longer run): the same policy folder, env config, seeds and batch size on
both sides, each side's per-episode ``sum_reward`` / ``max_reward`` / ``success`` / ``seed``.

``lerobot-eval`` 0.6.1 does not write its seeds into ``eval_info.json``, so a ``sitecustomize`` on its
``PYTHONPATH`` records every ``reset(seed=...)`` of its vector env (and, for a fair timing, turns off the
preview videos it renders unless told to record datasets). Both sides run torch on one thread:
another thread count rounds the policy's matrix products differently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEROBOT_EVAL = Path(sys.executable).with_name("lerobot-eval")
PUSHT = "gym_pusht/PushT-v0"
ACT_SMALL = {"n_action_steps": 5, "chunk_size": 10, "dim_model": 64, "n_heads": 2, "dim_feedforward": 128}
"""A small ACT: fast on a CPU, still several chunks per episode."""
PUSHT_96 = {"observation_height": 96, "observation_width": 96}
"""lerobot's pusht config declares 384x384 images; the env renders 96x96 observations."""

SITECUSTOMIZE = textwrap.dedent(
    '''
    """Records the seeds lerobot-eval resets its vector env with; no preview videos when asked."""
    import atexit, json, os

    import gymnasium as gym
    from lerobot.scripts import lerobot_eval

    _seeds = []
    _reset = gym.vector.SyncVectorEnv.reset
    _eval_all = lerobot_eval.eval_policy_all

    def _recorded_reset(self, *, seed=None, options=None):
        _seeds.append(None if seed is None else list(seed))
        return _reset(self, seed=seed, options=options)

    def _without_videos(*args, **kwargs):
        if os.environ.get("EQUALITY_NO_VIDEO") == "1":
            kwargs["max_episodes_rendered"] = 0
            kwargs["videos_dir"] = None
        return _eval_all(*args, **kwargs)

    gym.vector.SyncVectorEnv.reset = _recorded_reset
    lerobot_eval.eval_policy_all = _without_videos

    @atexit.register
    def _write():
        with open(os.environ["EQUALITY_SEEDS"], "w") as f:
            json.dump(_seeds, f)
    '''
)


@dataclass(frozen=True)
class Episode:
    """What lerobot-eval reports of one episode."""

    seed: int
    sum_reward: float
    max_reward: float
    success: bool


@dataclass(frozen=True)
class Side:
    """One side's episodes (in lerobot-eval's episode order) and its wall time from launch to exit."""

    episodes: list[Episode]
    wall_s: float


def make_policy_folder(path: Path, *, overrides: Mapping[str, Any] | None = None) -> Path:
    """Random ACT with lerobot's PushT inputs (``observation.image``, ``observation.state``) and its processors."""
    from hud_pipelines.agent.lerobot import LeRobotPolicy
    from hud_pipelines.sim.bridge import GymBridge

    with GymBridge(PUSHT, build_args={"obs_type": "pixels_agent_pos"}) as bridge:
        contract = bridge.contract
    policy = LeRobotPolicy.random(
        "act", contract, device="cpu", overrides=dict(overrides or {}), lerobot_env={"type": "pusht"}
    )
    return policy.save_pretrained(path)


def run_lerobot_eval(
    folder: Path, work: Path, *, episodes: int, batch_size: int, episode_length: int, seed: int, videos: bool = True
) -> Side:
    """``lerobot-eval`` on PushT in its own process; the episodes from its ``eval_info.json`` and the recorded seeds."""
    output = work / "lerobot_eval"
    output.mkdir(parents=True, exist_ok=True)
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    seeds_file = work / "lerobot_seeds.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "EQUALITY_SEEDS": str(seeds_file),
        "EQUALITY_NO_VIDEO": "0" if videos else "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [
        str(LEROBOT_EVAL),
        f"--policy.path={folder}",
        "--policy.device=cpu",
        "--env.type=pusht",
        f"--env.episode_length={episode_length}",
        *(f"--env.{key}={value}" for key, value in PUSHT_96.items()),
        f"--eval.n_episodes={episodes}",
        f"--eval.batch_size={batch_size}",
        "--eval.use_async_envs=false",
        f"--seed={seed}",
        f"--output_dir={output}",
    ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise AssertionError(f"lerobot-eval failed with code {done.returncode}:\n{tail}")
    metrics = json.loads((output / "eval_info.json").read_text())["per_task"][0]["metrics"]
    seeds = [s for batch in json.loads(seeds_file.read_text()) for s in batch]
    rows = zip(seeds, metrics["sum_rewards"], metrics["max_rewards"], metrics["successes"], strict=False)
    return Side([Episode(int(s), float(total), float(top), bool(ok)) for s, total, top, ok in rows], wall)


def pipeline_yaml(
    folder: Path, *, episodes: int, batch_size: int, episode_length: int, seed: int, name: str = "lerobot_equality"
) -> str:
    """The pipeline that runs lerobot-eval's episodes: ``num_envs`` = batch size, ``group`` = batches, the same seed."""
    spec = {
        "name": name,
        "sim": {
            "lerobot_env": {"type": "pusht", "episode_length": episode_length, **PUSHT_96},
            "num_envs": batch_size,
            "startup_timeout_s": 180,
        },
        "agent": {"policy": {"kind": "lerobot", "path": str(folder), "device": "cpu"}, "torch_threads": 1},
        "tasks": [{"name": "push", "seed": seed}],
        "group": episodes // batch_size,
        "max_steps": episode_length,
        "rollout_timeout_s": 600,
        "graders": [{"kind": "success"}],
        "traces": {"video": "none"},
    }
    return json.dumps(spec)


def run_pipeline(path: Path, outputs: Path, project: Path) -> Side:
    """The pipeline through :func:`~hud_pipelines.eval.steps.evaluate`; max rewards from its traces."""
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.recording.trace_reader import read_trace
    from hud_pipelines.spec.loader import load_pipeline

    started = time.perf_counter()
    evaluation = evaluate(load_pipeline(path), outputs_dir=outputs, project_dir=project)
    wall = time.perf_counter() - started
    assert not evaluation.failed_instances, [r.error for r in evaluation.failed_instances]
    traces = {
        (t.header["instance"], t.header["slot"]): t
        for t in (read_trace(p) for p in evaluation.outputs.traces(evaluation.run_id).rglob("*.jsonl"))
    }
    episodes: list[Episode] = []
    for row in sorted(evaluation.rows, key=lambda r: (r.instance, r.slot)):
        rewards = [float(step["reward"]) for step in traces[(row.instance, row.slot)].steps if step["type"] == "reward"]
        assert row.seed is not None
        episodes.append(Episode(row.seed, row.total_reward, max(rewards), row.success))
    return Side(episodes, wall)
