"""Runs of one pipeline that overlap: a ``hud-pipelines run`` says when another run of the same pipeline runs.

Two runs of one pipeline at once run the same instances: each writes every instance's result whole, and the
one that finishes an instance last keeps it, so nothing is mixed, but the work is done twice and each run's
summary shows the other's rows as "earlier runs". A run carries the host and process id that run it as tags,
which tell a live run from one a killed process left as STARTED in the instance: ``hud-pipelines run`` tags
its run as it launches it, and the eval step tags every run (launched from the CLI, the UI, a sensor, a
schedule, ``dagster job execute``) with its own process when it starts.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import dagster as dg

from hud_pipelines.sim.process import proc_stat

HOST_TAG = "hud_pipelines/host"
PID_TAG = "hud_pipelines/pid"
LAUNCHER_TAG = "hud_pipelines/launcher"
CLI_LAUNCHER = "hud-pipelines run"
IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def launcher_tags() -> dict[str, str]:
    """The tags that tell this process's ``hud-pipelines run`` from a dead one's."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), LAUNCHER_TAG: CLI_LAUNCHER}


def tag_running(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> None:
    """Tag the run with this process, the one that runs its instances (a re-execution may carry its parent's),
    and warn in its log of another live run of the pipeline (launched from the UI twice, say)."""
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
    if any(context.run.tags.get(key) != value for key, value in tags.items()):
        context.instance.add_run_tags(context.run.run_id, tags)
    for overlap in overlapping_runs(context.instance, context.run.job_name, excluding=context.run.run_id):
        context.log.warning(overlap)


def unfinished_runs(instance: dg.DagsterInstance, pipeline: str) -> list[dg.DagsterRun]:
    """The runs of ``pipeline`` not ended, less those whose process on this host is known to be gone."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=pipeline, statuses=IN_PROGRESS))
    here = socket.gethostname()
    return [
        run
        for run in runs
        if not (
            run.tags.get(HOST_TAG) == here and (pid := run.tags.get(PID_TAG, "")).isdigit() and not _alive(int(pid))
        )
    ]


def overlapping_runs(instance: dg.DagsterInstance, pipeline: str, *, excluding: str | None = None) -> list[str]:
    """Warnings for the runs of ``pipeline`` (but ``excluding``) that a live process on this host is running."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=pipeline, statuses=IN_PROGRESS))
    found: list[str] = []
    for run in runs:
        if run.run_id == excluding:
            continue
        host, pid = run.tags.get(HOST_TAG), run.tags.get(PID_TAG)
        if host != socket.gethostname() or pid is None or not pid.isdigit() or not _alive(int(pid)):
            continue
        found.append(
            f"run {run.run_id} of {pipeline}, {_origin(run.tags)} (process {pid}), is still running: both run "
            "the same instances, and the one that finishes an instance last keeps its result (wait for it, or "
            "give this run other partitions)"
        )
    return found


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
