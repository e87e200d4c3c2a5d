"""After a pipeline edit changes a feature's shape: the eval refuses the stale contract and says how to
refresh it, and ``hud-pipelines contract`` refreshes it, keeping the edits that still fit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hud_pipelines.cli.main import main
from hud_pipelines.errors import Fault
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.spec.loader import load_pipeline

SIZED = f"{Path(__file__).with_name('contract_sims.py').resolve()}:sized"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory (the working directory) with a ``pipelines/`` folder."""
    (tmp_path / "pipelines").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HUD_PIPELINES_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def write_pipeline(project: Path, dim: int | list[int]) -> Path:
    path = project / "pipelines" / "sized.yaml"
    spec = {
        "name": "sized",
        "sim": {"factory": SIZED, "args": {"dim": dim}, "contract": "contracts/sized.json"},
        "agent": {"policy": {"kind": "constant"}},
        "max_steps": 3,
    }
    path.write_text(json.dumps(spec))
    return path


def test_a_shape_change_is_refused_by_the_eval_and_refreshed_by_the_contract_command(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pipeline(project, dim=3)
    assert main(["contract", "sized"]) == 0
    contract_file = project / "pipelines" / "contracts" / "sized.json"
    edited = json.loads(contract_file.read_text())
    edited["robot_type"] = "arm"
    edited["features"]["state"] |= {"names": ["shoulder", "elbow", "wrist"], "description": "joint angles"}
    edited["features"]["action"] |= {"names": ["torque"], "description": "motor torque"}
    contract_file.write_text(json.dumps(edited))
    path = write_pipeline(project, dim=5)  # the edit that changes the observation's shape
    capsys.readouterr()

    refused = evaluate(load_pipeline(path), outputs_dir=project / "outputs", project_dir=project)
    assert not refused.passed
    assert {row.fault for row in refused.rows} == {Fault.CONTRACT}
    message = " ".join((refused.rows[0].error or "").split())
    assert "feature 'state' is observation float32[3] in the contract file but observation float32[5] in the env" in (
        message
    )
    assert "refresh it with `hud-pipelines contract sized`" in message

    assert main(["contract", "sized"]) == 0
    out = capsys.readouterr().out
    assert "state: float32[3] -> float32[5] (names dropped: shoulder, elbow, wrist)" in out
    assert f"refreshed {contract_file}: 1 feature changed" in out
    refreshed = json.loads(contract_file.read_text())
    assert refreshed["robot_type"] == "arm"
    assert refreshed["features"]["state"]["shape"] == [5]
    assert refreshed["features"]["state"]["names"] == [f"state_{i}" for i in range(5)]
    assert refreshed["features"]["state"]["description"] == "joint angles"
    assert refreshed["features"]["action"] == edited["features"]["action"]

    evaluation = evaluate(load_pipeline(path), outputs_dir=project / "outputs", project_dir=project)
    assert not evaluation.failed_instances
    assert main(["contract", "sized"]) == 0
    assert f"{contract_file} is up to date" in capsys.readouterr().out


def test_a_float_map_read_as_state_is_warned_of_by_the_contract_command_and_the_eval(
    project: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = write_pipeline(project, dim=[32, 48])
    assert main(["contract", "sized"]) == 0
    out = capsys.readouterr().out
    assert "warning: observation 'state' (float32 [32, 48]) has an image's shape but is read as state (1536 " in out
    with caplog.at_level(logging.WARNING, logger="hud_pipelines"):
        evaluate(load_pipeline(path), outputs_dir=project / "outputs", project_dir=project)
    [said] = [r.getMessage() for r in caplog.records if "has an image's shape" in r.getMessage()]
    assert said.startswith("sized: observation 'state' (float32 [32, 48])")

    import dagster as dg

    from hud_pipelines.dagster.definitions import definitions_for_file

    job = definitions_for_file(path, outputs_dir=project / "outputs", project_dir=project).resolve_job_def("sized")
    with dg.DagsterInstance.ephemeral() as instance:
        assert job.execute_in_process(instance=instance).success
        event = instance.get_latest_materialization_event(dg.AssetKey(["sized", "contract"]))
    assert event is not None
    assert event.asset_materialization is not None
    shown = str(event.asset_materialization.metadata["warnings"].value)
    assert "observation 'state' (float32 [32, 48]) has an image's shape" in shown, "the UI shows it on the contract"
