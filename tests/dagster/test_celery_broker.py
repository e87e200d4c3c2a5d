"""A broker restart mid-run: finished units keep their results, the run ends, a rerun counts each instance once.

A real ``redis-server`` (no persistence, as the tests' and the set-up's) is SIGKILLed and started again on
the same port while one unit of a run is held mid-episode and the others have finished: everything the
broker held (queued steps, step results, leases) is gone. The workers and the run reconnect to the new
server; what the run knows about its steps comes from what survives it (the Dagster instance, the files).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV
from hud_pipelines.dagster.launch import execute_pipeline_job
from hud_pipelines.eval.outputs import EvalOutputs
from tests.dagster.celery_support import (
    RestartableRedis,
    Worker,
    alive,
    celery_workers,
    needs_redis,
    processes_mentioning,
    restartable_redis,
)
from tests.dagster.support import REPO, WritePipeline, sim_processes
from tests.dagster.test_celery import (
    HELD_SIM,
    _comparable,
    _deployment,
    _frames,
    _grades,
    _instance,
    _step_successes,
)

RUN_DEADLINE_S = 180.0
"""How long a run may take once its broker came back (the held unit's few steps and the eval's last steps): a
bound, never a wait, as wide as a loaded two-core machine needs."""
WAIT_S = 180.0
"""How long a worker may take to start and take its first unit (it imports the stack first): a bound too. 60 s
was once too short on a loaded two-core machine."""
LEASE_S = 4.0


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with _instance(tmp_path / "dagster_home") as instance:
        yield instance


def _execute(path: Path, outputs: Path, instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRun:
    """Run the pipeline's job as run ``run_id`` where ``$HUD_PIPELINES_DEPLOYMENT`` says; the run it made."""
    from hud_pipelines.dagster.definitions import definitions_for_file

    job = definitions_for_file(path, outputs_dir=outputs, project_dir=REPO).resolve_job_def(path.stem)
    result = execute_pipeline_job(
        job, path, instance=instance, outputs_dir=outputs, project_dir=REPO, tags={}, run_config={}, run_id=run_id
    )
    return result.dagster_run


def _wait_for(what: str, condition: Callable[[], bool], deadline_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _finished_units(home: dg.DagsterInstance, run_id: str) -> list[str]:
    return [k for k in _step_successes(home, run_id) if k.startswith("bounce__eval.unit[")]


def _observed_partitions(home: dg.DagsterInstance, run_id: str) -> list[str]:
    records = home.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    events = [r.event_log_entry.dagster_event for r in records]
    return [str(e.partition) for e in events if e is not None]


def _files_of(outputs: EvalOutputs, partitions: list[str], run_id: str) -> dict[str, bytes]:
    """What finished units wrote: their results, dataset shards and traces, file by file."""
    files = [outputs.result(key) for key in partitions]
    for key in partitions:
        files += sorted(p for p in outputs.shard(key).rglob("*") if p.is_file())
    traces = outputs.traces(run_id)
    files += sorted(p for p in traces.rglob("*") if p.is_file() and any(key in str(p) for key in partitions))
    return {str(f): f.read_bytes() for f in files}


@dataclass
class HeldRun:
    """A run on two workers with one unit held mid-episode and the others finished (their files kept)."""

    path: Path
    local_out: Path
    outputs_dir: Path
    outputs: EvalOutputs
    hold: Path
    broker: RestartableRedis
    workers: list[Worker]
    run_id: str
    runner: threading.Thread
    ended: list[dg.DagsterRun]
    finished: list[str]
    before: dict[str, bytes]


@contextlib.contextmanager
def _held_run(
    write_pipeline: WritePipeline,
    tmp_path: Path,
    home: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    *,
    group: int,
    finished: list[str],
) -> Iterator[HeldRun]:
    """``group`` instances of the held CartPole, seed 4 (instance 2, slot 0) held: first in process (no
    hold file: nothing holds), then on Celery until ``finished`` ended and the held one is running."""
    hold = tmp_path / "hold"
    path = write_pipeline(  # seeds are instance * 2 + slot
        "bounce",
        sim={"factory": f"{HELD_SIM}:held_cartpole", "args": {"hold_file": str(hold), "hold_seeds": [4]}},
        group=group,
        dataset={"repo_id": "local/bounce"},
    )
    local_out, outputs_dir = tmp_path / "local", tmp_path / "outputs"
    with dg.DagsterInstance.ephemeral() as ephemeral:
        assert _execute(path, local_out, ephemeral, str(uuid.uuid4())).status is dg.DagsterRunStatus.SUCCESS
    outputs = EvalOutputs(outputs_dir, "bounce")

    monkeypatch.setenv("DAGSTER_HOME", str(home.root_directory))
    hold.touch()
    with restartable_redis(tmp_path / "redis") as broker:
        deployment = _deployment(tmp_path, broker.url, retries=0, lease_s=LEASE_S)
        monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
        with celery_workers(deployment, ["w1", "w2"], tmp_path / "logs") as workers:
            run_id = str(uuid.uuid4())
            ended: list[dg.DagsterRun] = []
            runner = threading.Thread(
                target=lambda: ended.append(_execute(path, outputs_dir, home, run_id)), daemon=True
            )
            runner.start()
            _wait_for("the held unit", lambda: hold.with_name("hold.held").is_file())
            _wait_for(f"the other {len(finished)} units", lambda: len(_finished_units(home, run_id)) == len(finished))
            before = _files_of(outputs, finished, run_id)
            yield HeldRun(
                path,
                local_out,
                outputs_dir,
                outputs,
                hold,
                broker,
                list(workers),
                run_id,
                runner,
                ended,
                finished,
                before,
            )


@needs_redis
def test_celery_broker_restarted_mid_run_keeps_finished_results_and_a_rerun_counts_each_instance_once(
    write_pipeline: WritePipeline,
    tmp_path: Path,
    home: dg.DagsterInstance,
    label: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    finished = ["task0-i0", "task0-i1", "task0-i3"]
    with _held_run(write_pipeline, tmp_path, home, monkeypatch, group=4, finished=finished) as held:
        held.broker.restart()  # SIGKILL, then a fresh server on the same port: its queues and results are gone
        held.hold.unlink()
        held.runner.join(RUN_DEADLINE_S)
        assert not held.runner.is_alive(), f"the run did not end within {RUN_DEADLINE_S} s of the broker's restart"
        [run] = held.ended
        assert _files_of(held.outputs, finished, held.run_id) == held.before, "the finished units' files are intact"
        # every step it had in flight was recovered: the ended ones from the event log, the held one
        # by waiting for its keeper to take its lease again; so the run went on to its end
        assert run.status is dg.DagsterRunStatus.SUCCESS
        assert sorted(_observed_partitions(home, held.run_id)) == [f"task0-i{k}" for k in range(4)], "once each"
        assert {r.fault for r in _grades(held.outputs_dir, "bounce")} == {None}, "no unit was taken for lost"

        rerun = run_pipeline(str(held.path), outputs_dir=held.outputs_dir, quiet=True)
        assert rerun == 0, "a rerun on the same workers"
    _assert_nothing_left(held, label)
    _assert_every_episode_once(held, instances=4)


@needs_redis
def test_celery_broker_that_stays_down_fails_the_run_naming_it_and_a_rerun_completes(
    write_pipeline: WritePipeline,
    tmp_path: Path,
    home: dg.DagsterInstance,
    label: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    finished = ["task0-i0", "task0-i1"]  # seed 4's instance 2 starts once instance 0 or 1 ended
    with _held_run(write_pipeline, tmp_path, home, monkeypatch, group=3, finished=finished) as held:
        held.broker.kill()
        held.runner.join(RUN_DEADLINE_S)
        assert not held.runner.is_alive(), f"the run did not end within {RUN_DEADLINE_S} s of losing its broker"
        [run] = held.ended
        assert run.status is dg.DagsterRunStatus.FAILURE
        records = home.get_records_for_run(held.run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
        failures = {str(r.event_log_entry.step_key): r.event_log_entry.dagster_event for r in records}
        assert list(failures) == ["bounce__eval.unit[u2_task0_i2]"], "only the step in flight failed"
        error = failures["bounce__eval.unit[u2_task0_i2]"].step_failure_data.error  # type: ignore[union-attr]
        assert error is not None
        assert f"the broker {held.broker.url} did not answer for {LEASE_S:g} s" in error.message
        assert _files_of(held.outputs, finished, held.run_id) == held.before, "the finished units' files are intact"

        held.broker.start()  # back on the same port: the workers reconnect; the held unit may end now
        held.hold.unlink()
        rerun = run_pipeline(str(held.path), outputs_dir=held.outputs_dir, quiet=True)
        assert rerun == 0, "a rerun on the same workers"
    _assert_nothing_left(held, label)
    _assert_every_episode_once(held, instances=3)


def _assert_every_episode_once(held: HeldRun, *, instances: int) -> None:
    """One grade row per slot of every instance, equal to the in-process run's, and each episode once in the dataset."""
    rows = _grades(held.outputs_dir, "bounce")
    expected = [(i, s) for i in range(instances) for s in range(2)]
    assert sorted((r.instance, r.slot) for r in rows) == expected, "once each"
    assert _comparable(rows) == _comparable(_grades(held.local_out, "bounce"))
    frames = _frames(held.outputs_dir / "datasets" / "bounce")
    episodes = 2 * instances
    assert sorted(set(frames.column("episode_index").to_pylist())) == list(range(episodes)), "each episode once"
    assert len(frames) == episodes * 30


def _assert_nothing_left(held: HeldRun, label: str) -> None:
    assert not any(alive(w.pid) for w in held.workers), "every worker stopped"
    assert not processes_mentioning(held.broker.url), "no lease keeper left"
    assert not sim_processes(label), "no sim left on any worker"
