"""A sweep through Dagster: the CLI, the checkpoint dimension, resumption and the sensor, on a lerobot-train run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hud_pipelines.cli.main import main
from hud_pipelines.dagster import sweeps
from hud_pipelines.dagster.definitions import definitions_for_file
from hud_pipelines.eval import sweep
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.sweep_table import SweepComparison
from hud_pipelines.spec.loader import load_pipeline
from tests.agent.checkpoint_runs import (
    LeRobotRun,
    age,
    copy_run,
    lerobot_run_fixture,  # noqa: F401 - the session's run, shared with the checkpoint tests
    write_lerobot_run,
)
from tests.dagster.support import REPO
from tests.eval.sweep_sims import CRASH, sweep_pipeline

pytestmark = pytest.mark.slow


def _write_sweep(directory: Path, checkpoints: str, **fields: Any) -> Path:
    spec = sweep_pipeline(checkpoints, **{"tasks": [{"name": "near", "seed": 10}], **fields})
    path = directory / "reach_sweep.yaml"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture(name="run")
def run_fixture(lerobot_run: LeRobotRun, tmp_path: Path) -> LeRobotRun:
    run = copy_run(lerobot_run, tmp_path / "train")
    age(run.output_dir, 60)
    return run


@pytest.fixture(name="local")
def local_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local Dagster home and outputs folder for ``hud-pipelines run``; returns the outputs folder."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("HUD_PIPELINES_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    return tmp_path / "outputs"


def test_a_run_asked_for_right_after_a_checkpoint_was_saved_waits_for_it_to_settle(
    run: LeRobotRun, tmp_path: Path, local: Path
) -> None:
    del local
    newest = run.output_dir / "checkpoints" / "001500"
    spec = load_pipeline(_write_sweep(tmp_path, str(run.output_dir)))
    heard: list[str] = []
    with dg.DagsterInstance.get() as instance:
        age(newest, 3.0)  # saved three seconds ago: two more seconds and it has settled
        assert [p.checkpoint.label for p in sweep.discover(spec).pending] == ["001500"]
        _, labels, _ = sweeps.run_tags(instance, spec, spec.partition_keys(), say=heard.append)
    assert labels == ["000500", "001000", "001500"], "the settling checkpoint is waited for, not skipped"
    assert heard == ["waiting up to 10 s for checkpoint(s) 001500, written moments ago, to settle"], "said, not silent"


def test_a_run_names_the_checkpoints_it_leaves_out_because_they_are_incomplete(
    run: LeRobotRun, tmp_path: Path, local: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run.checkpoints_dir / "001500" / "pretrained_model" / "model.safetensors").unlink()
    spec = load_pipeline(_write_sweep(tmp_path, str(run.output_dir)))
    with dg.DagsterInstance.get() as instance:
        _, labels, waiting = sweeps.run_tags(instance, spec, spec.partition_keys())
    assert labels == ["000500", "001000"]
    assert waiting == "001500: missing model.safetensors"
    assert main(["validate", str(_write_sweep(tmp_path, str(run.output_dir)))]) == 0
    out = capsys.readouterr().out
    assert "x 2 checkpoint(s) found now = 8; not complete yet: 001500: missing model.safetensors)" in out

    assert main(["run", str(_write_sweep(tmp_path, str(run.output_dir))), "--quiet", "--checkpoint", "000500"]) == 0
    report = (local / "reach_sweep" / "report.md").read_text()
    assert "Not evaluated yet: 001500: missing model.safetensors; 001000: complete, not run yet." in report
    page = (local / "reach_sweep" / "report.html").read_text()
    assert "Not evaluated yet: 001500: missing model.safetensors; 001000: complete, not run yet." in page


def test_what_a_resumed_sweep_counts_as_kept_is_judged_under_the_deployment_file_as_the_run_judges_it(
    run: LeRobotRun, tmp_path: Path, local: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, first = _swept_once(run, tmp_path, local)
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("pipelines:\n  reach_sweep: {sim: {args: {reach: 0.5}}}\n")
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    capsys.readouterr()
    one = f"000500|{load_pipeline(path).partition_keys()[0]}"
    assert main(["run", str(path), "--quiet", "--partition", one]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "this run, 000500: success rate" in said
    assert "all 4 rows of 000500, with 0 from other runs and 2 stale (run before the configuration" in said, said
    assert main(["run", str(path), "--quiet", "--checkpoint", "000500"]) == 0
    kept = "1 of 2 (checkpoint, instance) pairs keep their current result"
    assert kept in " ".join(capsys.readouterr().err.split()), "another sim: only the pair just run under it is current"
    assert _run_ids(local)["000500"].isdisjoint(first), "the run evaluated the checkpoint again"

    capsys.readouterr()
    assert main(["run", str(path), "--quiet", "--checkpoint", "000500"]) == 0
    instances = len(load_pipeline(path).partition_keys())
    kept = f"{instances} of {instances} (checkpoint, instance) pairs keep their current result"
    assert kept in capsys.readouterr().err, "under the same deployment, the results are current"


def test_a_sim_that_crashes_under_a_rerun_keeps_each_pairs_earlier_result_and_the_run_fails_saying_so(
    run: LeRobotRun, tmp_path: Path, local: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's pairs recorded every attempt: the crashed rerun replaced complete results with sim_crashed rows."""
    path, first = _swept_once(run, tmp_path, local)
    capsys.readouterr()
    monkeypatch.setenv(CRASH, "1")  # the same configuration: only the sims die
    assert main(["run", str(path), "--quiet", "--checkpoint", "000500", "--rerun"]) != 0
    printed = capsys.readouterr()
    said = " ".join((printed.out + printed.err).split())
    assert "checkpoint 000500: instance(s) " in said, said
    assert "did not complete (sim_crashed: " in said
    assert "are kept, as nothing ran to replace them" in said
    command = said.split("evaluate them again once they can start: ")[1]
    assert "--partition '000500|near-i0'" in command
    assert "--rerun" in command, "a plain run skips a pair whose kept result is current"
    assert _run_ids(local)["000500"] == first, "the earlier complete results stand"
    rows = json.loads((local / "reach_sweep" / "grades.json").read_text())
    assert {row["status"] for row in rows} <= {"succeeded", "failed"}, "no errored row replaced a measured one"


def test_validate_counts_a_sweeps_episodes_per_checkpoint_and_over_the_checkpoints_found(
    run: LeRobotRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_sweep(tmp_path, str(run.output_dir))
    assert main(["validate", str(path)]) == 0
    assert "4 episodes per checkpoint x 3 checkpoint(s) found now = 12)" in capsys.readouterr().out


def _swept_once(run: LeRobotRun, tmp_path: Path, local: Path) -> tuple[Path, set[str]]:
    """The sweep of ``run``'s checkpoints, its checkpoint 000500 evaluated: its path and the runs that did it."""
    path = _write_sweep(tmp_path, str(run.output_dir))
    assert main(["run", str(path), "--quiet", "--checkpoint", "000500"]) == 0
    return path, _run_ids(local)["000500"]


def _run_ids(outputs: Path) -> dict[str, set[str]]:
    grades = json.loads((outputs / "reach_sweep" / "grades.json").read_text())
    ids: dict[str, set[str]] = {}
    for row in grades:
        ids.setdefault(row["checkpoint"], set()).add(row["run_id"])
    return ids


def test_hud_pipelines_run_sweeps_every_checkpoint_then_only_what_is_missing(
    run: LeRobotRun, tmp_path: Path, local: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_sweep(tmp_path, str(run.output_dir))
    assert main(["run", str(path), "--quiet", "--checkpoint", "001000"]) == 0
    assert set(_run_ids(local)) == {"001000"}

    capsys.readouterr()
    assert main(["run", str(path), "--quiet"]) == 0  # the two missing checkpoints, not 001000 again
    printed = capsys.readouterr()
    instances = len(load_pipeline(path).partition_keys())
    kept = f"{instances} of {3 * instances} (checkpoint, instance) pairs keep their current result"
    assert kept in printed.err, "the progress bar counts only what the run evaluates, and says what it keeps"
    summary = [line for line in printed.out.splitlines() if line.startswith("this run")]
    assert [line.split(":")[0] for line in summary] == ["this run, 000500", "this run, 001500"], summary
    assert all("scheduled 4 = succeeded" in line for line in summary), "a rate per checkpoint, never one pooled"
    compared = SweepComparison.from_json((local / "reach_sweep" / "comparison.json").read_text())
    candidate = [line for line in printed.out.splitlines() if line.startswith("candidate ")]
    assert candidate == [compared.summary_lines()[0]], "the checkpoints compared, as the report has them"
    assert candidate[0].startswith("candidate 001500: ")
    assert "; vs previous: " in candidate[0]
    assert compared.conclusion() in printed.out
    ids = _run_ids(local)
    assert set(ids) == {"000500", "001000", "001500"}
    assert ids["000500"] == ids["001500"] != ids["001000"]

    table = list(csv.DictReader((local / "reach_sweep" / "comparison.csv").read_text().splitlines()))
    assert [(r["checkpoint"], r["step"], r["task"]) for r in table] == [
        ("000500", "500", "near"),
        ("000500", "500", "all"),
        ("001000", "1000", "near"),
        ("001000", "1000", "all"),
        ("001500", "1500", "near"),
        ("001500", "1500", "all"),
    ]
    assert {r["episodes"] for r in table} == {"4"}
    assert (local / "reach_sweep" / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Checkpoints" in (local / "reach_sweep" / "report.md").read_text()
    with dg.DagsterInstance.get() as instance:  # the comparison asset, as the UI shows it
        event = instance.get_latest_materialization_event(dg.AssetKey(["reach_sweep", "comparison"]))
        instances = instance.get_latest_materialization_event(dg.AssetKey(["reach_sweep", "instances"]))
    assert instances is not None
    assert instances.asset_materialization is not None
    shown = instances.asset_materialization.metadata["provenance"].value
    assert isinstance(shown, dict)
    assert shown["packages"]["lerobot"], "the UI shows where the results came from"
    assert event is not None
    assert event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert len(metadata["comparison"].value.records) == 6  # pyright: ignore[reportAttributeAccessIssue]
    assert "data:image/png;base64," in str(metadata["success_by_step"].value)
    assert metadata["best"].value in {"000500", "001000", "001500"}

    assert main(["run", str(path), "--quiet", "--checkpoint", "000500", "--rerun"]) == 0
    assert "keep their current result" not in capsys.readouterr().err
    again = _run_ids(local)
    assert again["001000"] == ids["001000"]
    assert again["001500"] == ids["001500"]
    assert again["000500"] != ids["000500"], "--rerun runs the chosen checkpoint again"

    capsys.readouterr()
    assert main(["run", str(path), "--quiet", "--checkpoint", "009999"]) == 2
    assert "no checkpoint labelled 009999; complete: 000500, 001000, 001500" in capsys.readouterr().err
    assert main(["run", str(path), "--quiet", "--checkpoint", "001550"]) == 2
    assert "no checkpoint labelled 001550 (did you mean '001500'?); complete:" in capsys.readouterr().err
    assert main(["run", str(path), "--quiet", "--checkpoint", "1000"]) == 0, "a step number names its checkpoint"
    assert "2 of 2 (checkpoint, instance) pairs keep their current result" in capsys.readouterr().err, "one, not all"


def test_the_jobs_default_range_is_the_registered_complete_checkpoints_in_their_order(
    run: LeRobotRun, tmp_path: Path, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    del local
    spec = load_pipeline(_write_sweep(tmp_path, str(run.output_dir)))
    assert sweeps.default_tags(spec) == {}, "nothing registered: no range (the run refuses, saying how)"
    with dg.DagsterInstance.get() as instance:
        sweeps.register(instance, spec, ["001000", "000500"])
    assert sweeps.default_tags(spec) == sweeps.range_tags(spec, ["001000", "000500"]), "Dagster's order"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "no_instance"))
    assert sweeps.default_tags(spec) == {}, "a home that is no instance yet loads, with no range"


def test_a_run_of_one_partition_of_a_sweep_runs_it(run: LeRobotRun, tmp_path: Path, local: Path) -> None:
    """A pair picked alone in the UI (or by a backfill) carries a partition key and no range: it runs."""
    path = _write_sweep(tmp_path, str(run.output_dir))
    # nothing registered: no default range; the project is the repository, where the child imports the sim from
    defs = definitions_for_file(path, outputs_dir=local, project_dir=REPO)
    with dg.DagsterInstance.get() as instance:
        sweeps.register(instance, load_pipeline(path), ["001000"])
        done = defs.resolve_job_def("reach_sweep").execute_in_process(
            instance=instance, partition_key="001000|near-i0", raise_on_error=False
        )
    assert done.success, [e.message for e in done.all_events if e.is_failure]
    assert set(_run_ids(local)) == {"001000"}

    stale = definitions_for_file(path, outputs_dir=local, project_dir=REPO).resolve_job_def("reach_sweep")
    assert stale.tags == sweeps.range_tags(load_pipeline(path), ["001000"]), "its default range, read at load"
    with dg.DagsterInstance.get() as instance:
        sweeps.register(instance, load_pipeline(path), ["000500"])  # registered since the code location loaded
        stale_run = stale.execute_in_process(instance=instance, raise_on_error=False)
        said = [e.message for e in instance.all_logs(stale_run.run_id) if "outside this run's range" in e.message]
        again = defs.resolve_job_def("reach_sweep").execute_in_process(
            instance=instance, partition_key="001000|near-i0", raise_on_error=False
        )
        picked = [e.message for e in instance.all_logs(again.run_id) if "outside this run's range" in e.message]
        kept = [
            event.dagster_event.partition
            for event in instance.all_logs(again.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            if event.dagster_event is not None
            and event.dagster_event.asset_key == dg.AssetKey(["reach_sweep", "rollouts"])
        ]
    # the pair kept its result, and is materialized all the same: a backfill ("Materialize all") otherwise marks it
    # failed, and never grades
    assert kept == ["001000|near-i0"]
    assert stale_run.success
    [warned] = said  # a stale default range leaves out what was registered since: the log says which
    assert "registered checkpoint(s) 000500 are outside this run's range" in warned
    assert not picked, "a partition picked on purpose is no stale range"


def test_dagster_job_execute_runs_the_registered_checkpoints_in_their_order_and_names_the_others(
    run: LeRobotRun, tmp_path: Path, local: Path
) -> None:
    """``dagster job execute -j <sweep>`` runs its default range: the registered complete checkpoints, in the
    order Dagster keeps them (a lower step registered later stands last), never one Dagster does not know."""
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    spec = load_pipeline(_write_sweep(pipelines, str(run.output_dir)))
    with dg.DagsterInstance.get() as instance:  # 001000 first, then the lower 000500; 001500 not yet
        sweeps.register(instance, spec, ["001000"])
        sweeps.register(instance, spec, ["000500"])
    dagster = str(Path(sys.executable).parent / "dagster")
    done = subprocess.run(
        [dagster, "job", "execute", "-m", "hud_pipelines.definitions", "-j", "reach_sweep"],
        check=False,
        env={**os.environ, "HUD_PIPELINES_DIR": str(pipelines), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ids = _run_ids(local)
    assert set(ids) == {"000500", "001000"}, "both registered checkpoints, whatever their order"
    assert len(ids["000500"] | ids["001000"]) == 1, "in one run"
    said = done.stdout + done.stderr
    assert "complete checkpoint(s) 001500 are not registered, so no range holds them" in said


def test_the_sensor_asks_once_more_for_a_registered_checkpoint_whose_run_was_cut_short(
    run: LeRobotRun, tmp_path: Path, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registered checkpoint is not new: when the run evaluating it was cancelled (the UI's Terminate, a stopped
    ``dagster dev``), its interrupted instances were never asked for again, and every later run of the sweep failed
    its ``instances_completed`` on them until someone reran them by hand."""
    import dataclasses

    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.results import InstanceResult
    from hud_pipelines.eval.steps import evaluate

    path = _write_sweep(tmp_path, str(run.output_dir))
    spec = load_pipeline(path)
    defs = definitions_for_file(path, outputs_dir=local, project_dir=tmp_path)
    sensor = defs.resolve_sensor_def("reach_sweep__checkpoints")
    evaluate(spec, outputs_dir=local, checkpoints=["000500"])
    result_path = EvalOutputs(local, "reach_sweep").member("000500").result(spec.partition_key(0, 1))
    finished = InstanceResult.read(result_path)
    dataclasses.replace(finished, fault=Fault.INTERRUPTED, run_id="cancelled").write(result_path)
    with dg.instance_for_test() as instance:
        sweeps.register(instance, spec, ["000500", "001000", "001500"])  # the others registered, not run: not asked

        def requests() -> list[dg.RunRequest]:
            return list(
                sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests or []
            )

        [request] = requests()
        assert (request.run_key or "").startswith("000500@resume-"), request.run_key
        read: list[Path] = []
        reading = InstanceResult.read

        def counted(path: Path) -> InstanceResult:
            read.append(path)
            return reading(path)

        monkeypatch.setattr(InstanceResult, "read", counted)
        assert request.tags[sweeps.CHECKPOINTS_TAG] == "000500"
        assert request.tags[sweeps.RANGE_START_TAG] == "000500|near-i0"
        assert [r.run_key for r in requests()] == [request.run_key], "one key for one cut-short run: asked once"
        assert read == [], "a result is read once per version, not on every tick"
        finished.write(result_path)  # the run it asked for finished it
        assert not requests()
        assert read == [result_path]
        dataclasses.replace(finished, fault=Fault.SIM_CRASHED, run_id="crashed").write(result_path)
        assert not requests(), "an instance's own fault is not run again and again: its check says how to rerun it"


def test_the_sensor_asks_once_more_for_the_checkpoints_its_cancelled_run_had_not_reached(
    run: LeRobotRun, tmp_path: Path, local: Path
) -> None:
    """A run cancelled before it reached a checkpoint's instances (its sim starting, its units queued on Celery)
    leaves no result saying it was interrupted: the checkpoint, registered, was never asked for again."""
    from dagster._core.storage.dagster_run import DagsterRun

    from hud_pipelines.eval.steps import evaluate

    path = _write_sweep(tmp_path, str(run.output_dir))
    spec = load_pipeline(path)
    defs = definitions_for_file(path, outputs_dir=local, project_dir=tmp_path)
    sensor = defs.resolve_sensor_def("reach_sweep__checkpoints")
    evaluate(spec, outputs_dir=local, checkpoints=["000500"])
    with dg.instance_for_test() as instance:
        sweeps.register(instance, spec, ["000500", "001000", "001500"])

        def requests() -> list[dg.RunRequest]:
            context = dg.build_sensor_context(instance=instance, definitions=defs, sensor_name=sensor.name)
            return list(sensor.evaluate_tick(context).run_requests or [])

        def ended(run_id: str, status: dg.DagsterRunStatus, labels: str, sensor_name: str = sensor.name) -> None:
            tags = {"dagster/sensor_name": sensor_name, sweeps.CHECKPOINTS_TAG: labels}
            instance.add_run(DagsterRun(job_name="reach_sweep", run_id=run_id, status=status, tags=tags))

        ended("failed-run", dg.DagsterRunStatus.FAILURE, "001000")
        ended("by-hand", dg.DagsterRunStatus.CANCELED, "001000", sensor_name="")
        assert not requests(), "a failed run, or one this sensor did not ask for, is not asked for again"
        ended("cancelled-run", dg.DagsterRunStatus.CANCELED, "000500,001000")
        [request] = requests()
        assert request.run_key == "001000@cancelled-cancelled-ru", "000500 has its results: only 001000 is asked"
        assert request.tags[sweeps.CHECKPOINTS_TAG] == "001000"
        assert [r.run_key for r in requests()] == [request.run_key], "one key per cancelled run: asked once"
        evaluate(spec, outputs_dir=local, checkpoints=["001000"])  # the run it asked for
        assert not requests()


def test_new_weights_of_a_checkpoint_a_cancelled_run_left_unfinished_are_asked_for_by_their_own_key(
    run: LeRobotRun, tmp_path: Path, local: Path
) -> None:
    """A checkpoint that lacks a result after a cancelled run, then gets new weights, is asked for under the key of
    its new weights: the cancelled run's key, once used, stood in for it, and Dagster dropped the request."""
    from dagster._core.storage.dagster_run import DagsterRun

    from hud_pipelines.eval.steps import evaluate

    path = _write_sweep(tmp_path, str(run.output_dir))
    spec = load_pipeline(path)
    defs = definitions_for_file(path, outputs_dir=local, project_dir=tmp_path)
    sensor = defs.resolve_sensor_def("reach_sweep__checkpoints")
    evaluate(spec, outputs_dir=local, checkpoints=["000500"])
    EvalOutputs(local, "reach_sweep").member("000500").result(spec.partition_keys()[0]).unlink()  # never reached
    with dg.instance_for_test() as instance:
        sweeps.register(instance, spec, ["000500", "001000", "001500"])
        tags = {"dagster/sensor_name": sensor.name, sweeps.CHECKPOINTS_TAG: "000500"}
        instance.add_run(DagsterRun(job_name="reach_sweep", run_id="cancelled", status=_CANCELED, tags=tags))

        def keys() -> list[str | None]:
            context = dg.build_sensor_context(instance=instance, definitions=defs, sensor_name=sensor.name)
            return [request.run_key for request in sensor.evaluate_tick(context).run_requests or []]

        assert keys() == ["000500@cancelled-cancelled"]
        weights = run.pretrained(500) / "model.safetensors"
        weights.write_bytes((run.pretrained(1000) / "model.safetensors").read_bytes())
        age(run.output_dir, 60)
        [key] = keys()
        assert (key or "").startswith("000500@"), key
        assert "cancelled" not in (key or ""), "its new weights' key"


_CANCELED = dg.DagsterRunStatus.CANCELED


def test_the_sensor_registers_and_runs_only_new_complete_checkpoints(
    run: LeRobotRun, tmp_path: Path, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write_sweep(tmp_path, str(run.output_dir))
    spec = load_pipeline(path)
    defs = definitions_for_file(path, outputs_dir=local, project_dir=tmp_path)
    sensor = defs.resolve_sensor_def("reach_sweep__checkpoints")
    name = sweeps.checkpoints_partitions_name("reach_sweep")
    with dg.instance_for_test() as instance:
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        [request] = first.run_requests or []  # one run: its checks judge a candidate it evaluates itself
        assert request.run_key == "000500+001000+001500"
        assert request.tags[sweeps.RANGE_START_TAG] == "000500|near-i0"
        assert request.tags[sweeps.RANGE_END_TAG] == "001500|near-i1"
        assert request.tags[sweeps.CHECKPOINTS_TAG] == "000500,001000,001500"
        added = [k for r in first.dynamic_partitions_requests or [] for k in getattr(r, "partition_keys", [])]
        instance.add_dynamic_partitions(name, added)

        from dagster._core.storage.dagster_run import DagsterRun

        running = DagsterRun(job_name="reach_sweep", run_id="evaluating", status=dg.DagsterRunStatus.STARTED)
        instance.add_run(running)
        busy = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert not busy.run_requests
        assert "run evaluating of reach_sweep has not ended" in (busy.skip_message or "")
        instance.report_run_failed(running)

        quiet = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert not quiet.run_requests
        assert "no new or changed complete checkpoint" in (quiet.skip_message or "")

        extra = write_lerobot_run(tmp_path / "extra" / run.output_dir.name, [2000])
        (extra.pretrained(2000) / "model.safetensors").rename(tmp_path / "held_back.safetensors")
        target = run.checkpoints_dir / "002000"
        extra.step_dirs[2000].rename(target)
        waiting = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert not waiting.run_requests
        assert "002000: missing model.safetensors" in (waiting.skip_message or "")

        (tmp_path / "held_back.safetensors").rename(target / "pretrained_model" / "model.safetensors")
        age(target, 60)
        new = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert [r.run_key for r in new.run_requests or []] == ["002000"]
        assert spec.is_sweep
        instance.add_dynamic_partitions(name, ["002000"])

        from hud_pipelines.eval.steps import evaluate

        evaluate(spec, outputs_dir=local, checkpoints=["000500"])
        weights = run.pretrained(500) / "model.safetensors"
        first_weights, other_weights = weights.read_bytes(), (run.pretrained(1000) / "model.safetensors").read_bytes()

        def rewritten(content: bytes) -> dg.RunRequest:
            """The request the sensor makes once 000500's weights are rewritten (the run it asks for then starts)."""
            weights.write_bytes(content)
            age(run.output_dir, 60)
            [request] = (
                sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests or []
            )
            [changed] = [m for m in sweep.evaluated(spec, EvalOutputs(local, "reach_sweep")) if m.label == "000500"]
            sweep.record(changed)
            return request

        request = rewritten(other_weights)  # a restarted training run
        assert (request.run_key or "").startswith("000500@"), "an evaluated checkpoint's new weights run again"
        assert request.tags[sweeps.RANGE_START_TAG] == "000500|near-i0"
        keys = [request.run_key, *(rewritten(w).run_key for w in (first_weights, other_weights, first_weights))]
        assert len(set(keys)) == 4, f"each write of the weights runs, even of content seen before: {keys}"
        weights.write_bytes(other_weights)
        age(run.output_dir, 60)
        looks = [sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)) for _ in range(2)]
        [first_look, second_look] = [[r.run_key for r in look.run_requests or []] for look in looks]
        assert len(first_look) == 1
        assert first_look == second_look, "one write of the files is one key, however often seen"

        hashed: list[Path] = []
        monkeypatch.setattr(sweep.Checkpoint, "content_hash", lambda self: hashed.append(self.path) or "x")
        weights.write_bytes(first_weights)  # being written now: not settled
        writing = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert not writing.run_requests
        assert not hashed, "a checkpoint still being written is not hashed at every look"
