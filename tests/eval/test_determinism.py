"""The same pipeline and seeds give bit-identical grades and dataset content however it is scheduled.

Every stochastic policy draws each episode's randomness from its own stream (policy seed, task,
episode seed), so neither ``max_concurrent`` (which instances share the process and, with
``across_instances``, a forward), ``send_ahead`` (how far steps run ahead of observations),
``num_envs`` (which instance and slot a seed runs in) nor thread timing may change a single action.
Runs are compared column by column: the grades (run ids and trace ids aside: they name the run) and
every parquet column of the published dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hud_pipelines.eval.steps import Evaluation, evaluate
from hud_pipelines.recording.trace_reader import read_trace
from hud_pipelines.spec.loader import load_pipeline
from tests.dagster.support import REPO

NOISY_POLICY = '''
import numpy as np


class Noisy:
    """A scripted controller with noise: a PD push on CartPole, flipped at random per row."""

    def infer(self, batch):
        angle = batch.observation["state"][:, 2]
        push = (angle > 0).astype(np.float32)
        flips = np.array([g.random() < 0.3 for g in batch.generators(11)])
        return np.where(flips, 1 - push, push)[:, None]
'''


def _pipeline(tmp_path: Path, name: str, policy: dict[str, Any], **fields: Any) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "sim": {"factory": "CartPole-v1", "num_envs": 4},
        "agent": {"policy": policy},
        "tasks": [{"name": "balance", "seed": 7}],
        "group": 3,
        "max_steps": 40,
        "graders": [{"kind": "return", "threshold": 30}],
        "dataset": {"repo_id": f"local/{name}"},
        **fields,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(spec))
    return path


def _run(path: Path, outputs: Path, *, max_concurrent: int, send_ahead: int, **agent: Any) -> Evaluation:
    text = json.loads(path.read_text())
    text["max_concurrent"] = max_concurrent
    text["agent"] = {**text["agent"], "send_ahead": send_ahead, **agent}
    variant = path.with_name(f"{path.stem}-{max_concurrent}-{send_ahead}.yaml")
    variant.write_text(json.dumps(text))
    evaluation = evaluate(load_pipeline(variant), outputs_dir=outputs, project_dir=REPO)
    assert evaluation.passed, [c.description for c in evaluation.checks]
    assert evaluation.dataset is not None
    return evaluation


def _grades(evaluation: Evaluation) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.as_dict().items() if k not in ("run_id", "trace_id")} for row in evaluation.rows]


def _frames(evaluation: Evaluation) -> pa.Table:
    assert evaluation.dataset is not None
    files = sorted((evaluation.dataset.path / "data").rglob("*.parquet"))
    assert files
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("index")


def _traces(evaluation: Evaluation) -> list[list[dict[str, Any]]]:
    """Every trace of the run, each line without its timing and without the ids that name the run."""
    root = evaluation.outputs.traces(evaluation.run_id)
    traces = sorted(
        (read_trace(p) for p in root.rglob("*.jsonl")),
        key=lambda t: tuple(t.header[k] for k in ("task", "instance", "slot", "episode")),
    )
    return [
        [{k: v for k, v in line.items() if k not in ("job", "trace_id")} for line in trace.without_timing()]
        for trace in traces
    ]


def _assert_identical(first: Evaluation, other: Evaluation, *, traces: bool = True) -> None:
    assert _grades(first) == _grades(other)
    mine, theirs = _frames(first), _frames(other)
    assert mine.column_names == theirs.column_names
    for column in mine.column_names:
        assert mine.column(column).equals(theirs.column(column)), f"column {column} differs"
    if traces:
        assert _traces(first) == _traces(other)
    assert first.dataset is not None
    assert other.dataset is not None
    stats = (first.dataset.path / "meta" / "stats.json").read_text()
    assert stats == (other.dataset.path / "meta" / "stats.json").read_text()
    assert list(json.loads(stats)) == sorted(json.loads(stats)), "features in a stable order, whatever the process"


@pytest.mark.parametrize(
    ("policy", "agent"),
    [
        pytest.param({"kind": "random", "seed": 3}, {}, id="random"),
        pytest.param({"kind": "random", "seed": 3}, {"batching": {"across_instances": True}}, id="random-stacked"),
        pytest.param({"kind": "scripted", "target": "noisy.py:Noisy"}, {}, id="scripted-noise"),
    ],
)
def test_a_stochastic_policy_gives_the_same_episodes_under_any_schedule(
    tmp_path: Path, policy: dict[str, Any], agent: dict[str, Any]
) -> None:
    (tmp_path / "noisy.py").write_text(NOISY_POLICY)
    path = _pipeline(tmp_path, "repeatable", policy)
    runs = [
        _run(path, tmp_path / f"out{i}", max_concurrent=concurrent, send_ahead=ahead, **agent)
        for i, (concurrent, ahead) in enumerate([(1, 0), (3, 8), (3, 8), (1, 0)])
    ]
    for other in runs[1:]:
        _assert_identical(runs[0], other)
    assert len(_traces(runs[0])) == 12
    # one instance per run, as separate runs (or machines) would: the same episodes again
    split = tmp_path / "split"
    for partition in load_pipeline(path).partitions():
        alone = evaluate(load_pipeline(path), outputs_dir=split, project_dir=REPO, partitions=[partition])
    _assert_identical(runs[0], alone, traces=False)
    steps = [row["steps"] for row in _grades(runs[0])]
    assert len(set(steps)) > 1, "the episodes differ from one another (the streams are not all the same)"
    # the same 12 seeds on sims of 3 slots: each seed in another instance and slot, the same episode
    text = json.loads(path.read_text())
    regrouped = path.with_name("regrouped.yaml")
    regrouped.write_text(json.dumps({**text, "sim": {**text["sim"], "num_envs": 3}, "group": 4}))
    other = evaluate(load_pipeline(regrouped), outputs_dir=tmp_path / "regrouped", project_dir=REPO)
    placed = ("instance", "slot", "partition", "group_id")
    by_seed = [
        sorted(({k: v for k, v in r.items() if k not in placed} for r in _grades(e)), key=lambda r: r["seed"])
        for e in (runs[0], other)
    ]
    assert by_seed[0] == by_seed[1], "num_envs moved the seeds, not their episodes"


def test_a_tasks_noise_is_its_own_wherever_it_is_listed_and_a_matrix_arm_draws_its_controls(tmp_path: Path) -> None:
    """The stream was named by the task's position: a task inserted before it changed its episodes while its
    results stayed current, and a matrix arm drew other noise than its control (paired on the env seed only)."""
    (tmp_path / "noisy.py").write_text(NOISY_POLICY)
    policy = {"kind": "scripted", "target": "noisy.py:Noisy"}
    balance = {"name": "balance", "seed": 7}
    tasks = {
        "alone": [balance],
        "inserted": [{"name": "first", "seed": 7}, balance],
        # a limit no episode of 40 steps reaches: the arm's episodes are its control's when their noise is
        "matrix": [{**balance, "matrix": {"max_episode_steps": [1000]}}],
    }
    episodes: dict[str, dict[str, list[tuple[int, int, str]]]] = {}
    for name, listed in tasks.items():
        path = _pipeline(tmp_path, name, policy, tasks=listed, group=2, dataset=None)
        evaluation = evaluate(load_pipeline(path), outputs_dir=tmp_path / name, project_dir=REPO)
        episodes[name] = {}
        for row in evaluation.rows:
            episodes[name].setdefault(row.task, []).append((row.seed, row.steps, row.status.value))
    assert episodes["inserted"]["balance"] == episodes["alone"]["balance"]
    assert episodes["matrix"]["balance-max_episode_steps-1000"] == episodes["alone"]["balance"]
    assert len({steps for _, steps, _ in episodes["alone"]["balance"]}) > 1, "the noise moves the episodes"


@pytest.mark.slow
def test_diffusion_policy_gives_the_same_episodes_under_any_schedule(tmp_path: Path) -> None:
    small = {
        "n_obs_steps": 2,
        "horizon": 16,
        "n_action_steps": 8,
        "down_dims": [32, 64],
        "diffusion_step_embed_dim": 32,
        "spatial_softmax_num_keypoints": 8,
        "crop_shape": [84, 84],
        "num_inference_steps": 2,
    }
    policy = {"kind": "lerobot", "type": "diffusion", "seed": 5, "overrides": small}
    path = _pipeline(
        tmp_path,
        "diffusing",
        policy,
        sim={"factory": "gym_pusht/PushT-v0", "args": {"obs_type": "pixels_agent_pos"}, "num_envs": 2},
        group=3,
        max_steps=12,
        graders=[{"kind": "return"}],
        dataset={"repo_id": "local/diffusing", "video": False},
    )
    runs = [
        _run(path, tmp_path / f"out{i}", max_concurrent=concurrent, send_ahead=ahead)
        for i, (concurrent, ahead) in enumerate([(1, 0), (3, 8), (3, 8)])
    ]
    for other in runs[1:]:
        _assert_identical(runs[0], other)
    actions = _frames(runs[0]).column("action").to_pylist()
    assert len({tuple(a) for a in actions}) > len(actions) // 2, "the noise differs from step to step and slot to slot"


def test_a_task_never_inherits_build_arguments_from_the_task_before_it_on_a_reused_sim(tmp_path: Path) -> None:
    policy = {"kind": "scripted", "target": "envs.controllers:CartPolePD"}
    tasks = [{"name": "short", "seed": 0, "args": {"max_episode_steps": 5}}, {"name": "plain", "seed": 0}]
    path = _pipeline(tmp_path, "tasked", policy, tasks=tasks, group=1)
    steps = {}
    for concurrent in (1, 2):  # one sim serves both tasks in turn, or each task its own sim
        evaluation = _run(path, tmp_path / f"out{concurrent}", max_concurrent=concurrent, send_ahead=0)
        steps[concurrent] = [(row.task, row.steps) for row in evaluation.rows]
    assert steps[1] == steps[2]
    assert {task: n for task, n in steps[1]} == {"short": 5, "plain": 40}


@pytest.mark.slow
def test_camera_frames_decode_the_same_under_any_schedule(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    camera = f"{REPO / 'envs' / 'camera_pendulum.py'}:camera_pendulum"
    path = _pipeline(
        tmp_path,
        "filmed",
        {"kind": "random", "seed": 9},
        sim={"factory": camera, "num_envs": 2, "args": {"max_episode_steps": 15}},
        group=2,
        max_steps=15,
        graders=[{"kind": "return"}],
        dataset={"repo_id": "local/filmed", "video": True},
    )
    one_sim = path.with_name("one-sim.yaml")  # the same four seeds on one sim of four slots, written by two writers
    text = json.loads(path.read_text())
    sim, dataset = {**text["sim"], "num_envs": 4}, {**text["dataset"], "writers": 2}
    one_sim.write_text(json.dumps({**text, "sim": sim, "group": 1, "dataset": dataset}))
    decoded = []
    published: list[dict[str, bytes]] = []
    for i, (concurrent, ahead, pipeline) in enumerate([(1, 0, path), (2, 8, path), (1, 0, one_sim)]):
        run = _run(pipeline, tmp_path / f"out{i}", max_concurrent=concurrent, send_ahead=ahead)
        assert run.dataset is not None
        dataset = LeRobotDataset("local/filmed", root=run.dataset.path)
        key = next(k for k in dataset.meta.video_keys)
        decoded.append([dataset[index][key] for index in range(dataset.num_frames)])
        published.append(_dataset_files(run))
    assert len(decoded[0]) == len(decoded[1]) == len(decoded[2]) == 4 * 15
    for first, *others in zip(*decoded, strict=True):
        assert all(first.equal(other) for other in others)
    assert any(p.endswith(".mp4") for p in published[0])
    for files in published[1:]:
        assert set(files) == set(published[0])
        assert [p for p in files if files[p] != published[0][p]] == [], "the same seeds, other dataset files"


SEED_PUSHER = '''
import numpy as np


class PushSeedFour:
    """Pushes the episode of seed 4 out of the action bounds (FaultyEnv's observation is [t, action, seed])."""

    def infer(self, batch):
        seed = batch.observation["state"][:, 2]
        return np.where(seed == 4, 5.0, 0.0).astype(np.float32)[:, None]
'''


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("nan_step", "observation 'state' is not finite"),
        ("nan_reward_step", "reward nan is not finite"),
        (
            "wrong_shape_step",
            "hud_pipelines.errors.ContractError: step: observation 'state' is float32[5], the contract says float32[3]",
        ),
    ],
)
def test_an_episodes_error_is_said_in_the_same_words_whatever_slot_num_envs_puts_it_in(
    tmp_path: Path, fault: str, said: str
) -> None:
    """Seed 5's value turns NaN (or its observation's shape breaks the contract) at step 2 and seed 4's action is
    refused as out of bounds: the rows said "(slot 1)" or "slot 1 step:" with four slots per sim and "(slot 2)" or
    "slot 2 step:" with three, so the same seeds' results differed by ``num_envs``."""
    (tmp_path / "pusher.py").write_text(SEED_PUSHER)
    faulty = {
        "factory": f"{REPO / 'envs' / 'faulty.py'}:faulty",
        "bounds": "error",
        "args": {"fault": fault, "fault_seed": 5},
    }
    by_seed: list[list[dict[str, Any]]] = []
    for num_envs, group in ((4, 3), (3, 4)):  # the same twelve seeds
        path = _pipeline(
            tmp_path,
            f"refused{num_envs}",
            {"kind": "scripted", "target": "pusher.py:PushSeedFour"},
            sim={**faulty, "num_envs": num_envs},
            tasks=[{"name": "push", "seed": 0}],
            group=group,
            max_steps=5,
            graders=[{"kind": "return", "threshold": 3}],
        )
        evaluation = evaluate(load_pipeline(path), outputs_dir=tmp_path / f"out{num_envs}", project_dir=REPO)
        rows = sorted(_grades(evaluation), key=lambda r: r["seed"])
        by_seed.append(
            [
                {k: v for k, v in r.items() if k not in ("pipeline", "instance", "slot", "partition", "group_id")}
                for r in rows
            ]
        )
        errors = {r["seed"]: r["error"] for r in rows if r["error"]}
        assert errors == {
            4: "action [5.0] is out of bounds (seed 4, step 1); expected a finite float32[A=1] (names ['action_0']) "
            "within low [-1.0], high [1.0]",
            5: f"{said} (seed 5, step 2)",
        }
    assert by_seed[0] == by_seed[1], "num_envs moved the seeds, not their episodes nor their errors"


def _dataset_files(evaluation: Evaluation) -> dict[str, bytes]:
    """Every file of the published dataset by path, but the two that say where it came from:
    ``hud_episodes.jsonl`` (each episode's instance and slot) and ``hud_published_from.json`` (the shards)."""
    assert evaluation.dataset is not None
    root = evaluation.dataset.path
    placed = ("hud_episodes.jsonl", "hud_published_from.json")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in placed)
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_the_same_seeds_publish_the_same_dataset_files_whatever_num_envs_and_writers(tmp_path: Path) -> None:
    """Two tasks' twelve seeds each on sims of four slots and of three, written by one writer per shard and by two,
    one instance at a time and three: the episodes came in the order they ended in each instance and part, so
    ``episode_index``, ``index``, the files and the last bits of the stats changed with the schedule while every
    seed's frames were the same."""
    tasks = [{"name": "balance", "seed": 7}, {"name": "again", "seed": 100, "prompt": "balance again"}]
    path = _pipeline(tmp_path, "ordered", {"kind": "random", "seed": 3}, tasks=tasks)
    text = json.loads(path.read_text())
    schedules = {
        "four-slots": {},
        "three-slots-two-writers": {
            "sim": {**text["sim"], "num_envs": 3},
            "group": 4,
            "dataset": {**text["dataset"], "writers": 2},
        },
        "four-slots-two-writers-concurrent": {"max_concurrent": 3, "dataset": {**text["dataset"], "writers": 2}},
    }
    published: dict[str, dict[str, bytes]] = {}
    records: dict[str, list[tuple[int, int]]] = {}
    for name, changes in schedules.items():
        variant = path.with_name(f"{name}.yaml")
        variant.write_text(json.dumps({**text, **changes}))
        evaluation = evaluate(load_pipeline(variant), outputs_dir=tmp_path / name, project_dir=REPO)
        assert evaluation.dataset is not None
        published[name] = _dataset_files(evaluation)
        sidecar = (evaluation.dataset.path / "meta" / "hud_episodes.jsonl").read_text().splitlines()
        records[name] = [(r["episode_index"], r["seed"]) for r in map(json.loads, sidecar)]
    first, *others = published.values()
    assert {"meta/stats.json", "meta/tasks.parquet", "meta/info.json"} <= set(first)
    assert any(p.startswith("data/") for p in first)
    assert any(p.startswith("meta/episodes/") for p in first)
    for name, files in zip(list(published)[1:], others, strict=True):
        assert set(files) == set(first), name
        assert [p for p in first if files[p] != first[p]] == [], name
    seeds = [*range(7, 19), *range(100, 112)]
    assert all(pairs == list(enumerate(seeds)) for pairs in records.values()), records
