"""A sweep's kept results are read at the checkpoint the YAML names now: its path and its step, not the ones
recorded when they ran (``checkpoints/<label>/checkpoint.json``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.rows import collect_rows
from hud_pipelines.eval.steps import evaluate, report_step
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import PipelineSpec
from tests.dagster.support import REPO

pytestmark = pytest.mark.slow

BALANCES = [0.1, 0.5, 10.0, 2.0]
"""Gains of the CartPole PD law that keep the pole up; zero gains push one way and let it fall."""


def _weights(path: Path, gains: list[float]) -> Path:
    import torch

    from envs.policies import CartPoleTorchPD

    module = CartPoleTorchPD()
    with torch.no_grad():
        module.gains.copy_(torch.tensor(gains))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), path)
    past = path.stat().st_mtime - 60  # settled: a checkpoint written this second may still be being written
    os.utime(path, (past, past))
    return path


def _sweep(tmp_path: Path, checkpoints: Any) -> PipelineSpec:
    spec = {
        "name": "steps",
        "sim": {"factory": "CartPole-v1", "num_envs": 2},
        "agent": {"policy": {"kind": "torch", "target": "envs.policies:CartPoleTorchPD", "checkpoints": checkpoints}},
        "group": 1,
        "max_steps": 30,
        "graders": [{"kind": "return", "threshold": 30}],
        "checks": [{"kind": "min_success_rate", "value": 0.9}],
        "dataset": {"enabled": False},
    }
    return load_pipeline_text(json.dumps(spec), source=tmp_path / "steps.yaml")


def test_a_corrected_step_decides_the_candidate_though_every_result_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the steps recorded at the first run stood: the checks judged the checkpoint that was the latest then."""
    monkeypatch.chdir(REPO)
    _weights(tmp_path / "falls.pt", [0.0] * 4)
    _weights(tmp_path / "balances.pt", BALANCES)
    wrong = [
        {"label": "A", "path": "balances.pt", "step": 100},
        {"label": "B", "path": "falls.pt", "step": 300},
    ]
    first = evaluate(_sweep(tmp_path, wrong), outputs_dir=tmp_path / "out")
    assert not first.passed, "B, the latest, falls"
    corrected = [{**wrong[0], "step": 300}, {**wrong[1], "step": 100}]
    again = evaluate(_sweep(tmp_path, corrected), outputs_dir=tmp_path / "out")
    assert not [row for row in again.rows if row.run_id == again.run_id], "the step is no part of a result"
    assert again.passed, "A, the latest now, balances"
    table = report_step(_sweep(tmp_path, corrected), EvalOutputs(tmp_path / "out", "steps")).markdown
    assert table.index("| B | 100 |") < table.index("| A | 300 |")


def test_kept_results_follow_moved_weights_and_go_stale_when_other_weights_land_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a moved run read its recorded paths: the report said its files were gone, and other weights saved
    at the new place later showed the old results as current."""
    monkeypatch.chdir(REPO)
    _weights(tmp_path / "run" / "step_100.pt", [0.0] * 4)
    _weights(tmp_path / "run" / "step_200.pt", BALANCES)
    out = tmp_path / "out"
    first = evaluate(_sweep(tmp_path, "run"), outputs_dir=out)
    assert first.passed
    shutil.move(tmp_path / "run", tmp_path / "moved")
    spec = _sweep(tmp_path, "moved")
    outputs = EvalOutputs(out, "steps")
    assert "are gone" not in report_step(spec, outputs).markdown, "they are where the YAML says"
    assert collect_rows(spec, outputs) == first.rows, "the same weights elsewhere keep their results"

    _weights(tmp_path / "moved" / "step_200.pt", [0.0] * 4)  # training wrote other weights under the label
    stale = [row for row in collect_rows(spec, outputs) if row.checkpoint == "step_200"]
    assert {row.fault.value if row.fault else None for row in stale} == {"not_run"}
    assert all("checkpoint step_200's files changed since it ran" in (row.error or "") for row in stale)
    again = evaluate(spec, outputs_dir=out)
    assert {row.checkpoint for row in again.rows if row.run_id == again.run_id} == {"step_200"}
    assert not again.passed, "the new weights fall"


def test_weights_saved_while_a_run_plans_are_hashed_anew_not_recorded_under_the_old_hash(tmp_path: Path) -> None:
    """A member's record paired the hash taken at discovery with the files' signature read as it was written: weights
    saved in between took the old hash, were never hashed again, and their results read as current."""
    from hud_pipelines.eval import sweep

    _weights(tmp_path / "run" / "step_100.pt", BALANCES)
    spec = _sweep(tmp_path, "run")
    outputs = EvalOutputs(tmp_path / "out", "steps")
    (planned,) = sweep.members(spec, outputs, settle_s=0)
    _weights(tmp_path / "run" / "step_100.pt", [0.0] * 4)  # training saves again as the run plans
    sweep.record(planned)
    (now,) = sweep.evaluated(spec, outputs)
    assert now.changed, "the files are not those the recorded hash is of"
    assert now.content_hash != planned.content_hash


def test_the_command_that_evaluates_kept_pairs_again_is_one_contiguous_range_of_one_checkpoint_each(
    tmp_path: Path,
) -> None:
    """One command with every kept pair could not run (one run takes a contiguous range) and, as a cross product of
    its labels and instances, would have evaluated finished pairs again."""
    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.kept import sweep_kept_failure
    from hud_pipelines.eval.results import unreached_result
    from hud_pipelines.spec.loader import load_pipeline
    from tests.eval.sweep_sims import sweep_pipeline

    (tmp_path / "checkpoints").mkdir()
    path = tmp_path / "reach_sweep.yaml"
    three = sweep_pipeline(str(tmp_path / "checkpoints"), tasks=[{"name": "near", "seed": 10}], group=3)
    path.write_text(json.dumps(three))
    spec = load_pipeline(path)
    assert spec.partition_keys() == ["near-i0", "near-i1", "near-i2"]

    def attempt(key: str, run: str) -> Any:
        return unreached_result(spec, spec.partition_for_key(key), "the sim did not start", Fault.SIM_START, run_id=run)

    kept = [(label, attempt(key, "now"), attempt(key, "before")) for label, key in (("A", "near-i0"), ("A", "near-i2"))]
    kept.append(("B", attempt("near-i1", "now"), attempt("near-i1", "before")))
    said = sweep_kept_failure(spec, EvalOutputs(tmp_path / "outputs", spec.name), kept) or ""
    lines = said.splitlines()
    assert lines[0].startswith("checkpoint A: instance(s) near-i0, near-i2 did not start (sim_start: ")
    assert lines[1].startswith("checkpoint B: instance(s) near-i1 did not start")
    commands = lines[2].removeprefix("evaluate them again once they can start: ").split("; ")
    assert [command.split("--rerun ")[1] for command in commands] == [
        "--partition 'A|near-i0'",
        "--partition 'A|near-i2'",
        "--partition 'B|near-i1'",
    ]
