"""Evals of sharded sims (``sim.shards``): the episodes of one sim, and a child's death errors its instance.

An eval with ``shards: 2`` is compared with the same eval unsharded, column by column (grades, every
parquet column of the dataset, every trace line), the way schedules are compared in
``test_determinism``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.errors import Fault
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.loader import load_pipeline_text
from tests.conftest import wait_group_gone
from tests.dagster.support import REPO, SIMS
from tests.eval.test_determinism import _assert_identical, _grades, _pipeline, _run


@pytest.mark.parametrize("num_envs", [4, 5])
def test_a_sharded_eval_runs_the_episodes_of_one_sim_of_all_the_slots(tmp_path: Path, num_envs: int) -> None:
    """Random actions from per-episode streams, steps sent ahead, a sim reused by the next instance."""
    runs = []
    for shards in (1, 2):
        sim = {"factory": "CartPole-v1", "num_envs": num_envs, "shards": shards}
        folder = tmp_path / f"k{shards}"
        folder.mkdir()
        path = _pipeline(folder, "sharded", {"kind": "random", "seed": 3}, sim=sim, group=2)
        runs.append(_run(path, folder / "out", max_concurrent=1, send_ahead=2))
    single, sharded = runs
    _assert_identical(single, sharded)
    assert len(single.rows) == 2 * num_envs
    assert len({row["steps"] for row in _grades(single)}) > 1, "the episodes differ from one another"


def test_a_shard_killed_mid_run_errors_its_instance_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instance 0 has seeds 4-7; the child of slots 2-3 kills itself at step 5 of seed 7's episode."""
    monkeypatch.chdir(REPO)
    pids = tmp_path / "pids.log"
    text: dict[str, Any] = {
        "name": "killed_shard",
        "sim": {
            "factory": f"{SIMS}:cartpole",
            "num_envs": 4,
            "shards": 2,
            "args": {"pid_log": str(pids), "crash_seeds": [7]},
            "step_timeout_s": 10,
        },
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "tasks": [{"name": "balance", "seed": 4}],
        "group": 2,
        "max_steps": 30,
        "graders": [{"kind": "return", "threshold": 25}],
    }
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "killed_shard.yaml")
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=REPO)
    results = {r.instance: r for r in evaluation.results}
    crashed = results[0]
    assert crashed.failed
    assert crashed.fault is Fault.SIM_CRASHED
    assert "shard 1 of 2 (slots 2-3)" in (crashed.error or "")
    crashed_rows = [row for row in evaluation.rows if row.instance == 0]
    assert [row.status for row in crashed_rows] == [EpisodeStatus.ERRORED] * 4, "errored, never failed"
    assert {row.fault for row in crashed_rows} == {Fault.SIM_CRASHED}
    assert not results[1].failed, "the next instance gets fresh children"
    assert all(row.status is not EpisodeStatus.ERRORED for row in evaluation.rows if row.instance == 1)
    children = [int(line) for line in pids.read_text().split()]
    assert len(set(children)) == 4, "two children for each instance"
    for pid in children:
        wait_group_gone(pid)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
