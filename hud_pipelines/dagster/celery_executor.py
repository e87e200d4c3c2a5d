"""Steps on Celery workers: dagster-celery's execution loop, with leases so that a lost worker costs one step.

The run's process plans the steps and hands each ready one to the broker, on the queue its op's
``dagster-celery/queue`` tag names (the eval's units on the pipeline's queue, or the run's
:data:`RUN_QUEUE_TAG` when it has one; every other step on the control queue); a worker (``celery -A
hud_pipelines.dagster.worker worker``) runs it and writes its events to the run's Dagster instance.
That loop is dagster-celery's own; this executor only wraps each submitted task's result in a
:class:`LeasedResult`, which also answers *ready* when the worker running the step has lost its
lease (:mod:`hud_pipelines.dagster.lease`): the worker died.

What a lost step becomes is decided here, in the run, because the worker cannot say anything:

- a *unit* (an instance of the eval, tagged :data:`UNIT_TAG`) is always put up for retry. Its next
  attempt either runs the instance again (``execution.retries`` times at most) or, once those are
  spent, records the instance as failed with the fault ``worker_lost`` and ends as a step that did
  its job: the instance failed as data, exactly as an instance whose sim died in process fails, so
  the run's grades, report and checks still follow every unit.
- any other step is retried ``execution.retries`` times, then fails.

What the broker loses is recovered from what survives it. A broker restarted without its data (no
persistence: its queues, step results and leases are gone) is noticed through a marker key the run
keeps in it; then a step that had ended is read back from the run's Dagster event log (the workers
write their events there, not to the broker), a running step's lease comes back with its keeper's
next renewal (so it is not taken for lost within ``lease_s`` of the restart), and a step that was
still queued is sent again (its message is gone with the broker). A broker that does not answer for
``lease_s`` fails every step in flight with an error naming it, so the run ends instead of waiting.

As units end, their results are handed to :mod:`hud_pipelines.eval.progress` in the run's process
(the CLI's progress bar listens there).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import kombu.exceptions
import redis
from dagster._core.event_api import EventLogCursor
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.objects import StepFailureData, StepRetryData
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.execution.plan.step import ExecutionStep
from dagster._core.execution.retries import RetryMode
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import pack_value, serialize_value
from dagster_celery import core_execution_loop, make_app, tasks
from dagster_celery.config import DEFAULT_CONFIG
from dagster_celery.executor import CeleryExecutor
from dagster_shared.error import SerializableErrorInfo
from redis.backoff import NoBackoff
from redis.retry import Retry

from hud_pipelines.dagster.deployment import ExecutionSettings
from hud_pipelines.dagster.lease import lease_holder, lease_url
from hud_pipelines.dagster.unit_tags import RESULT_METADATA, RUN_QUEUE_TAG, UNIT_TAG
from hud_pipelines.eval import progress
from hud_pipelines.eval.runner import InstanceResult

BROKER_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, kombu.exceptions.OperationalError, OSError)
"""What a call to the broker or the result backend raises when the server is unreachable."""
MARKER_PREFIX = "hud-pipelines:run:"
MARKER_TTL_S = 3600
"""How long a run's marker outlives the run's last look at it (a run that died leaves no key behind)."""
CHECK_EVERY_S = 0.5
"""How often the run looks at its broker (dagster-celery's loop ticks once a second)."""
PROBE_TIMEOUT_S = 2.0


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
        client = _client(self.lease_url)
        watch = BrokerWatch(self.broker, self.lease_url, plan_context.dagster_run.run_id, down_s=self.lease_s)
        registered: dict[int, Any] = {}  # the app's step task, registered once (not once per submission)

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
            if step.tags.get(UNIT_TAG) == "true":
                queue = context.dagster_run.tags.get(RUN_QUEUE_TAG, queue)
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
            )

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


class BrokerWatch:
    """What the run knows of its broker between ticks: whether it answers, and when it last lost its data.

    The run keeps a marker key in the broker (and in the result backend when that is another Redis);
    a marker that is gone means the server came back without its data, so whatever was queued, every
    step result it held and every lease are gone with it. Each look renews the marker (``EXPIRE``),
    so a run that died leaves nothing behind after :data:`MARKER_TTL_S`.
    """

    def __init__(self, broker: str, backend: str, run_id: str, *, down_s: float) -> None:
        self.broker = broker
        self.down_s = down_s
        self._marker = f"{MARKER_PREFIX}{run_id}"
        self._clients = {url: _client(url) for url in dict.fromkeys([broker, backend])}
        self._checked_at = float("-inf")
        self.down_since: float | None = None
        self.error: str = ""
        self.restarted_at: float | None = None
        """When a server last came back without its data (``time.monotonic()``)."""
        self.queues_lost_at: float | None = None
        """When the broker itself (the queues) last came back without its data."""

    def start(self) -> None:
        for client in self._clients.values():
            client.set(self._marker, "1", ex=MARKER_TTL_S)

    def stop(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(*BROKER_ERRORS):
                client.delete(self._marker)
            client.close()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    @property
    def down_too_long(self) -> bool:
        return self.down_since is not None and time.monotonic() - self.down_since > self.down_s

    def check(self, *, force: bool = False) -> None:
        """Look at the servers (at most every :data:`CHECK_EVERY_S` unless ``force``): up, and with their data?"""
        now = time.monotonic()
        if not force and now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        try:
            for url, client in self._clients.items():
                if not client.expire(self._marker, MARKER_TTL_S):
                    self._restarted(url, client, now)
        except BROKER_ERRORS as exc:
            self.unreachable(exc)
            return
        self.down_since, self.error = None, ""

    def unreachable(self, error: Exception) -> None:
        """A call to the broker failed: it is down from now (or since it first failed)."""
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.error = f"{type(error).__name__}: {error}"

    def restarted_since(self, since: float) -> bool:
        return self.restarted_at is not None and self.restarted_at > since

    def queues_lost_since(self, since: float) -> bool:
        return self.queues_lost_at is not None and self.queues_lost_at > since

    def _restarted(self, url: str, client: redis.Redis, now: float) -> None:
        self.restarted_at = now
        if url == self.broker:
            self.queues_lost_at = now
        client.set(self._marker, "1", ex=MARKER_TTL_S)  # so that a second restart is seen too


@dataclass(frozen=True)
class LoggedAttempt:
    """What the run's event log holds of one attempt of a step (what the worker wrote there)."""

    events: list[DagsterEvent]

    @property
    def started(self) -> bool:
        return any(event.is_step_start for event in self.events)

    @property
    def ended(self) -> bool:
        return any(e.is_step_success or e.is_step_failure or e.is_step_up_for_retry for e in self.events)


class LeasedResult:
    """A submitted step's Celery result that is also *ready* when its worker lost the lease.

    dagster-celery's loop asks ``ready()`` on every tick, then ``get()`` for the step's serialized
    events; for a lost step these are the retry (or failure) the run decides on, for a step whose
    result the broker lost they are the ones its worker wrote to the run's event log, and for a step
    in flight while the broker stayed down they are its failure.
    """

    def __init__(
        self,
        send: Callable[[], Any],
        client: redis.Redis,
        watch: BrokerWatch,
        context: PlanOrchestrationContext,
        step: ExecutionStep,
        *,
        attempt: int,
        executor: LeasedCeleryExecutor,
    ) -> None:
        self._send = send
        self._client = client
        self._watch = watch
        self._context = context
        self._step = step
        self._attempt = attempt
        self._executor = executor
        self._holder: str | None = None
        self._lost = False
        self._events: list[DagsterEvent] | None = None
        self._cursor = _event_log_cursor(context)  # before sending: the attempt's events come after it
        self._sent_at = time.monotonic()
        self._result: Any = None
        try:
            self._result = send()
        except BROKER_ERRORS as exc:  # sent again on the next ticks, until the broker is down too long
            watch.unreachable(exc)

    def ready(self) -> bool:
        if self._lost or self._events is not None:
            return True
        self._watch.check()
        if self._watch.down:
            if self._watch.down_too_long:
                self._events = [self._broker_down_event()]
                return True
            return False
        try:
            return self._poll()
        except BROKER_ERRORS as exc:
            self._watch.unreachable(exc)
            return False

    def get(self) -> list[str]:
        if self._lost:
            return [serialize_value(event) for event in self._lost_events()]
        if self._events is not None:
            return [serialize_value(event) for event in self._events]
        return cast(list[str], self._result.get())

    def revoke(self) -> None:
        if self._result is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                self._result.revoke()

    def _poll(self) -> bool:
        if self._result is None:
            self._result = self._send()
            self._sent_at = time.monotonic()
        if self._result.ready():
            return True
        holder = lease_holder(self._client, str(self._result.id))
        if holder is not None:
            self._holder = holder
            return False
        if self._holder is None and not self._watch.restarted_since(self._sent_at):
            if self._result.state != "STARTED":
                return False  # queued: no worker has taken it yet
            self._holder = _started_by(self._result.info)  # it started and ended between two ticks
        if self._result.ready():  # it ended (and gave the lease up) between the two reads
            return True
        return self._unleased()

    def _unleased(self) -> bool:
        """No lease and no result: ended with its result lost, waiting for its keeper, requeued, or lost."""
        self._watch.check(force=True)  # a lease that just vanished may be a broker that just restarted
        logged = self._logged_attempt()
        if logged.ended:  # its worker finished it; the broker lost the result
            self._events = logged.events
            return True
        if self._watch.restarted_since(time.monotonic() - self._executor.lease_s):
            return False  # the keepers take their leases again within a period of the restart
        if self._holder is None and not logged.started:
            if self._watch.queues_lost_since(self._sent_at):
                self._send_again()
            return False
        self._lost = True
        return True

    def _send_again(self) -> None:
        """The broker lost the queued step with its data: send it again (nobody else will run it)."""
        DagsterEvent.engine_event(
            self._context.for_step(self._step),
            f"the broker {_shown(self._watch.broker)} came back without its queues: step "
            f"{self._step.key} was still queued and is sent again",
            EngineEventData(),
        )
        self._result = None
        self._result = self._send()
        self._sent_at = time.monotonic()

    def _logged_attempt(self) -> LoggedAttempt:
        records = self._context.instance.get_records_for_run(self._context.dagster_run.run_id, cursor=self._cursor)
        events = [
            entry.dagster_event
            for entry in (record.event_log_entry for record in records.records)
            if entry.dagster_event is not None and entry.step_key == self._step.key
        ]
        return LoggedAttempt(events)

    def _broker_down_event(self) -> DagsterEvent:
        reason = (
            f"the broker {_shown(self._watch.broker)} did not answer for {self._watch.down_s:g} s "
            f"while step {self._step.key} was in flight ({self._watch.error}); the steps that ended keep their "
            "results; run the eval again once the broker is back"
        )
        error = SerializableErrorInfo(message=reason, stack=[], cls_name="BrokerUnreachable")
        step_context = self._context.for_step(self._step)
        return DagsterEvent.step_failure_event(step_context, StepFailureData(error=error, user_failure_data=None))

    def _lost_events(self) -> list[DagsterEvent]:
        step_context = self._context.for_step(self._step)
        worker = self._holder or "its worker"
        reason = (
            f"the worker running step {self._step.key} ({worker}) was lost: its lease ended before the step "
            f"did (attempt {self._attempt + 1})"
        )
        error = SerializableErrorInfo(message=reason, stack=[], cls_name="WorkerLost")
        DagsterEvent.engine_event(step_context, reason, EngineEventData(error=error))
        if self._attempt < self._executor.allowed_attempts(self._step):
            return [DagsterEvent.step_retry_event(step_context, StepRetryData(error=error))]
        return [DagsterEvent.step_failure_event(step_context, StepFailureData(error=error, user_failure_data=None))]


def _shown(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":**@", 1)))


def _client(url: str) -> redis.Redis:
    """A Redis client that answers or fails within seconds (no retries: the run's loop tries again next tick)."""
    return redis.Redis.from_url(
        url, socket_timeout=PROBE_TIMEOUT_S, socket_connect_timeout=PROBE_TIMEOUT_S, retry=Retry(NoBackoff(), 0)
    )


def _event_log_cursor(context: PlanOrchestrationContext) -> str | None:
    """A cursor after the run's latest event: what a step logs from now on comes after it."""
    latest = context.instance.get_records_for_run(context.dagster_run.run_id, limit=1, ascending=False).records
    return EventLogCursor.from_storage_id(latest[0].storage_id).to_string() if latest else None


def _started_by(info: object) -> str | None:
    """The worker and process a task's STARTED state names (Celery stores them with it)."""
    if not isinstance(info, dict):
        return None
    started = cast(dict[str, Any], info)
    return f"{started.get('hostname', 'a worker')} pid {started.get('pid', '?')}"


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
    signature = task.si(execute_step_args_packed=pack_value(args), executable_dict=recon.to_dict())
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
            progress.notify(InstanceResult.read(path))
