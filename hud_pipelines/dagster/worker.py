"""The Celery app of a worker that runs the steps of hud-pipelines runs.

Start one per core (or per GPU) with the deployment file the runs use::

    HUD_PIPELINES_DEPLOYMENT=deploy/celery.yaml \\
        celery -A hud_pipelines.dagster.worker worker --pool solo --queues cpu --hostname cpu1@%h

``--pool solo`` runs each step in the worker's own process, which the eval's units need: a unit
spawns its sims as child processes, which the default prefork pool's daemonic children may not do.
A worker reads the broker, the result backend and the lease period from the top-level
``execution:`` section of the deployment file, the same file the run reads, so both ends agree.

While a step runs, its worker holds the step's lease (:mod:`hud_pipelines.dagster.lease`), kept by a
small keeper process beside the worker: when the worker dies mid-step the keeper drops the lease,
and the run then retries or fails that step alone.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, cast

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_shutdown
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import unpack_value
from dagster_celery import tasks
from dagster_celery.config import TASK_EXECUTE_PLAN_NAME

from hud_pipelines.dagster.celery_executor import celery_app
from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV, deployment_path
from hud_pipelines.dagster.execution import ExecutionSettings, load_execution
from hud_pipelines.dagster.lease import LeaseKeeper, lease_url
from hud_pipelines.dagster.location import LOCATION_DIGEST, load_as_run
from hud_pipelines.dagster.step_recovery import run_ended
from hud_pipelines.errors import DeploymentError

log = logging.getLogger(__name__)


def _settings() -> ExecutionSettings:
    path = deployment_path()
    if path is None:
        raise DeploymentError(
            f"a hud-pipelines worker needs ${DEPLOYMENT_ENV}: the deployment file whose 'execution:' names the broker"
        )
    settings = load_execution(path).default
    if not settings.broker:
        raise DeploymentError(f"deployment file {path}: execution.broker: a worker needs the broker's address")
    return settings


def _keep_sigterm_a_warm_shutdown() -> None:
    """Keep SIGTERM what Celery makes it in a worker: a warm shutdown (the running step finishes, no other is
    taken). Every time Dagster's step code sets its SIGINT handler, it points SIGTERM at it too
    (``setup_interrupt_handlers``: a pod's SIGTERM should interrupt its run), so after the first step a
    worker stopped the usual way (systemd, ``docker stop``, a deploy) interrupted its unit as cancelled, crashed
    on Celery's own handling of that, and the run failed with nothing retried."""
    from dagster._utils import interrupts

    interrupts.setup_interrupt_handlers = lambda: None


_keep_sigterm_a_warm_shutdown()
settings = _settings()
app = celery_app(settings)
_dagster_execute_plan = cast(Any, tasks.create_task(Celery("dagster-celery-steps", set_as_current=False), shared=False))
"""dagster-celery's task that runs one step of a run, which :func:`execute_plan` calls. It is made on an app of
its own: on this app it would take the task's name first, and Celery keeps the first callable registered
under a name (a later one under the same name is dropped with a ``DuplicateTaskNameWarning``), so the checks
of :func:`execute_plan` would never run."""


@app.task(bind=True, name=TASK_EXECUTE_PLAN_NAME)
def execute_plan(self: Any, execute_step_args_packed: dict[str, Any], executable_dict: dict[str, Any]) -> list[str]:
    """Run one step of a run (dagster-celery's task), unless that run has ended, with the pipeline files the run
    began with (the digest the run adds to ``executable_dict``, for a run of the code location:
    :func:`~.location.load_as_run`).

    The broker hands a step whose worker died to another worker once its visibility timeout passes (an
    hour by default), and a step revoked while queued can still reach a worker: the run it belongs to
    has ended by then, failed or interrupted, and its unit would overwrite the result a later run made.
    """
    args = unpack_value(execute_step_args_packed, as_type=ExecuteStepArgs)
    ended = run_ended(args.instance_ref, args.run_id)
    if ended is not None:
        log.warning("not running steps %s: run %s has ended (%s)", args.step_keys_to_execute, args.run_id, ended)
        return []
    executable_dict = dict(executable_dict)
    location_digest = executable_dict.pop(LOCATION_DIGEST, "")
    if location_digest:
        load_as_run(args.job_origin.job_name, location_digest)
    _dagster_execute_plan.push_request(hostname=self.request.hostname, id=self.request.id)
    try:
        return _dagster_execute_plan.run(execute_step_args_packed, executable_dict)
    finally:
        _dagster_execute_plan.pop_request()


_keeper = LeaseKeeper(lease_url(settings.broker or "", settings.result_backend), ttl_s=settings.lease_s)


@task_prerun.connect
def _take_lease(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is not None:
        hostname = getattr(getattr(task, "request", None), "hostname", None) or socket.gethostname()
        _keeper.hold(task_id, f"{hostname} pid {os.getpid()}")


@task_postrun.connect
def _give_lease_up(task_id: str | None = None, **_: Any) -> None:
    if task_id is not None:
        _keeper.release(task_id)


@worker_shutdown.connect
def _stop_keeper(**_: Any) -> None:
    _keeper.close()
