"""What a submitted step becomes when its worker, its result or its queue is lost: the run decides.

dagster-celery's loop asks each submitted step's result whether it is ready; :class:`LeasedResult`
answers for a Celery result and for what the broker cannot say. A step whose worker lost its lease
(:mod:`hud_pipelines.dagster.lease`) is lost: the worker died, and the executor's
``allowed_attempts`` says whether it is put up for retry or fails. What the broker loses is
recovered from what survives it (:class:`~hud_pipelines.dagster.broker_watch.BrokerWatch` notices
the loss): a step that had ended is read back from the run's Dagster event log (the workers write
their events there, not to the broker), a running step's lease comes back with its keeper's next
renewal (so it is not taken for lost within ``lease_s`` of the restart), and a step that was still
queued is sent again (its message is gone with the broker). A broker that does not answer for
``lease_s`` fails every step in flight with an error naming it, so the run ends instead of waiting.

It is apart from the executor, which only submits steps and hands their results to this, because
these rules are the part that reads the broker, the leases and the event log.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import redis
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.event_api import EventLogCursor
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.objects import StepFailureData, StepRetryData
from dagster._core.execution.plan.step import ExecutionStep
from dagster._core.instance.ref import InstanceRef
from dagster._serdes import serialize_value
from dagster_shared.error import SerializableErrorInfo

from hud_pipelines.dagster.broker_watch import BROKER_ERRORS, BrokerWatch, shown_url
from hud_pipelines.dagster.lease import lease_holder

POLL_INTERVAL_S = 0.2
"""The shortest time between two looks at one step's broker state, lease and event log."""

log = logging.getLogger(__name__)

RECORDING_ATTEMPT = "WorkerLostNoRetryLeft"
"""The error class of a lost unit's last retry event: the attempt it starts only records the instance as
``worker_lost`` (it runs nothing again), so it is not a retry to report."""


class LostStepRules(Protocol):
    """What a lost step's fate depends on, as the executor sets it (``execution.lease_s`` and retries).

    The executor answers it; it is named here so that this module need not import the executor's,
    which imports this one.
    """

    @property
    def lease_s(self) -> float: ...

    @property
    def lost_retries(self) -> int:
        """Attempts of a step after its worker was lost that run it again (a unit's one more only records it)."""
        ...

    def allowed_attempts(self, step: ExecutionStep) -> int: ...


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


@dataclass
class QueueWatch:
    """The run's queues whose steps a worker took (a lease seen), and those it said no worker takes: said once a
    queue, and only of one no step of which was taken (the units of a busy queue wait their turn, not for a worker)."""

    taken: set[str] = field(default_factory=set[str])
    said: set[str] = field(default_factory=set[str])


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
        executor: LostStepRules,
        queue: str,
        queues: QueueWatch,
    ) -> None:
        self._send = send
        self._queue = queue
        self._queues = queues
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
        self._revoked = False
        self._polled_at = 0.0
        try:
            self._result = send()
        except BROKER_ERRORS as exc:  # sent again on the next ticks, until the broker is down too long
            watch.unreachable(exc)

    def ready(self) -> bool:
        if self._lost or self._events is not None:
            return True
        self._pace()
        if self._revoked and self._never_taken():  # cancelled while queued: nothing of it ran, nothing to wait for
            self._events = []
            return True
        self._watch.check()
        if self._watch.down:
            logged = self._logged_attempt()
            if logged.ended:  # its worker finished it and logged it; only the broker's copy is out of reach
                self._events = logged.events
            elif self._watch.down_too_long:
                self._events = [self._broker_down_event()]
            else:
                return False
            self._forget_result()
            return True
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
        self._revoked = True
        if self._result is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                self._result.revoke()

    def _pace(self) -> None:
        """At most one look at the broker per :data:`POLL_INTERVAL_S`: once the run stops (or a step failed)
        dagster-celery's loop asks every step again without pausing, and the broker, the leases and the event
        log were read thousands of times a second until the last step ended."""
        wait = self._polled_at + POLL_INTERVAL_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._polled_at = time.monotonic()

    def _never_taken(self) -> bool:
        """No worker took the step: no lease, no start in the event log (a queued step with no worker alive)."""
        with contextlib.suppress(*BROKER_ERRORS):
            if self._result is not None and lease_holder(self._client, str(self._result.id)) is not None:
                return False
        return self._holder is None and not self._logged_attempt().started

    def _poll(self) -> bool:
        if self._result is None:
            self._result = self._send()
            self._sent_at = time.monotonic()
        if self._result.ready():
            self._queues.taken.add(self._queue)  # a worker ran it
            return True
        holder = lease_holder(self._client, str(self._result.id))
        if holder is not None:
            self._holder = holder
            self._queues.taken.add(self._queue)
            return False
        if self._holder is None and not self._watch.restarted_since(self._sent_at):
            if self._result.state != "STARTED":
                self._say_queued()
                return False  # queued: no worker has taken it yet
            self._holder = _started_by(self._result.info)  # it started and ended between two ticks
        if self._result.ready():  # it ended (and gave the lease up) between the two reads
            return True
        return self._unleased()

    def _say_queued(self) -> None:
        """Say, once a queue, that no worker took a step of it within ``lease_s`` (the time a worker may be silent)
        while none of its steps was taken: a run whose queue no worker consumes (a control queue no worker was started
        on) would wait in silence for one."""
        waited = time.monotonic() - self._sent_at
        if self._queue in self._queues.taken or self._queue in self._queues.said or waited < self._executor.lease_s:
            return
        self._queues.said.add(self._queue)
        message = (
            f'step "{self._step.key}" has waited {waited:.0f} s on queue "{self._queue}" with no worker taking it: the '
            "run waits for one; start a worker that consumes that queue (celery -A hud_pipelines.dagster.worker "
            f"worker --queues {self._queue}), or see that its workers are up and not busy"
        )
        self._context.log.warning(message)
        log.warning(message)  # the CLI's console shows no Dagster log lines below CRITICAL

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

    def _forget_result(self) -> None:
        """Let go of the Celery result without its backend: collected, it would call the dead broker.

        Celery's ``AsyncResult.__del__`` unsubscribes from the result backend, retrying a broker that
        is down for 20 s and then raising from a destructor; this step's outcome no longer needs it.
        """
        if self._result is not None:
            self._result.backend = None
            self._result = None

    def _send_again(self) -> None:
        """The broker lost the queued step with its data: send it again (nobody else will run it)."""
        DagsterEvent.engine_event(
            self._context.for_step(self._step),
            f"the broker {shown_url(self._watch.broker)} came back without its queues: step "
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
            f"the broker {shown_url(self._watch.broker)} did not answer for {self._watch.down_s:g} s "
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
        kind = "WorkerLost"
        if self._executor.lost_retries <= self._attempt < self._executor.allowed_attempts(self._step):
            reason += "; no retry is left: its next attempt records the instance as worker_lost"
            kind = RECORDING_ATTEMPT
        error = SerializableErrorInfo(message=reason, stack=[], cls_name=kind)
        DagsterEvent.engine_event(step_context, reason, EngineEventData(error=error))
        if self._attempt < self._executor.allowed_attempts(self._step):
            return [DagsterEvent.step_retry_event(step_context, StepRetryData(error=error))]
        return [DagsterEvent.step_failure_event(step_context, StepFailureData(error=error, user_failure_data=None))]


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


def retried_steps(events: Iterable[DagsterEvent]) -> list[str]:
    """A line per retried attempt of a step (a unit whose worker was lost ran again), with why.

    A run that succeeded after a retry says so: its figures are right, and a worker that keeps being
    lost is worth knowing about.
    """
    lines: list[str] = []
    for event in events:
        if event.event_type_value != "STEP_UP_FOR_RETRY":
            continue
        data = event.event_specific_data
        error = data.error if isinstance(data, StepRetryData) else None
        if error is not None and error.cls_name == RECORDING_ATTEMPT:  # it ran nothing again
            continue
        reason = error.message.strip().splitlines()[0] if error is not None and error.message.strip() else "no reason"
        named = reason if event.step_key and event.step_key in reason else f"step {event.step_key}: {reason}"
        lines.append(f"note: retried: {named}")
    return lines


def run_ended(instance_ref: InstanceRef | None, run_id: str) -> str | None:
    """The status of run ``run_id`` when it has ended or is being cancelled (``None`` while it runs, or where it
    cannot be read): a step of a run being cancelled that reaches a worker (queued when the run was terminated;
    a busy solo worker cannot take the revoke) must not start, or a re-execution would run its unit twice."""
    if instance_ref is None:
        return None
    with DagsterInstance.from_ref(instance_ref) as instance:
        run = instance.get_run_by_id(run_id)
    ending = run is not None and (run.is_finished or run.status is DagsterRunStatus.CANCELING)
    return run.status.value if run is not None and ending else None
