"""Runs of one pipeline that overlap: a run says when another run of the same pipeline runs.

Two runs of one pipeline at once run the same instances: each writes every instance's result whole, and the
one that finishes an instance last keeps it, so nothing is mixed, but the work is done twice and each run's
summary shows the other's rows as "earlier runs". A run carries the host and process id that run it as tags,
which tell a live run from one a killed process left as STARTED in the instance: ``hud-pipelines run`` tags
its run as it launches it, and the eval step tags every run (launched from the CLI, the UI, a sensor, a
schedule, ``dagster job execute``) with its pipeline and its own process when it starts. The tags name the
run they were written for: a re-execution copies its parent's, which say nothing of it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import dagster as dg

from hud_pipelines.sim.proc import proc_stat

HOST_TAG = "hud_pipelines/host"
PID_TAG = "hud_pipelines/pid"
PID_RUN_TAG = "hud_pipelines/pid_run"
PIPELINE_TAG = "hud_pipelines/pipeline"
LAUNCHER_TAG = "hud_pipelines/launcher"
CLI_LAUNCHER = "hud-pipelines run"
LAUNCHED_RUN_TAG = "hud_pipelines/launched_run"
"""The run ``hud-pipelines run`` launched, which nothing else writes (a re-execution copies it unchanged)."""
IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def launcher_tags(run_id: str) -> dict[str, str]:
    """The tags that tell this process's ``hud-pipelines run`` (of run ``run_id``) from a dead one's."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PID_RUN_TAG: run_id,
        LAUNCHER_TAG: CLI_LAUNCHER,
        LAUNCHED_RUN_TAG: run_id,
    }


def tag_running(context: dg.OpExecutionContext | dg.AssetExecutionContext, pipeline: str) -> None:
    """Tag the run with its pipeline and this process, the one that runs its instances (a backfill names its
    runs for no pipeline), and warn in its log of another live run of the pipeline (two launches in the UI)."""
    run_id = context.run.run_id
    tags = {PIPELINE_TAG: pipeline, **_this_process(run_id)}
    if context.run.tags.get(PID_RUN_TAG) == run_id:  # its orchestrating process tagged itself: this is a worker
        tags = {PIPELINE_TAG: pipeline}
    if any(context.run.tags.get(key) != value for key, value in tags.items()):
        context.instance.add_run_tags(run_id, tags)
    for overlap in overlapping_runs(context.instance, pipeline, excluding=run_id):
        context.log.warning(overlap)


def tag_orchestrator(instance: dg.DagsterInstance, run_id: str) -> None:
    """Tag the run with this process, which orchestrates it while its steps run on workers (Celery): its plan step
    runs on a worker too, whose life says nothing of the run's (a run whose orchestrator died stayed "running")."""
    instance.add_run_tags(run_id, _this_process(run_id))


def _this_process(run_id: str) -> dict[str, str]:
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PID_RUN_TAG: run_id}


def unfinished_runs(instance: dg.DagsterInstance, pipeline: str) -> list[dg.DagsterRun]:
    """The runs of ``pipeline`` not ended, less those whose process on this host is known to be gone."""
    return [run for run in _in_progress(instance, pipeline) if _process_lives(run) is not False]


def overlapping_runs(instance: dg.DagsterInstance, pipeline: str, *, excluding: str | None = None) -> list[str]:
    """Warnings for the runs of ``pipeline`` (but ``excluding``) that a live process on this host is running."""
    return [
        f"run {run.run_id} of {pipeline}, {_origin(run.tags)} (process {run.tags.get(PID_TAG)}), is still running: "
        "both run the same instances, and the one that finishes an instance last keeps its result (wait for it, "
        "or give this run other partitions)"
        for run in _in_progress(instance, pipeline)
        if run.run_id != excluding and _process_lives(run)
    ]


def _in_progress(instance: dg.DagsterInstance, pipeline: str) -> list[dg.DagsterRun]:
    """The unfinished runs of ``pipeline``: its job's, those tagged with it, and a backfill's ("Materialize all"
    names its runs for no job) whose assets are the pipeline's."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS))
    return [
        run
        for run in runs
        if run.job_name == pipeline
        or run.tags.get(PIPELINE_TAG) == pipeline
        or any(key.path[0] == pipeline for key in run.asset_selection or ())
    ]


def _process_lives(run: dg.DagsterRun) -> bool | None:
    """Whether the process that runs ``run`` here lives (``None``: unknown, it runs elsewhere or has no tags of
    its own yet)."""
    pid = run.tags.get(PID_TAG, "")
    if run.tags.get(HOST_TAG) != socket.gethostname() or not pid.isdigit() or run.tags.get(PID_RUN_TAG) != run.run_id:
        return None
    return _alive(int(pid))


def _origin(tags: Mapping[str, str]) -> str:
    if tags.get(LAUNCHER_TAG) == CLI_LAUNCHER:
        return "started by another `hud-pipelines run`"
    if sensor := tags.get("dagster/sensor_name"):
        return f"launched by the sensor {sensor}"
    if schedule := tags.get("dagster/schedule_name"):
        return f"launched by the schedule {schedule}"
    return "launched from Dagster (the UI, `dagster job execute` or `dg launch`)"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs here (one that exited, or a zombie, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    fields = proc_stat(pid)
    if fields is None:  # no /proc (signal 0 said it exists), or it exited since
        return not os.path.isdir("/proc")
    return fields[0] != b"Z"
