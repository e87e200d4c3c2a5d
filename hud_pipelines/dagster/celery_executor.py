"""Steps on Celery workers: dagster-celery's execution loop, with leases so that a lost worker costs one step.

The run's process plans the steps and hands each ready one to the broker, on the queue its op's
``dagster-celery/queue`` tag names (the eval's units on the pipeline's queue, or the run's
:data:`RUN_QUEUE_TAG` when it has one; every other step on the control queue); a worker (``celery -A
hud_pipelines.dagster.worker worker``) runs it and writes its events to the run's Dagster instance.
That loop is dagster-celery's own; this executor only wraps each submitted task's result in a
:class:`~hud_pipelines.dagster.step_recovery.LeasedResult`, which also answers *ready* when the
worker running the step has lost its lease (:mod:`hud_pipelines.dagster.lease`): the worker died,
or when the broker lost what it held of the step (:mod:`hud_pipelines.dagster.step_recovery`).

What a lost step becomes is decided in the run, because the worker cannot say anything:

- a *unit* (an instance of the eval, tagged :data:`UNIT_TAG`) is always put up for retry. Its next
  attempt either runs the instance again (``execution.retries`` times at most) or, once those are
  spent, records the instance as failed with the fault ``worker_lost`` and ends as a step that did
  its job: the instance failed as data, exactly as an instance whose sim died in process fails, so
  the run's grades, report and checks still follow every unit.
- any other step is retried ``execution.retries`` times, then fails.

As units end, their results are handed to :mod:`hud_pipelines.eval.progress` in the run's process
(the CLI's progress bar listens there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import dagster as dg
from dagster._core.events import DagsterEvent
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.execution.plan.step import ExecutionStep
from dagster._core.execution.retries import RetryMode
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import pack_value
from dagster_celery import core_execution_loop, make_app, tasks
from dagster_celery.config import DEFAULT_CONFIG
from dagster_celery.executor import CeleryExecutor

from hud_pipelines.dagster.broker_watch import BrokerWatch, redis_client
from hud_pipelines.dagster.execution import ExecutionSettings
from hud_pipelines.dagster.lease import lease_url
from hud_pipelines.dagster.location import LOCATION_DIGEST, run_digest
from hud_pipelines.dagster.overlap import tag_orchestrator
from hud_pipelines.dagster.step_recovery import LeasedResult, QueueWatch
from hud_pipelines.dagster.unit_tags import RESULT_METADATA, RUN_QUEUE_TAG, UNIT_TAG
from hud_pipelines.eval import progress
from hud_pipelines.eval.runner import InstanceResult


def app_args(settings: ExecutionSettings) -> dict[str, Any]:
    """The Celery app's arguments, the same in the run and in every worker (broker, backend, queues)."""
    broker = settings.broker or ""
    return leased_executor(
        broker, settings.result_backend or broker, settings.control_queue, 0, settings.lease_s
    ).app_args()


def celery_app(settings: ExecutionSettings) -> Any:
    """A Celery app for ``settings`` with dagster-celery's task routes (what the run and the workers use)."""
    return make_app.make_app(app_args(settings))


def leased_executor(
    broker: str, backend: str, control_queue: str, retries: int, lease_s: float
) -> LeasedCeleryExecutor:
    """dagster-celery's executor for this broker, with the queues and worker settings both ends share."""
    config_source: dict[str, Any] = {
        **DEFAULT_CONFIG,
        "task_default_queue": control_queue,
        # One step per worker process at a time and no prefetched step held by a busy worker: a worker
        # that dies takes only the step it was running with it.
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        "broker_connection_retry_on_startup": True,
    }
    return LeasedCeleryExecutor(
        broker=broker, backend=backend, config_source=config_source, lost_retries=retries, lease_s=lease_s
    )


class LeasedCeleryExecutor(CeleryExecutor):
    """dagster-celery's executor whose submitted steps are watched through their workers' leases."""

    def __init__(
        self, *, broker: str, backend: str, config_source: dict[str, Any], lost_retries: int, lease_s: float
    ) -> None:
        # Dagster's own retries stay enabled: a lost step is put up for retry through them.
        super().__init__(
            retries=RetryMode(RetryMode.ENABLED), broker=broker, backend=backend, config_source=config_source
        )
        self.lost_retries = lost_retries
        self.lease_s = lease_s
        self.lease_url = lease_url(broker, backend)

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Generator[DagsterEvent, Any, None]:
        client = redis_client(self.lease_url)
        watch = BrokerWatch(self.broker, self.lease_url, plan_context.dagster_run.run_id, down_s=self.lease_s)
        registered: dict[int, Any] = {}  # the app's step task, registered once (not once per submission)
        queues = QueueWatch()

        def submit(
            app: Any,
            context: PlanOrchestrationContext,
            step: ExecutionStep,
            queue: str,
            priority: int,
            known_state: KnownExecutionState,
        ) -> LeasedResult:
            if id(app) not in registered:
                registered[id(app)] = cast(Any, tasks).create_task(app)
            if (
                step.tags.get(UNIT_TAG) == "true"
                and (tagged := context.dagster_run.tags.get(RUN_QUEUE_TAG, queue)) != queue
            ):
                # dagster-celery has logged the step's own queue: say where the unit goes instead
                context.log.info(f'step "{step.key}" goes to queue "{tagged}" (the run\'s {RUN_QUEUE_TAG} tag)')
                queue = tagged
            task = registered[id(app)]
            attempt = known_state.previous_retry_attempts.get(step.key, 0)
            return LeasedResult(
                lambda: _send_step(task, context, step, queue, priority, known_state),
                client,
                watch,
                context,
                step,
                attempt=attempt,
                executor=self,
                queue=queue,
                queues=queues,
            )

        tag_orchestrator(plan_context.instance, plan_context.dagster_run.run_id)
        watch.start()
        try:
            loop = cast(Any, core_execution_loop).core_celery_execution_loop
            events = cast(Iterator[DagsterEvent], loop(plan_context, execution_plan, step_execution_fn=submit))
            for event in events:
                _notify_progress(event)
                yield event
        finally:
            watch.stop()
            client.close()

    def allowed_attempts(self, step: ExecutionStep) -> int:
        """How many attempts a step whose worker was lost may have after the first."""
        # A unit has one more: the attempt that records its instance as failed.
        return self.lost_retries + 1 if step.tags.get(UNIT_TAG) == "true" else self.lost_retries


def _send_step(
    task: Any,
    context: PlanOrchestrationContext,
    step: ExecutionStep,
    queue: str,
    priority: int,
    known_state: KnownExecutionState,
) -> Any:
    """Send one step to ``queue`` as dagster-celery's ``execute_plan`` task; its Celery result."""
    recon = context.reconstructable_job
    args = ExecuteStepArgs(
        job_origin=recon.get_python_origin(),
        run_id=context.dagster_run.run_id,
        step_keys_to_execute=[step.key],
        instance_ref=context.instance.get_ref(),
        retry_mode=context.executor.retries.for_inner_plan(),
        known_state=known_state,
        print_serialized_events=True,
    )
    executable = {**recon.to_dict(), LOCATION_DIGEST: run_digest(recon)}  # the worker takes its own key out
    signature = task.si(execute_step_args_packed=pack_value(args), executable_dict=executable)
    return signature.apply_async(priority=priority, queue=queue, routing_key=f"{queue}.execute_plan")


def _notify_progress(event: DagsterEvent) -> None:
    """Hand a finished unit's result to the progress listeners of this process (the CLI's bar)."""
    if event.event_type_value != "ASSET_OBSERVATION":
        return
    metadata = event.asset_observation_data.asset_observation.metadata
    entry = metadata.get(RESULT_METADATA)
    if isinstance(entry, dg.PathMetadataValue):
        path = Path(str(entry.path))
        if path.is_file():
            result = InstanceResult.read(path)
            error = metadata.get("error")  # the attempt's: a failed one may have left an earlier result in the file
            said = str(error.value) if isinstance(error, dg.TextMetadataValue) else ""
            progress.notify(dataclasses.replace(result, error=said) if said and not result.failed else result)
