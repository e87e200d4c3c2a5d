"""An eval's instances as units on Celery workers, through Dagster: the same YAML, the same results, lost workers.

The tests that need a broker start a real ``redis-server`` (127.0.0.1, a free port, a temporary folder)
and real workers (``celery -A hud_pipelines.dagster.worker worker --pool solo``) as subprocesses, and
check that everything they started is gone at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV, DeploymentError, load_deployment
from hud_pipelines.dagster.execution import load_execution
from hud_pipelines.dagster.launch import execute_pipeline_job
from hud_pipelines.dagster.overlap import PID_TAG
from hud_pipelines.dagster.step_recovery import retried_steps
from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.runner import InstanceResult
from hud_pipelines.recording.events import EpisodeStatus
from tests.agent.checkpoint_runs import (
    LeRobotRun,
    age,
    copy_run,
    lerobot_run_fixture,  # noqa: F401 - the session's lerobot-train run
)
from tests.dagster.celery_support import Worker, alive, celery_workers, needs_redis, processes_mentioning, redis_server
from tests.dagster.support import REPO, SIMS, WritePipeline, sim_processes
from tests.eval.test_eval_outputs import UNSEEDED_ENV
from tests.sim.fleet_support import TOKEN, serve_sim, stop_served

HELD_SIM = Path(__file__).with_name("celery_sims.py").resolve()
ROLLOUTS = "rollouts"


def _deployment(tmp_path: Path, broker: str, **execution: Any) -> Path:
    path = tmp_path / "deployment.yaml"
    settings = {"executor": "celery", "broker": broker, **execution}
    path.write_text(json.dumps({"execution": settings}))
    return path


def _instance(home: Path) -> dg.DagsterInstance:
    """A persistent instance in ``home``: the workers write the events of their steps into it."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return dg.DagsterInstance.from_config(str(home))


def _execute(path: Path, outputs: Path, instance: dg.DagsterInstance) -> dg.DagsterRun:
    """Run the pipeline's job where ``$HUD_PIPELINES_DEPLOYMENT`` says; the run it made."""
    from hud_pipelines.dagster.definitions import definitions_for_file

    name = json.loads(path.read_text())["name"]
    job = definitions_for_file(path, outputs_dir=outputs, project_dir=REPO).resolve_job_def(name)
    result = execute_pipeline_job(
        job,
        path,
        instance=instance,
        outputs_dir=outputs,
        project_dir=REPO,
        tags={},
        run_config={},
        run_id=str(uuid.uuid4()),
    )
    return result.dagster_run


def _grades(outputs: Path, name: str) -> list[GradeRow]:
    return [GradeRow.from_dict(r) for r in json.loads(EvalOutputs(outputs, name).grades_json.read_text())]


def _comparable(rows: list[GradeRow]) -> list[dict[str, Any]]:
    """Grade rows without what names the run that produced them."""
    return [{k: v for k, v in row.as_dict().items() if k not in ("run_id", "trace_id")} for row in rows]


def _frames(dataset: Path) -> pa.Table:
    files = sorted((dataset / "data").rglob("*.parquet"))
    assert files, f"no data files under {dataset}"
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("index")


def _observations(instance: dg.DagsterInstance, run_id: str) -> list[dg.EventLogEntry]:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    return [record.event_log_entry for record in records]


def _step_successes(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS).records
    return [str(r.event_log_entry.step_key) for r in records]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with _instance(tmp_path / "dagster_home") as instance:
        yield instance


# -- without a broker ------------------------------------------------------------------------------


def test_a_step_of_a_run_that_has_ended_is_not_run_again(tmp_path: Path) -> None:
    """A worker gets a step late (the broker hands a dead worker's step on after its visibility timeout; a step
    revoked while queued can still arrive): its run has ended, and the step must not overwrite what came after."""
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    from hud_pipelines.dagster.step_recovery import run_ended

    with _instance(tmp_path / "dagster_home") as instance:
        for run_id, status in (
            ("running", DagsterRunStatus.STARTED),
            ("failed", DagsterRunStatus.FAILURE),
            ("terminated", DagsterRunStatus.CANCELING),
        ):
            instance.add_run(DagsterRun(job_name="job", run_id=run_id, status=status))
        ref = instance.get_ref()
    assert run_ended(ref, "running") is None
    assert run_ended(ref, "failed") == "FAILURE"
    assert run_ended(ref, "terminated") == "CANCELING", "a queued step of a run being cancelled does not start"
    assert run_ended(ref, "unknown") is None, "a run the instance does not know is left to dagster-celery's own check"


def test_a_worker_runs_its_own_step_task_whose_checks_come_before_dagsters(tmp_path: Path) -> None:
    """Celery keeps the first callable registered under a name: dagster-celery's task, registered on the workers'
    app first, took the name, and the worker's checks (a run that ended, the files a run began with) never ran."""
    import subprocess
    import sys

    deployment = _deployment(tmp_path, "redis://127.0.0.1:1/0")
    probe = (
        "from dagster_celery.config import TASK_EXECUTE_PLAN_NAME\n"
        "from hud_pipelines.dagster import worker\n"
        "task = worker.app.tasks[TASK_EXECUTE_PLAN_NAME]\n"
        "print(task._decorated_fun.__module__, task._decorated_fun.__name__)\n"
    )
    env = {**os.environ, DEPLOYMENT_ENV: str(deployment), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", probe], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]  # no DuplicateTaskNameWarning either
    assert done.stdout.split() == ["hud_pipelines.dagster.worker", "execute_plan"]


def test_execution_settings_come_from_the_deployment_file_and_bad_ones_name_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not load_execution(None).default.distributed, "no deployment file: everything runs in process"
    path = tmp_path / "deployment.yaml"
    monkeypatch.setenv("QUEUE_BROKER", "redis://queuehost:6379/0")
    path.write_text(
        "execution: {executor: celery, broker: {env: QUEUE_BROKER}, retries: 1}\n"
        "pipelines:\n  gpu_eval: {execution: {queue: gpu}, agent: {torch_threads: 2}}\n"
    )
    execution = load_execution(path)
    assert execution.default.broker == "redis://queuehost:6379/0"
    assert execution.for_pipeline("gpu_eval").queue == "gpu"
    assert execution.for_pipeline("gpu_eval").retries == 1, "the rest comes from the top-level section"
    assert execution.for_pipeline("other").queue == "cpu"
    assert load_deployment(path) == {"gpu_eval": {"agent": {"torch_threads": 2}}}, "execution is not a resource"

    refused = {
        "execution: {executor: dask}\n": r"execution\.executor: .*unknown executor 'dask'",
        "execution: {executor: celry}\n": r"yaml:1:13: execution\.executor: unknown executor 'celry' \(did you mean",
        "execution: {executor: celery}\n": r"execution\.broker: the celery executor needs a Redis broker",
        "execution: {executor: celery, broker: 'redis://h/0', retries: -1}\n": r"execution\.retries: expected a num",
        "execution: {queues: gpu}\n": r"yaml:1:13: execution\.queues: unknown key 'queues' \(did you mean 'queue'\?\)",
        "pipelines:\n  a: {execution: {broker: 'redis://h/0'}}\n": r"pipelines\.a\.execution\.broker: set under",
        "execution: {broker: {env: NOT_SET_ANYWHERE}}\n": r"execution\.broker: environment variable NOT_SET_ANYWHERE",
        "execution:\n  executor: celery\n   retries: 1\n": r"yaml:3:\d+: invalid YAML: mapping values are not allowed",
        # each of these used to pass validate and fail every run, at its first connection or with a traceback
        "execution: {executor: celery, broker: 'redis://h:99999/0'}\n": r"yaml:1:31: execution\.broker: .* Port out of",
        "execution: {executor: celery, broker: 'redis://h/0', backend: not a url}\n": r"execution\.backend: 'not a u",
        "execution: {executor: celery, broker: 'redis://h/0', queue: ''}\n": r"execution\.queue: expected a non-empty",
        "execution: {executor: celery, broker: 'redis://h/0', image: 'x:1'}\n": r"image: k8s setting\(s\), and the ex",
        "exectuion: {executor: celery}\n": r"yaml:1:1: exectuion: unknown key \(did you mean 'execution'\?\)",
        "execution: {executor: celery, broker: 'redis://${REDIS}:6379/0'}\n": r"execution\.broker: .* is not expanded",
        "execution: {executor: celery, broker: 'redis://h/0', queue: '${QUEUE}'}\n": r"1:54: execution\.queue: '\$",
        "pipelines:\n  a: {execution: {control_queue: '${Q}'}}\n": r"pipelines\.a\.execution\.control_queue: '\$\{",
        (
            "execution: {broker: 'redis://h/0'}\n"
            "pipelines:\n  '*': {execution: {executor: celery}}\n  a: {execution: {image: 'x:1'}}\n"
        ): (r"4:19: pipelines\.a\.execution\.image: image: k8s setting\(s\), and the executor here is celery"),
    }
    path.write_text(  # a section for every pipeline, under which another pipeline's fields go, as it runs
        "pipelines:\n  '*': {execution: {executor: k8s}}\n  a: {execution: {image: 'x:1'}}\n"
    )
    assert (load_execution(path).for_pipeline("a").executor, load_execution(path).for_pipeline("a").image) == (
        "k8s",
        "x:1",
    )
    path.write_text(  # a k8s deployment with one pipeline in process: the k8s settings it inherits are no mistake
        "execution: {executor: k8s, image: 'x:1', namespace: evals}\n"
        "pipelines:\n  light: {execution: {executor: in_process}}\n"
    )
    assert not load_execution(path).for_pipeline("light").distributed
    for backend in ("redis+socket:///tmp/r.sock", "rpc://", "sentinel://h1:26379;sentinel://h2:26379"):
        path.write_text(f"execution: {{executor: celery, broker: 'redis://h/0', backend: '{backend}'}}\n")
        assert load_execution(path).default.backend == backend, "a result backend Celery takes"
    path.write_text(  # every section's problem at once, each at its line
        "execution: {executor: celery, broker: 'redis://h/0', retires: 1}\n"
        "pipelines:\n  a: {execution: {queu: gpu}}\n  b: {execution: {broker: 'redis://h/0'}}\n"
    )
    with pytest.raises(DeploymentError) as every:
        load_execution(path)
    for said in (
        ":1:54: execution.retires: unknown key",
        "pipelines.a.execution.queu: unknown key",
        ":4:19: pipelines.b",
    ):
        assert said in str(every.value), str(every.value)
    for text, message in refused.items():
        path.write_text(text)
        with pytest.raises(DeploymentError, match=message) as caught:
            load_execution(path)
        assert str(path) in str(caught.value)


def test_a_celery_deployment_gives_the_same_assets_with_one_unit_per_instance_on_its_queue(
    write_pipeline: WritePipeline, outputs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dagster.definitions import build_definitions, definitions_for_file

    path = write_pipeline("spread", group=3)
    local = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(
        "execution: {executor: celery, broker: 'redis://127.0.0.1:1/0'}\n"
        "pipelines:\n  spread: {execution: {queue: gpu}}\n"
    )
    monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
    spread = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO)  # loads with no broker running

    def keys(defs: dg.Definitions) -> set[str]:
        return {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}

    assert keys(spread) == keys(local), "the same YAML gives the same assets wherever it runs"
    job = spread.resolve_job_def("spread")
    assert job.executor_def.name == "hud_celery"
    assert local.resolve_job_def("spread").executor_def.name == "in_process"
    ops = {node.name: node.definition for node in job.graph.node_dict["spread__eval"].definition.nodes}  # type: ignore[attr-defined]
    assert ops["unit"].tags["dagster-celery/queue"] == "gpu"
    assert ops["plan"].tags["dagster-celery/queue"] == "cpu"
    assert ops["finish"].tags["dagster-celery/queue"] == "cpu"

    other = write_pipeline("other", group=1)  # every pipeline's graph in one job: Dagster's "Materialize all"
    both = build_definitions(other.parent, outputs_dir=outputs_dir)
    dg.Definitions.validate_loadable(both)
    every_asset = both.resolve_implicit_global_asset_job_def()
    assert {"spread__eval.unit", "other__eval.unit"} <= {
        f"{graph.name}.{node.name}"
        for graph in every_asset.graph.nodes
        for node in getattr(graph.definition, "nodes", [])
    }

    with dg.DagsterInstance.ephemeral() as instance:
        with pytest.raises(DeploymentError) as refused:
            execute_pipeline_job(
                job,
                path,
                instance=instance,
                outputs_dir=outputs_dir,
                project_dir=REPO,
                tags={},
                run_config={},
                run_id="x",
            )
        assert not instance.get_runs(), "no run was started"
    assert "execution.broker: redis://127.0.0.1:1/0 does not answer" in str(refused.value)
    assert str(deployment) in str(refused.value)


def test_materialize_all_under_a_celery_deployment_runs_as_dagsters_backfill_splits_it(
    write_pipeline: WritePipeline, outputs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backfill of "Materialize all" runs the contract, the partitioned rollouts and the rest apart: the
    units' graph must take each subset (it was refused as a non-subsettable multi-asset)."""
    from hud_pipelines.dagster.definitions import definitions_for_file

    path = write_pipeline("split", group=2)
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("execution: {executor: celery, broker: 'redis://127.0.0.1:1/0'}\n")
    monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
    job = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO).resolve_job_def("split")
    assert job.executor_def.name == "hud_celery"
    key = lambda step: dg.AssetKey(["split", step])  # noqa: E731
    with dg.DagsterInstance.ephemeral() as instance:  # the steps in this process: the graph is the units'
        contract = job.execute_in_process(instance=instance, asset_selection=[key("contract")])
        assert instance.get_latest_materialization_event(key("contract")) is not None
        assert contract.success
        rolled = job.execute_in_process(
            instance=instance,
            asset_selection=[key("rollouts")],
            tags={"dagster/asset_partition_range_start": "task0-i0", "dagster/asset_partition_range_end": "task0-i1"},
        )
        assert rolled.success
        units = [e.step_key for e in rolled.all_events if e.event_type_value == "STEP_SUCCESS"]
        assert sum((k or "").startswith("split__eval.unit[") for k in units) == 2
        rest = job.execute_in_process(
            instance=instance, asset_selection=[key(s) for s in ("instances", "grades", "report")]
        )
        assert rest.success
        for step in ("instances", "grades", "report"):
            assert instance.get_latest_materialization_event(key(step)) is not None, step
    assert len(json.loads(EvalOutputs(outputs_dir, "split").grades_json.read_text())) == 4


def test_a_unit_leaves_the_shards_other_units_of_its_run_are_writing(
    write_pipeline: WritePipeline, outputs_dir: Path
) -> None:
    from hud_pipelines.dataset.shards import ShardStore
    from hud_pipelines.eval.rollouts import rollouts_step
    from hud_pipelines.eval.runner import sim_settings
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(write_pipeline("shared_run", group=2, dataset={"repo_id": "local/shared_run"}))
    outputs = EvalOutputs(outputs_dir, spec.name)
    run_id = "one-run"
    writing = ShardStore(outputs, spec, run_id=run_id)._pending("task0-i1")  # another worker's unit, mid-write
    writing.mkdir(parents=True)
    (writing / "part").write_text("being written")
    with SimPool(sim_settings(spec, cwd=REPO)) as pool:
        [result] = rollouts_step(spec, pool, outputs, run_id=run_id, partitions=[spec.partition_for_key("task0-i0")])
    assert not result.failed
    assert outputs.shard("task0-i0").is_dir()
    assert (writing / "part").read_text() == "being written"


# -- with Redis and workers --------------------------------------------------------------------------


@needs_redis
def test_celery_eval_runs_units_on_both_workers_and_matches_the_in_process_run(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    path = write_pipeline("spread", group=4, max_concurrent=2, dataset={"repo_id": "local/spread"})
    local_out, spread_out = tmp_path / "local", tmp_path / "spread"
    with dg.DagsterInstance.ephemeral() as ephemeral:
        assert _execute(path, local_out, ephemeral).status is dg.DagsterRunStatus.SUCCESS

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    with redis_server(tmp_path / "redis") as (broker, redis_process):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1", "w2"], tmp_path / "logs") as workers:
            code = run_pipeline(str(path), outputs_dir=spread_out, quiet=True)  # the CLI, as `hud-pipelines run`
            assert code == 0
    assert not alive(redis_process.pid)
    assert not any(alive(w.pid) for w in workers), "every worker stopped"
    assert not processes_mentioning(broker), "no lease keeper left"
    assert not sim_processes(label), "no sim left on any worker"

    [run] = home.get_runs()
    observed = _observations(home, run.run_id)
    assert sorted(str(e.dagster_event.partition) for e in observed if e.dagster_event) == [  # type: ignore[union-attr]
        f"task0-i{k}" for k in range(4)
    ]
    pids = {e.asset_observation.metadata["worker_pid"].value for e in observed if e.asset_observation}  # type: ignore[union-attr]
    assert pids == {w.pid for w in workers}, "units ran on both workers"
    # its life is that of the process orchestrating it (here, this one), not the worker's that ran its plan step:
    # once its orchestrator died, a run tagged with a live worker stayed "still running" to every later run
    assert run.tags.get(PID_TAG) == str(os.getpid())
    assert _comparable(_grades(spread_out, "spread")) == _comparable(_grades(local_out, "spread"))
    mine, theirs = _frames(spread_out / "datasets" / "spread"), _frames(local_out / "datasets" / "spread")
    assert mine.column_names == theirs.column_names
    for column in mine.column_names:
        assert mine.column(column).equals(theirs.column(column)), f"dataset column {column} differs"
    successes = _step_successes(home, run.run_id)
    assert successes.count("spread__dataset") == 1, "the dataset was merged once"
    assert sum(key.startswith("spread__eval.unit[") for key in successes) == 4
    assert home.get_materialized_partitions(dg.AssetKey(["spread", ROLLOUTS])) == {f"task0-i{k}" for k in range(4)}


@needs_redis
def test_celery_units_share_a_fleet_of_served_sims_waiting_for_a_busy_one_never_losing_it(
    tmp_path: Path, home: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker's units know only their own holds: a server another worker drives refuses (409), and waits."""
    from hud_pipelines.cli.run import run_pipeline

    slow = ("--arg", "fault=slow_step", "--arg", "delay_s=0.15", "--arg", "at_step=1")  # 1.5 s instances
    servers = [serve_sim("envs.faulty:faulty", *slow) for _ in range(2)]
    monkeypatch.setenv("HUD_TEST_FLEET_TOKEN", TOKEN)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    path = tmp_path / "fleet.yaml"
    sim = {"urls": [url for _, url in servers], "token": "${HUD_TEST_FLEET_TOKEN}", "num_envs": 2}
    pipeline = {"sim": sim, "agent": {"policy": {"kind": "constant"}}}
    path.write_text(json.dumps({"name": "fleet", **pipeline, "group": 6, "max_steps": 30}))
    try:
        with redis_server(tmp_path / "redis") as (broker, _):
            monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
            with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1", "w2"], tmp_path / "logs"):
                code = run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True)
    finally:
        for process, _ in servers:
            stop_served(process)
    rows = _grades(tmp_path / "out", "fleet")
    assert [(r.instance, r.fault) for r in rows if r.fault is not None] == [], "no instance lost a busy server"
    assert len(rows) == 12
    assert code == 0


@needs_redis
def test_celery_units_whose_served_sim_is_down_keep_the_earlier_results_and_fail_the_run_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in process: an instance that never started measured nothing, so it must not wipe what it measured before."""
    from hud_pipelines.cli.main import main
    from hud_pipelines.eval.progress import listening
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    heard: list[InstanceResult] = []
    monkeypatch.setenv("HUD_TEST_FLEET_TOKEN", TOKEN)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    process, url = serve_sim(f"{SIMS}:cartpole")
    path = tmp_path / "down.yaml"
    sim = {"url": url, "token": "${HUD_TEST_FLEET_TOKEN}", "num_envs": 2}
    policy = {"kind": "scripted", "target": "envs.controllers:CartPolePD"}
    path.write_text(json.dumps({"name": "down", "sim": sim, "agent": {"policy": policy}, "group": 2, "max_steps": 20}))
    try:
        first = evaluate(load_pipeline(path), outputs_dir=tmp_path / "out")
    finally:
        stop_served(process)
    assert first.passed
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1"], tmp_path / "logs"), listening(heard.append):
            capsys.readouterr()
            code = main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "out")])
            bar = sorted((r.key, r.failed) for r in heard)
            outputs = EvalOutputs(tmp_path / "out", "down")
            by_the_cli = json.loads(outputs.checks_json.read_text())[0]  # its finish step failed on a worker
            assert (by_the_cli["name"], by_the_cli["passed"]) == ("instances_completed", False), by_the_cli
            assert "this run failed, so these are the results it kept" in outputs.report_md.read_text()
            for written in (outputs.checks_json, outputs.report_md):  # what a run without the CLI writes itself
                written.unlink()
            with _instance(tmp_path / "dagster_home") as instance:
                launched = _execute(path, tmp_path / "out", instance)
            assert launched.status is dg.DagsterRunStatus.FAILURE
    completed = json.loads(outputs.checks_json.read_text())[0]  # the kept results would pass it: the run does not
    assert (completed["name"], completed["passed"]) == ("instances_completed", False)
    assert "instance(s) task0-i0, task0-i1 did not start (sim_start: " in completed["description"]
    assert "this run failed, so these are the results it kept" in outputs.report_md.read_text()
    printed = capsys.readouterr().out
    assert code == 1, printed[-3000:]
    assert bar == [("task0-i0", True), ("task0-i1", True)], "the bar: FAILED"
    assert "instance(s) task0-i0, task0-i1 did not start (sim_start: " in printed, printed[-3000:]
    assert f"their results of run {first.run_id} are kept" in printed
    assert _grades(tmp_path / "out", "down") == first.rows, "every result as the first run left it"


@needs_redis
def test_a_celery_run_checks_the_sims_seeding_once_and_warns_as_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    (tmp_path / "unseeded_env.py").write_text(UNSEEDED_ENV)
    path = tmp_path / "unseeded.yaml"
    sim = {"factory": "unseeded_env.py:Unseeded", "num_envs": 2}
    policy = {"kind": "constant"}
    path.write_text(
        json.dumps({"name": "unseeded", "sim": sim, "agent": {"policy": policy}, "group": 2, "max_steps": 5})
    )
    outputs = EvalOutputs(tmp_path / "out", "unseeded")
    outputs.base.mkdir(parents=True)
    outputs.seed_check.write_text("{}")  # an earlier run's verdict: not this run's
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1", "w2"], tmp_path / "logs"):
            capsys.readouterr()
            main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert [row.fault for row in _grades(tmp_path / "out", "unseeded")] == [None] * 4, printed[-3000:]
    check = json.loads(outputs.seed_check.read_text())
    assert (check["seeds"], check["differing"]) == ([0, 1], {"0": ["state"], "1": ["state"]})
    assert "warning: the sim does not repeat an episode's start for the same seed" in printed, printed[-3000:]


BALANCING = "from envs.controllers import CartPolePD as Policy\n"
TOPPLING = """from envs.controllers import CartPolePD


class Policy(CartPolePD):
    def __init__(self) -> None:
        super().__init__(kx=-0.1, kv=-0.5, kt=-10.0, kw=-2.0)
"""


@needs_redis
def test_a_worker_runs_a_policy_file_edited_since_its_last_unit_as_edited(
    write_pipeline: WritePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker lives on between runs: the code a unit runs is the code its result's provenance names."""
    from hud_pipelines.cli.run import run_pipeline

    (tmp_path / "pipelines" / "my_policy.py").write_text(BALANCING)
    path = write_pipeline("edited", agent={"policy": {"kind": "scripted", "target": "my_policy.py:Policy"}})
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1"], tmp_path / "logs"):
            assert run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True) == 0
            balanced = _grades(tmp_path / "out", "edited")
            (tmp_path / "pipelines" / "my_policy.py").write_text(TOPPLING)
            run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True)
            toppled = _grades(tmp_path / "out", "edited")
    assert {row.steps for row in balanced} == {30}, "the PD controller balances to max_steps"
    assert {row.run_id for row in toppled} != {balanced[0].run_id}, "the edit made the results another environment's"
    assert max(row.steps for row in toppled) < 30, "the edited policy ran: it topples the pole"


@needs_redis
def test_a_worker_runs_a_run_launched_from_dagster_after_a_yaml_edit_with_the_edited_yaml(
    write_pipeline: WritePipeline, pipelines_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dagster job execute -m hud_pipelines.definitions`` (as the UI launches a run): the worker imported the
    code location at the first run's step and must reload it for the run after the edit."""
    import subprocess
    import sys

    path = write_pipeline("yaml_edit", group=1, max_steps=30)
    home, outputs = tmp_path / "dagster_home", tmp_path / "out"
    _instance(home).dispose()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("HUD_PIPELINES_DIR", str(pipelines_dir))
    monkeypatch.setenv("HUD_PIPELINES_OUTPUTS", str(outputs))
    dagster = str(Path(sys.executable).parent / "dagster")
    command = [dagster, "job", "execute", "-m", "hud_pipelines.definitions", "-j", "yaml_edit"]
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1"], tmp_path / "logs"):
            first = subprocess.run(command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
            assert first.returncode == 0, first.stderr[-3000:]
            assert {row.steps for row in _grades(outputs, "yaml_edit")} == {30}
            path.write_text(path.read_text().replace('"max_steps": 30', '"max_steps": 12'))
            edited = subprocess.run(
                command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=300
            )
            assert edited.returncode == 0, edited.stderr[-3000:]
    assert {row.steps for row in _grades(outputs, "yaml_edit")} == {12}, "the worker ran the edited YAML"


def _kill_the_held_worker(
    hold: Path, workers: list[Worker], killed: list[int], signum: signal.Signals = signal.SIGKILL
) -> None:
    """Wait for the held sim to say which worker runs it, SIGKILL (or ``signum``) that worker, release the hold."""
    held = hold.with_name(hold.name + ".held")
    deadline = time.monotonic() + 120
    while not held.is_file() or not held.read_text().strip():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    pid = int(held.read_text())
    assert pid in {w.pid for w in workers}, "the held instance runs in a worker process"
    os.kill(pid, signum)
    killed.append(pid)
    hold.unlink()


def _run_and_kill(
    write_pipeline: WritePipeline,
    tmp_path: Path,
    home: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    retries: int,
    signum: signal.Signals = signal.SIGKILL,
) -> tuple[Path, dg.DagsterRun, list[Worker], list[int]]:
    hold = tmp_path / "hold"
    hold.touch()
    # seeds are instance * 2 + slot: seed 4 is instance 2, slot 0
    path = write_pipeline(
        "lossy",
        sim={"factory": f"{HELD_SIM}:held_cartpole", "args": {"hold_file": str(hold), "hold_seeds": [4]}},
        group=4,
        dataset={"repo_id": "local/lossy"},
    )
    outputs = tmp_path / "outputs"
    with redis_server(tmp_path / "redis") as (broker, redis_process):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker, retries=retries)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1", "w2"], tmp_path / "logs") as workers:
            killed: list[int] = []
            killer = threading.Thread(target=_kill_the_held_worker, args=(hold, workers, killed, signum), daemon=True)
            killer.start()
            run = _execute(path, outputs, home)
            killer.join(timeout=5)
    assert killed, "the held instance was reached and its worker killed"
    assert not alive(redis_process.pid)
    assert not any(alive(w.pid) for w in workers)
    assert not processes_mentioning(broker), "no lease keeper left"
    return outputs, run, workers, killed


@needs_redis
def test_celery_worker_killed_mid_instance_fails_that_instance_only(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs, run, _, [killed] = _run_and_kill(write_pipeline, tmp_path, home, monkeypatch, retries=0)
    assert not sim_processes(label), "the killed worker's sim went with it"
    assert run.status is dg.DagsterRunStatus.FAILURE, "instances_completed fails the run"
    rollouts = dg.AssetKey(["lossy", ROLLOUTS])
    assert home.get_materialized_partitions(rollouts) == {"task0-i0", "task0-i1", "task0-i3"}
    lost = InstanceResult.read(EvalOutputs(outputs, "lossy").result("task0-i2"))
    assert lost.fault is Fault.WORKER_LOST
    assert f"pid {killed}" in (lost.error or ""), "the reason names the worker that was lost"
    rows = _grades(outputs, "lossy")
    assert len(rows) == 8
    assert {(r.instance, r.status, r.fault) for r in rows if r.instance == 2} == {
        (2, EpisodeStatus.ERRORED, Fault.WORKER_LOST)
    }
    assert {r.status for r in rows if r.instance != 2} == {EpisodeStatus.SUCCEEDED}, "the rest finished"
    checks = json.loads(EvalOutputs(outputs, "lossy").checks_json.read_text())
    assert checks[0]["name"] == "instances_completed"
    assert checks[0]["failed_instances"] == ["task0-i2"]
    assert EvalOutputs(outputs, "lossy").report_md.is_file(), "the report follows a failed unit"
    assert "lossy__dataset" not in _step_successes(home, run.run_id), "the blocking check holds the dataset back"
    events = [e.dagster_event for e in home.all_logs(run.run_id) if e.dagster_event is not None]
    assert any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in events), "the attempt that records the loss"
    assert retried_steps(events) == [], "nothing ran again: no retry to report"


@needs_redis
def test_celery_worker_killed_mid_instance_is_retried_once_and_counted_once(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs, run, _, [killed] = _run_and_kill(write_pipeline, tmp_path, home, monkeypatch, retries=1)
    assert not sim_processes(label)
    assert run.status is dg.DagsterRunStatus.SUCCESS
    rows = _grades(outputs, "lossy")
    assert len(rows) == 8
    assert {r.status for r in rows} == {EpisodeStatus.SUCCEEDED}
    assert {r.run_id for r in rows} == {run.run_id}
    observed = _observations(home, run.run_id)
    partitions = [str(e.dagster_event.partition) for e in observed if e.dagster_event]  # type: ignore[union-attr]
    assert sorted(partitions) == [f"task0-i{k}" for k in range(4)], "the lost attempt reported nothing"
    retried = [e for e in observed if e.dagster_event and e.dagster_event.partition == "task0-i2"]  # type: ignore[union-attr]
    metadata = retried[0].asset_observation.metadata  # type: ignore[union-attr]
    assert metadata["attempt"].value == 2
    assert metadata["worker_pid"].value != killed
    events = [e.dagster_event for e in home.all_logs(run.run_id) if e.dagster_event is not None]
    [note] = retried_steps(events)  # what `hud-pipelines run` prints under a run that succeeded
    assert note.startswith("note: retried: the worker running step lossy__eval.unit[u2_task0_i2] ("), note
    assert f"pid {killed}" in note, "it names the worker that was lost"
    dataset = outputs / "datasets" / "lossy"
    frames = _frames(dataset)
    assert sorted(set(frames.column("episode_index").to_pylist())) == list(range(8)), "eight episodes, none twice"
    assert len(frames) == 8 * 30


def test_an_instance_its_lost_worker_had_finished_keeps_the_result_it_wrote(
    write_pipeline: WritePipeline, tmp_path: Path
) -> None:
    """A worker killed after its unit wrote the result (and the dataset shard) but before the step reported:
    the next attempt recorded ``worker_lost`` over a complete result of the same run."""
    from hud_pipelines.dagster.unit_attempts import Unit, finished_before_the_loss
    from hud_pipelines.dataset.shards import ShardStore
    from hud_pipelines.eval.results import unreached_result
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(write_pipeline("finished", group=1, dataset={"repo_id": "local/finished"}))
    done = evaluate(spec, outputs_dir=tmp_path / "out")
    outputs = EvalOutputs(tmp_path / "out", "finished")
    unit = Unit(spec, outputs, spec.partition_for_key("task0-i0"), "task0-i0")
    shards = ShardStore(outputs, spec, run_id=done.run_id)
    finished = finished_before_the_loss(unit, done.run_id, shards)
    assert finished is not None
    assert (finished.run_id, finished.failed) == (done.run_id, False)
    assert finished_before_the_loss(unit, "a-later-run", ShardStore(outputs, spec, run_id="a-later-run")) is None
    for fault, stands in ((Fault.SIM_CRASHED, True), (Fault.INTERRUPTED, False)):  # measured, or cut short
        unreached_result(spec, unit.partition, "it ended", fault, run_id=done.run_id).write(unit.result_path)
        assert (finished_before_the_loss(unit, done.run_id, shards) is not None) is stands, fault
    shutil.rmtree(outputs.shard("task0-i0"))  # the worker went after the result, before the shard was committed
    assert finished_before_the_loss(unit, done.run_id, shards) is None, "its dataset episodes would be missing"


@needs_redis
def test_a_worker_lost_past_its_retries_keeps_the_earlier_complete_result_of_its_instance(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost worker measured nothing: as a sim that died under an instance, it must not wipe the result an
    earlier run of the same configuration completed (it wrote ``worker_lost`` over it)."""
    hold = tmp_path / "hold"
    sim = {"factory": f"{HELD_SIM}:held_cartpole", "args": {"hold_file": str(hold), "hold_seeds": [4]}}
    path = write_pipeline("lossy", sim=sim, group=4, dataset={"repo_id": "local/lossy"})
    outputs = tmp_path / "outputs"
    killed: list[int] = []
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker, retries=0)))
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), ["w1", "w2"], tmp_path / "logs") as workers:
            first = _execute(path, outputs, home)  # no hold file yet: every instance completes
            hold.touch()
            killer = threading.Thread(target=_kill_the_held_worker, args=(hold, workers, killed), daemon=True)
            killer.start()
            second = _execute(path, outputs, home)
            killer.join(timeout=5)
    assert killed, "the held instance was reached and its worker killed"
    assert not sim_processes(label)
    assert (first.status, second.status) == (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)
    kept = InstanceResult.read(EvalOutputs(outputs, "lossy").result("task0-i2"))
    assert (kept.run_id, kept.fault) == (first.run_id, None), "the earlier complete result stands"
    assert {r.status for r in _grades(outputs, "lossy")} == {EpisodeStatus.SUCCEEDED}
    completed = json.loads(EvalOutputs(outputs, "lossy").checks_json.read_text())[0]
    assert (completed["name"], completed["passed"]) == ("instances_completed", False), "the run failed, saying why"
    assert "instance(s) task0-i2 did not complete (worker_lost: " in completed["description"]
    assert f"their results of run {first.run_id} are kept" in completed["description"]


@needs_redis
def test_a_worker_stopped_with_sigterm_finishes_the_unit_it_runs_and_takes_no_other(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM is how a worker is stopped (systemd, docker stop, a deploy): Celery's warm shutdown. It used to
    interrupt the unit, fail the run as if it had been cancelled and crash the worker, with nothing retried."""
    outputs, run, _, [stopped] = _run_and_kill(write_pipeline, tmp_path, home, monkeypatch, 0, signal.SIGTERM)
    assert not sim_processes(label)
    assert run.status is dg.DagsterRunStatus.SUCCESS
    rows = _grades(outputs, "lossy")
    assert {(r.status, r.run_id) for r in rows} == {(EpisodeStatus.SUCCEEDED, run.run_id)}
    finished = _observations(home, run.run_id)
    held = [e for e in finished if e.dagster_event and e.dagster_event.partition == "task0-i2"]  # type: ignore[union-attr]
    assert held[0].asset_observation.metadata["worker_pid"].value == stopped, "it finished where it ran"  # type: ignore[union-attr]


@needs_redis
@pytest.mark.slow
def test_celery_sweep_runs_each_pair_as_a_unit_on_its_queue_with_the_in_process_results(
    lerobot_run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    run = copy_run(lerobot_run, tmp_path / "train")
    age(run.output_dir, 60)
    path = tmp_path / "reach_sweep.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "reach_sweep",
                "sim": {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 2},
                "agent": {
                    "policy": {
                        "kind": "lerobot",
                        "checkpoints": str(run.output_dir),
                        "device": "cpu",
                        "rename": {"goal": "observation.environment_state"},
                    }
                },
                "tasks": [{"name": "near", "seed": 10}],
                "group": 2,
                "max_steps": 6,
            }
        )
    )

    def sweep(where: str) -> list[dict[str, Any]]:
        home = tmp_path / where / "home"
        home.mkdir(parents=True)
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        assert run_pipeline(str(path), outputs_dir=tmp_path / where / "outputs", quiet=True) == 0
        rows = _grades(tmp_path / where / "outputs", "reach_sweep")
        assert {r.checkpoint for r in rows} == {"000500", "001000", "001500"}
        return _comparable(rows)

    local = sweep("local")
    with redis_server(tmp_path / "redis") as (broker, _):
        deployment = _deployment(tmp_path, broker)
        text = json.loads(deployment.read_text())
        deployment.write_text(json.dumps({**text, "pipelines": {"reach_sweep": {"execution": {"queue": "gpu"}}}}))
        monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
        names, queues = ["cpu_only", "with_gpu"], ["cpu", "cpu,gpu"]
        with celery_workers(deployment, names, tmp_path / "logs", queues=queues) as (cpu_only, with_gpu):
            assert sweep("spread") == local
            with _instance(tmp_path / "spread" / "home") as instance:
                [sweep_run] = instance.get_runs()
                successes = _step_successes(instance, sweep_run.run_id)
                observed = _observations(instance, sweep_run.run_id)
    units = [k for k in successes if k.startswith("reach_sweep__eval.unit[")]
    assert len(units) == 6, "one unit per (checkpoint, instance) pair"
    pids = {e.asset_observation.metadata["worker_pid"].value for e in observed if e.asset_observation}  # type: ignore[union-attr]
    assert pids == {with_gpu.pid}, "the sweep's units went to its gpu queue only"
    assert cpu_only.pid not in pids
    assert not processes_mentioning(broker)


@needs_redis
def test_a_run_queue_sends_only_that_runs_units_to_the_workers_of_that_queue(
    write_pipeline: WritePipeline, tmp_path: Path, home: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    path = write_pipeline("rerouted", group=2)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    with redis_server(tmp_path / "redis") as (broker, _):
        monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, broker)))  # the pipeline's queue: cpu
        names, queues = ["cpu_only", "with_gpu"], ["cpu", "cpu,gpu"]
        with celery_workers(Path(os.environ[DEPLOYMENT_ENV]), names, tmp_path / "logs", queues=queues) as workers:
            assert run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True, queue="gpu") == 0
    cpu_only, with_gpu = workers
    [run] = home.get_runs()
    assert run.tags["hud_pipelines/queue"] == "gpu"
    observed = _observations(home, run.run_id)
    pids = {e.asset_observation.metadata["worker_pid"].value for e in observed if e.asset_observation}  # type: ignore[union-attr]
    assert pids == {with_gpu.pid}, "both units went to the run's queue"
    assert cpu_only.pid not in pids
    said = [entry.message for entry in home.all_logs(run.run_id) if 'goes to queue "gpu"' in entry.message]
    assert len(said) == 2, "the log says where each unit goes (dagster-celery named the step's own queue before)"


@needs_redis
def test_ctrl_c_stops_a_celery_run_whose_units_no_worker_took(write_pipeline: WritePipeline, tmp_path: Path) -> None:
    """Its units wait in the queue: Ctrl-C ends the run at once (it waited for them, reading the broker
    thousands of times a second, until a worker came and ran them all)."""
    import subprocess
    import sys

    path = write_pipeline("unserved", group=2)
    with redis_server(tmp_path / "redis") as (broker, _):
        env = {
            **os.environ,
            DEPLOYMENT_ENV: str(_deployment(tmp_path, broker, lease_s=3)),
            "DAGSTER_HOME": str(tmp_path / "dagster_home"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(REPO),
        }
        _instance(tmp_path / "dagster_home").dispose()
        command = [str(Path(sys.executable).parent / "hud-pipelines"), "run", str(path), "--quiet"]
        run = subprocess.Popen(
            [*command, "--outputs", str(tmp_path / "out")],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            time.sleep(10)  # started, its units sent, and nobody to take them
            signalled = time.monotonic()
            run.send_signal(signal.SIGINT)
            printed, _ = run.communicate(timeout=60)
            assert run.returncode == 130, printed.decode()[-3000:]
            assert time.monotonic() - signalled < 20, "within seconds"
            assert "run interrupted by SIGINT after 0 of 2 instance(s)" in printed.decode()
            said = " ".join(printed.decode().split())  # the summary wraps its lines
            assert "the units already running on workers finish there and write their results" in said, said[-3000:]
            # no worker consumes the control queue: the run said so once lease_s passed (it waited in silence)
            assert 'step "unserved__eval.plan" has waited 3 s on queue "cpu" with no worker taking it' in said
            assert "start a worker that consumes that queue (celery -A hud_pipelines.dagster.worker worker" in said
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()


def test_units_on_workers_refuse_a_dataset_section_that_does_not_fit_the_contract_before_any_rollout(
    write_pipeline: WritePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dagster.definitions import definitions_for_file

    path = write_pipeline("placed", dataset={"repo_id": "local/placed", "state_features": ["state", "joints"]})
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("execution: {executor: celery, broker: 'redis://127.0.0.1:1/0'}\n")
    monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
    out = tmp_path / "out"
    job = definitions_for_file(path, outputs_dir=out, project_dir=REPO).resolve_job_def("placed")
    selected = [dg.AssetKey(["placed", step]) for step in ("contract", "rollouts", "instances")]
    tags = {"dagster/asset_partition_range_start": "task0-i0", "dagster/asset_partition_range_end": "task0-i1"}
    with dg.DagsterInstance.ephemeral() as instance:
        ran = job.execute_in_process(instance=instance, asset_selection=selected, tags=tags, raise_on_error=False)
    assert not ran.success
    failures = [e.step_failure_data.error for e in ran.all_events if e.event_type_value == "STEP_FAILURE"]
    assert any(error and "does not fit the sim's contract" in error.to_string() for error in failures), failures
    assert not list(out.rglob("rollouts/*.json")), "no unit rolled out for a dataset that cannot take its episodes"


def test_the_plan_of_a_run_on_workers_refuses_a_misspelled_name_at_the_yamls_line_before_any_unit(
    write_pipeline: WritePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a run in process does: before, every unit started a sim and errored every slot of its instance."""
    from hud_pipelines.dagster.definitions import definitions_for_file

    policy = {"kind": "scripted", "target": "envs.controllers:CartPolePDD"}
    path = write_pipeline("misspelled", agent={"policy": policy}, dataset={"enabled": False})
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("execution: {executor: celery, broker: 'redis://127.0.0.1:1/0'}\n")
    monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
    out = tmp_path / "out"
    job = definitions_for_file(path, outputs_dir=out, project_dir=REPO).resolve_job_def("misspelled")
    with dg.DagsterInstance.ephemeral() as instance:
        ran = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not ran.success
    failures = [e for e in ran.all_events if e.event_type_value == "STEP_FAILURE"]
    assert [e.step_key for e in failures] == ["misspelled__eval.plan"], [e.step_key for e in failures]
    said = str(failures[0].step_failure_data.error)
    assert "agent.policy.target: envs.controllers has no attribute 'CartPolePDD'" in said, said
    assert not list(out.rglob("rollouts/*.json")), "no unit ran"
