"""What a Dagster run's grades, report and dataset judge its results by: the configuration that run recorded,
whatever another run recorded since; and, for those assets materialized on their own, the code as it is now."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from hud_pipelines.dagster.definitions import definitions_for_file
from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.loader import load_pipeline
from tests.dagster.support import REPO, WritePipeline

CONTROLLER = """
import numpy as np

from {helper} import GAIN


class PD:
    def __call__(self, observation):
        state = np.asarray(observation["state"], dtype=np.float64).reshape(-1, 4)
        return (GAIN * state[:, 2] + state[:, 3] > 0).astype(np.float32)[:, None]
"""

OVERLAPPED = """
from pathlib import Path

from overlapped_run_gains_controller import PD
from hud_pipelines.eval.configuration import record_configuration
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.loader import load_pipeline


def overlapped(pipeline, outputs):
    '''The controller, built as the run's rollouts begin, while another run of the pipeline, with other overrides of
    its YAML, starts and records its configuration.'''
    spec = load_pipeline(Path(pipeline))
    other = spec.with_sections(max_steps=spec.max_steps + 5)
    record_configuration(other, spec, EvalOutputs(Path(outputs), spec.name), run_id="an-overlapping-run")
    return PD()
"""


def _scripted(folder: Path, helper: str) -> None:
    """``<helper>_controller.py`` importing ``<helper>.py``: names of their own (a process imports one module of a
    name, and other tests' controllers run in it)."""
    (folder / f"{helper}_controller.py").write_text(CONTROLLER.format(helper=helper))
    (folder / f"{helper}.py").write_text("GAIN = 10.0\n")


def _grades(outputs: Path, name: str) -> list[GradeRow]:
    return [GradeRow.from_dict(r) for r in json.loads(EvalOutputs(outputs, name).grades_json.read_text())]


def test_a_runs_grades_judge_by_its_own_configuration_when_an_overlapping_run_recorded_another(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    path = write_pipeline("overlapped", max_steps=30)
    _scripted(path.parent, "overlapped_run_gains")
    (path.parent / "overlapped_policy.py").write_text(OVERLAPPED)
    args = {"pipeline": str(path), "outputs": str(outputs_dir)}
    policy = {"kind": "scripted", "target": "overlapped_policy.py:overlapped", "args": args}
    path.write_text(json.dumps(json.loads(path.read_text()) | {"agent": {"policy": policy}}))

    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    result = defs.resolve_job_def("overlapped").execute_in_process(instance=instance, raise_on_error=False)

    assert result.success, "its instances ran to their end under its own configuration: every check passes"
    rows = _grades(outputs_dir, "overlapped")
    assert len(rows) == 4
    assert {row.fault for row in rows} == {None}
    assert {row.run_id for row in rows} == {result.run_id}
    recorded = json.loads(EvalOutputs(outputs_dir, "overlapped").configuration_json.read_text())
    assert recorded["run_id"] == "an-overlapping-run", "the latest record is the other run's"
    report = EvalOutputs(outputs_dir, "overlapped").report_md.read_text()
    assert f"rollout hash `{load_pipeline(path).rollout_hash}`" in report, "this run's provenance, not the other's"
    assert "`max_steps`" not in report, "the report states this run's overrides (none), not the other run's"


def test_grades_materialized_on_their_own_judge_by_the_code_as_it_is_now(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    """As ``hud-pipelines report`` does: an edit of the policy's code since the run shows its results as stale."""
    path = write_pipeline(
        "edited", agent={"policy": {"kind": "scripted", "target": "judged_now_gains_controller.py:PD"}}
    )
    _scripted(path.parent, "judged_now_gains")
    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    job = defs.resolve_job_def("edited")
    assert job.execute_in_process(instance=instance).success
    assert {row.fault for row in _grades(outputs_dir, "edited")} == {None}

    judged = [dg.AssetKey(["edited", "grades"]), dg.AssetKey(["edited", "report"])]
    again = job.execute_in_process(instance=instance, asset_selection=judged)
    assert again.success, "the same code: still current"
    assert {row.fault for row in _grades(outputs_dir, "edited")} == {None}

    (path.parent / "judged_now_gains.py").write_text("GAIN = 1.0\n")
    job.execute_in_process(instance=instance, asset_selection=judged, raise_on_error=False)
    rows = _grades(outputs_dir, "edited")
    assert {row.fault for row in rows} == {Fault.NOT_RUN}, "results of the code before the edit are not current"
    assert all("code or weights changed: judged_now_gains.py" in (row.error or "") for row in rows)
    assert "errored 4" in EvalOutputs(outputs_dir, "edited").report_md.read_text()
