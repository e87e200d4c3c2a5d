"""Pipelines as Dagster asset graphs, run in process: composition, failures, re-runs, resources."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import dagster as dg
import pytest

from hud_pipelines.dagster.definitions import build_definitions, definitions_for_file
from hud_pipelines.dagster.overlap import HOST_TAG, PID_RUN_TAG, PID_TAG
from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.recording.events import EpisodeStatus
from tests.dagster.support import REPO, SIMS, WritePipeline, sim_processes


def _run(path: Path, outputs: Path, instance: dg.DagsterInstance, **kwargs: object) -> dg.ExecuteInProcessResult:
    defs = definitions_for_file(path, outputs_dir=outputs, project_dir=REPO)
    name = json.loads(path.read_text())["name"]
    return defs.resolve_job_def(name).execute_in_process(instance=instance, raise_on_error=False, **kwargs)  # type: ignore[arg-type]


def _grades(outputs: Path, name: str) -> list[GradeRow]:
    return [GradeRow.from_dict(r) for r in json.loads(EvalOutputs(outputs, name).grades_json.read_text())]


def test_every_bundled_pipeline_loads_into_definitions() -> None:
    defs = build_definitions(REPO / "pipelines")
    dg.Definitions.validate_loadable(defs)
    names = sorted(p.stem for p in (REPO / "pipelines").glob("*.yaml"))
    assert names, "no bundled pipelines"
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    for path in (REPO / "pipelines").glob("*.yaml"):
        from hud_pipelines.spec.loader import load_pipeline

        spec = load_pipeline(path)
        assert spec.name in jobs
        assert {f"{spec.name}/{a}" for a in ("contract", "rollouts", "grades", "report")} <= keys


def test_group_times_num_envs_gives_one_graded_row_per_slot(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path, label: str
) -> None:
    pid_log = tmp_path / "pids.txt"
    path = write_pipeline(
        "compose",
        sim={"args": {"pid_log": str(pid_log)}, "num_envs": 2},
        tasks=[{"name": "near", "seed": 0}, {"name": "far", "seed": 100}],
        group=3,
        max_concurrent=2,
    )
    from dagster._core.storage.dagster_run import DagsterRun

    live = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PID_RUN_TAG: "other"}  # this process lives
    instance.add_run(DagsterRun(job_name="compose", run_id="other", status=dg.DagsterRunStatus.STARTED, tags=live))
    result = _run(path, outputs_dir, instance)
    assert result.success
    said = [e.message for e in instance.all_logs(result.run_id) if "run other of compose" in e.message]
    assert said, "a run launched from Dagster warns of another live run of its pipeline"
    recorded = instance.get_run_by_id(result.run_id)
    assert recorded is not None
    assert recorded.tags[PID_TAG] == str(os.getpid()), (
        "a run launched from Dagster names the process that ran its instances"
    )
    rows = _grades(outputs_dir, "compose")
    assert len(rows) == 2 * 3 * 2
    assert len({(r.task, r.instance, r.slot) for r in rows}) == len(rows)
    for row in rows:
        base = 0 if row.task == "near" else 100
        assert row.seed == base + row.instance * 2 + row.slot
        assert row.group_id == f"{row.task}-i{row.instance}"
        assert row.status is EpisodeStatus.SUCCEEDED  # the PD controller outlasts 30 steps
    materialized = instance.get_materialized_partitions(dg.AssetKey(["compose", "rollouts"]))
    assert materialized == {f"{t}-i{i}" for t in ("near", "far") for i in range(3)}
    observations = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert len(observations) == 6
    # max_concurrent sims at most, reused across the six instances (the contract's sim included)
    assert len(set(pid_log.read_text().split())) <= 2
    assert not sim_processes(label)


def test_a_crashed_instance_fails_its_partition_and_the_others_keep_their_results(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path, label: str
) -> None:
    marker = tmp_path / "crash-armed"
    marker.touch()
    # seeds are instance * 2 + slot: seed 2 is instance 1, slot 0
    path = write_pipeline("crashy", sim={"args": {"crash_seeds": [2], "crash_file": str(marker)}}, group=3)
    result = _run(path, outputs_dir, instance)
    assert not result.success
    rollouts = dg.AssetKey(["crashy", "rollouts"])
    assert instance.get_materialized_partitions(rollouts) == {"task0-i0", "task0-i2"}
    failed = InstanceResult.read(EvalOutputs(outputs_dir, "crashy").result("task0-i1"))
    assert failed.failed
    assert "SIGKILL" in (failed.error or "")
    assert {r.status for r in failed.rows} == {EpisodeStatus.ERRORED}
    kept = InstanceResult.read(EvalOutputs(outputs_dir, "crashy").result("task0-i0"))
    assert not kept.failed
    assert {r.status for r in kept.rows} == {EpisodeStatus.SUCCEEDED}
    assert not sim_processes(label)

    marker.unlink()  # the fault is gone: re-run the failed instance alone
    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    job = defs.resolve_job_def("crashy")
    rerun = job.execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": "task0-i1", "dagster/asset_partition_range_end": "task0-i1"},
    )
    assert rerun.success
    assert instance.get_materialized_partitions(rollouts) == {"task0-i0", "task0-i1", "task0-i2"}
    rows = _grades(outputs_dir, "crashy")
    assert len(rows) == 6
    assert {r.status for r in rows} == {EpisodeStatus.SUCCEEDED}

    marker.touch()  # the fault again: instance 1 crashes, its earlier result is kept and the eval step fails
    from hud_pipelines.dagster.overlap import launcher_tags

    copied = launcher_tags(rerun.run_id)  # the UI re-executing a run hud-pipelines run launched copies its tags
    again = _run(path, outputs_dir, instance, tags=copied)
    assert not again.success
    regraded = _grades(outputs_dir, "crashy")  # written again: instance 1's kept rows, the others' new ones
    assert [(r.group_id, r.status, r.run_id) for r in regraded if r.instance == 1] == [
        ("task0-i1", EpisodeStatus.SUCCEEDED, rerun.run_id)
    ] * 2
    assert {(r.status, r.run_id) for r in regraded if r.instance != 1} == {(EpisodeStatus.SUCCEEDED, again.run_id)}
    outputs = EvalOutputs(outputs_dir, "crashy")
    completed = json.loads(outputs.checks_json.read_text())[0]  # the kept results would pass it: the run does not
    assert (completed["name"], completed["passed"]) == ("instances_completed", False)
    assert "instance(s) task0-i1 did not complete (sim_crashed: " in completed["description"]
    report = outputs.report_md.read_text()
    assert "**Warning:** this run failed, so these are the results it kept" in report
    assert report.index("**Warning:**") < report.index("**Success rate:**"), "the report opens with it"


def test_materialize_all_split_into_runs_as_dagsters_backfill_does_grades_checks_and_reports(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    """The UI's "Materialize all" backfills the contract, the partitioned rollouts and what follows them in
    runs of their own. The last runs no rollouts; it used to yield no ``instances``, and every step after it
    was skipped (no grades, checks or report, the run green). It now materializes ``instances`` from the
    results on disk, and the rest follows."""
    path = write_pipeline("split", group=2, checks=[{"kind": "min_success_rate", "value": 0.5}])
    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    job = defs.resolve_job_def("split")
    key = lambda step: dg.AssetKey(["split", step])  # noqa: E731
    assert job.execute_in_process(instance=instance, asset_selection=[key("contract")]).success
    rolled = job.execute_in_process(
        instance=instance,
        asset_selection=[key("rollouts")],
        tags={"dagster/asset_partition_range_start": "task0-i0", "dagster/asset_partition_range_end": "task0-i1"},
    )
    assert rolled.success
    rest = job.execute_in_process(
        instance=instance, asset_selection=[key(s) for s in ("instances", "grades", "report")]
    )
    assert rest.success
    done = {
        k for k in (key(s) for s in ("instances", "grades", "report")) if instance.get_latest_materialization_event(k)
    }
    assert done == {key(s) for s in ("instances", "grades", "report")}
    [instances] = rest.asset_materializations_for_node("split__eval")
    assert instances.metadata["ran"] == dg.IntMetadataValue(0)
    assert len(_grades(outputs_dir, "split")) == 4
    checks = [e for e in rest.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert checks, "the checks judged the grades"
    assert EvalOutputs(outputs_dir, "split").report_md.is_file()


def test_a_re_execution_of_a_failed_run_keeps_what_it_finished_and_runs_the_rest(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    """The UI's "Re-execute from failure" of a cancelled or failed run ran every instance again, the finished
    ones too; it now resumes, and "re-execute all" (the same lineage tags, no resume flag) still runs all."""
    marker = tmp_path / "crash-armed"
    marker.touch()
    path = write_pipeline("resumed", sim={"args": {"crash_seeds": [2], "crash_file": str(marker)}}, group=3)
    first = _run(path, outputs_dir, instance)
    assert not first.success
    marker.unlink()
    lineage = {"dagster/parent_run_id": first.run_id, "dagster/root_run_id": first.run_id}
    again = _run(path, outputs_dir, instance, tags={**lineage, "dagster/is_resume_retry": "true"})
    assert again.success
    outputs = EvalOutputs(outputs_dir, "resumed")
    ran_by = [InstanceResult.read(outputs.result(f"task0-i{i}")).run_id for i in range(3)]
    assert ran_by == [first.run_id, again.run_id, first.run_id]
    assert [r.status for r in _grades(outputs_dir, "resumed")] == [EpisodeStatus.SUCCEEDED] * 6
    said = [e.message for e in instance.all_logs(again.run_id) if "which this run re-executes" in e.message]
    assert said, "the run says which instances it kept"
    everything = {"dagster/parent_run_id": again.run_id, "dagster/root_run_id": first.run_id}  # "re-execute all"
    fresh = _run(path, outputs_dir, instance, tags=everything)
    assert {InstanceResult.read(outputs.result(f"task0-i{i}")).run_id for i in range(3)} == {fresh.run_id}


def test_a_yaml_edit_changes_the_code_version_of_exactly_the_assets_it_decides(
    write_pipeline: WritePipeline, outputs_dir: Path
) -> None:
    """Dagster shows an asset stale when its code version changes: an edit of max_steps changes the
    rollouts and everything after them, an edit of a check only what judges them."""

    def versions(**fields: object) -> dict[str, str | None]:
        path = write_pipeline("versioned", **fields)
        defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
        keys = {step: dg.AssetKey(["versioned", step]) for step in ("contract", "rollouts", "grades", "report")}
        return {step: defs.resolve_assets_def(key).code_versions_by_key[key] for step, key in keys.items()}

    first = versions(max_steps=30, checks=[{"kind": "min_success_rate", "value": 0.5}])
    assert all(first.values())
    assert versions(max_steps=30, checks=[{"kind": "min_success_rate", "value": 0.5}]) == first
    shorter = versions(max_steps=20, checks=[{"kind": "min_success_rate", "value": 0.5}])
    assert all(shorter[step] != first[step] for step in first)
    stricter = versions(max_steps=30, checks=[{"kind": "min_success_rate", "value": 0.9}])
    assert [step for step in first if stricter[step] != first[step]] == ["grades", "report"]


def test_a_rollout_past_its_deadline_ends_errored_and_its_sim_is_killed(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, label: str
) -> None:
    path = write_pipeline("stall", sim={"args": {"stall_seeds": [0]}, "num_envs": 1}, group=2, rollout_timeout_s=3)
    result = _run(path, outputs_dir, instance)
    assert not result.success
    stalled = InstanceResult.read(EvalOutputs(outputs_dir, "stall").result("task0-i0"))
    assert "rollout_timeout_s=3 exceeded" in (stalled.error or "")
    assert [r.status for r in stalled.rows] == [EpisodeStatus.ERRORED]
    assert stalled.wall_s < 30
    healthy = InstanceResult.read(EvalOutputs(outputs_dir, "stall").result("task0-i1"))
    assert not healthy.failed
    assert not sim_processes(label)


def test_a_run_whose_episodes_errored_with_no_check_on_errors_passes_and_warns_in_its_log(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    """No built-in check fails on an env raising in one slot: the run is green, so its log must say so."""
    faulty = {"factory": f"{SIMS}:faulty", "args": {"fault": "raise_step", "fault_seed": 1}}
    path = write_pipeline("oneraises", sim=faulty, group=1, agent={"policy": {"kind": "random"}})
    result = _run(path, outputs_dir, instance)
    assert result.success
    assert [r.status for r in _grades(outputs_dir, "oneraises")] == [EpisodeStatus.FAILED, EpisodeStatus.ERRORED]
    warned = [e.message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    [said] = [m for m in warned if "episode(s) errored" in m]
    assert "1 of 2 episode(s) errored (env 1; the first: " in said
    assert "add {kind: max_error_rate, value: 0.0} to its checks" in said
    assert said in EvalOutputs(outputs_dir, "oneraises").report_md.read_text(), "the report says the same"

    gated = write_pipeline(
        "gated",
        sim=faulty,
        group=1,
        agent={"policy": {"kind": "random"}},
        checks=[{"kind": "max_error_rate", "value": 0.5}],
    )
    result = _run(gated, outputs_dir, instance)
    assert result.success
    assert not [e for e in instance.all_logs(result.run_id) if "episode(s) errored" in e.message], "a check reads them"


@pytest.mark.parametrize(("threshold", "passes"), [(0.5, True), (1.01, False)])
def test_blocking_checks_gate_the_run(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, threshold: float, passes: bool
) -> None:
    path = write_pipeline(
        "gated",
        group=1,
        graders=[{"kind": "return", "threshold": 1000}] if not passes else [{"kind": "return", "threshold": 25}],
        checks=[{"kind": "min_success_rate", "value": min(threshold, 1.0)}, {"kind": "max_error_rate", "value": 0.0}],
    )
    result = _run(path, outputs_dir, instance)
    assert result.success is passes
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == {
        "instances_completed": True,
        "episodes_answered": True,
        "min_success_rate": passes,
        "max_error_rate": True,
    }
    report = EvalOutputs(outputs_dir, "gated").report_md.read_text()
    assert "Scheduled 2 = succeeded" in report  # the report is written whether or not the checks pass
    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    described = {s.name: s.description or "" for c in defs.asset_checks or [] for s in c.check_specs}
    said = described["min_success_rate"]
    assert said.startswith("Passes when succeeded / (succeeded + failed) is at least `value`.\n\nErrored slots")
    assert said.endswith(f"Here: value = {min(threshold, 1.0)}, blocking = True."), "the UI shows the threshold"


def test_the_dataset_asset_publishes_every_instance_and_a_rerun_replaces_only_its_shard(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    target = tmp_path / "published"
    path = write_pipeline("recorded", group=2, dataset={"root": str(target), "repo_id": "local/recorded"})
    assert _run(path, outputs_dir, instance).success
    dataset = LeRobotDataset("local/recorded", root=target)
    assert dataset.num_episodes == 4  # 2 instances x 2 slots
    assert dataset.num_frames == 4 * 30  # every episode ran to max_steps
    rerun = _run(
        path,
        outputs_dir,
        instance,
        tags={"dagster/asset_partition_range_start": "task0-i1", "dagster/asset_partition_range_end": "task0-i1"},
    )
    assert rerun.success
    assert LeRobotDataset("local/recorded", root=target).num_episodes == 4  # replaced, not appended
    shards = sorted(p.name for p in (outputs_dir / "recorded" / "shards").iterdir())
    assert shards == ["task0-i0", "task0-i1"]  # no run-private or retired shard left behind


def test_a_failing_blocking_check_stops_the_dataset_but_not_the_report(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    target = tmp_path / "never"
    path = write_pipeline(
        "unpublished",
        group=1,
        graders=[{"kind": "return", "threshold": 10_000}],
        checks=[{"kind": "min_success_rate", "value": 0.5}],
        dataset={"root": str(target)},
    )
    result = _run(path, outputs_dir, instance)
    assert not result.success
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert "unpublished__report" in started
    assert "unpublished__dataset" not in started  # stopped by the blocking check upstream
    assert not target.exists()
    assert EvalOutputs(outputs_dir, "unpublished").report_md.exists()


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", sorted(p.stem for p in (REPO / "pipelines").glob("*.yaml")))
def test_every_bundled_pipeline_runs_end_to_end(
    pipeline: str, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.spec.loader import load_pipeline

    path = REPO / "pipelines" / f"{pipeline}.yaml"
    spec = load_pipeline(path)
    if spec.is_sweep:
        pytest.skip(f"{pipeline} evaluates a training run: tests/eval/test_train_demo.py runs it on one it trains")
    defs = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=tmp_path)  # datasets land in tmp
    result = defs.resolve_job_def(spec.name).execute_in_process(instance=instance, raise_on_error=False)
    rows = _grades(outputs_dir, spec.name)
    assert len(rows) == spec.scheduled_slots
    assert not [r for r in rows if r.status is EpisodeStatus.ERRORED]
    assert result.success, [e.message for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    if spec.dataset_enabled:
        assert spec.dataset_root(tmp_path).joinpath("meta", "info.json").is_file()


def test_the_python_api_and_the_dagster_job_grade_the_same_seeds_identically(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    path = write_pipeline("twice", group=2, max_steps=60, tasks=[{"seed": 11}])
    assert _run(path, outputs_dir, instance).success
    through_dagster = _grades(outputs_dir, "twice")
    evaluation = evaluate(load_pipeline(path), outputs_dir=tmp_path / "plain", project_dir=REPO)
    assert not evaluation.failed_instances
    assert evaluation.summary.scheduled == 4

    def fields(rows: list[GradeRow]) -> list[tuple[object, ...]]:
        return [(r.task, r.instance, r.slot, r.seed, r.status, r.score, r.total_reward, r.steps) for r in rows]

    assert fields(evaluation.rows) == fields(through_dagster)
    assert (tmp_path / "plain" / "twice" / "report.md").is_file()


def test_a_slot_episode_depends_on_its_seed_not_on_num_envs(tmp_path: Path) -> None:
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text

    def returns(num_envs: int, group: int) -> dict[int | None, float]:
        text = json.dumps(
            {
                "name": f"seeded{num_envs}",
                "sim": {"factory": "CartPole-v1", "num_envs": num_envs},
                "agent": {"policy": {"kind": "constant", "value": [1]}},
                "tasks": [{"seed": 5}],
                "group": group,
                "max_steps": 100,
            }
        )
        spec = load_pipeline_text(text, source=tmp_path / f"seeded{num_envs}.yaml")
        evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=tmp_path)
        return {row.seed: row.total_reward for row in evaluation.rows}

    batched = returns(num_envs=3, group=1)
    assert set(batched) == {5, 6, 7}
    assert batched == returns(num_envs=1, group=3)
    assert len(set(batched.values())) > 1  # the seeds really differ


def test_a_pipeline_attaches_to_a_sim_served_elsewhere(
    tmp_path: Path, outputs_dir: Path, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.sim.process import SimProcess

    with SimProcess.spawn("CartPole-v1", num_envs=2, build_args={"vectorization_mode": "sync"}) as served:
        monkeypatch.setenv("HUD_TEST_SIM_TOKEN", served.token)
        path = tmp_path / "attached.yaml"
        path.write_text(
            json.dumps(
                {
                    "name": "attached",
                    "sim": {"url": served.url, "token": "${HUD_TEST_SIM_TOKEN}", "num_envs": 2},
                    "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
                    "group": 2,
                    "max_concurrent": 2,  # one served sim takes one connection: the instances queue for it
                    "max_steps": 40,
                    "graders": [{"kind": "return", "threshold": 40}],
                }
            )
        )
        assert _run(path, outputs_dir, instance).success
        assert served.alive()  # attaching never stops a sim somebody else serves
    rows = _grades(outputs_dir, "attached")
    assert [(r.instance, r.slot, r.status) for r in rows] == [
        (i, s, EpisodeStatus.SUCCEEDED) for i in range(2) for s in range(2)
    ]


def test_results_of_another_configuration_are_never_mixed_into_the_grades(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    from hud_pipelines.eval.rows import collect_rows
    from hud_pipelines.spec.loader import load_pipeline
    from hud_pipelines.spec.problems import display_path

    path = write_pipeline("edited", group=2)
    assert _run(path, outputs_dir, instance).success
    write_pipeline("edited", group=2, checks=[{"kind": "max_error_rate", "value": 0.0}])  # a check: results stay
    assert {r.status for r in collect_rows(load_pipeline(path), EvalOutputs(outputs_dir, "edited"))} == {
        EpisodeStatus.SUCCEEDED
    }
    write_pipeline("edited", group=2, tasks=[{"seed": 40}])  # new seeds: the old results are stale
    rows = collect_rows(load_pipeline(path), EvalOutputs(outputs_dir, "edited"))
    assert {r.status for r in rows} == {EpisodeStatus.ERRORED}
    assert {r.fault for r in rows} == {Fault.NOT_RUN}
    assert all("before the pipeline's seeds changed" in (r.error or "") for r in rows), "what changed, by name"
    rerun = f"hud-pipelines run {display_path(path)} --outputs {display_path(outputs_dir)} --partition task0-i1"
    assert rerun in (rows[-1].error or "")
    assert {r.run_id for r in rows} != {""}  # the rows name the run whose results went stale
    assert [r.seed for r in rows] == [40, 41, 42, 43]


def test_a_dagster_run_refuses_a_misspelled_name_at_the_yamls_line_before_any_sim_starts(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, label: str
) -> None:
    """Before, only ``hud-pipelines run`` read the names a YAML gives before it started: a run from the UI or
    ``dagster job execute`` started a sim per instance and errored every slot of a misspelled policy argument."""
    from hud_pipelines.recording.events import EpisodeStatus

    path = write_pipeline(
        "misspelled", agent={"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePDD"}}
    )
    result = _run(path, outputs_dir, instance)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    said = str(failure.step_failure_data.error)
    assert "misspelled.yaml:" in said, said
    assert "agent.policy.target: envs.controllers has no attribute 'CartPolePDD' (did you mean 'CartPolePD'?)" in said
    assert not sim_processes(label), "no sim was started"
    rows = _grades(outputs_dir, "misspelled")  # the grades say so, not an earlier run's verdict
    assert {row.status for row in rows} == {EpisodeStatus.ERRORED}
    checks = json.loads(EvalOutputs(outputs_dir, "misspelled").checks_json.read_text())
    assert "agent.policy.target" in checks[0]["description"], checks[0]
