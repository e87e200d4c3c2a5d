"""``BatchedModel``: one policy shared by several agent loops, their calls stacked into one forward.

Several sims driven from one process (``k`` instances of an eval) each call ``infer`` from their own thread. Calls
that are waiting together are stacked row-wise into one forward of the inner policy and the rows are scattered back.
A batch is flushed:

- at once when every expected caller is waiting (the lockstep path: no timer at all);
- when ``batch_size`` rows are queued;
- when the oldest waiting call has waited ``max_wait_s`` (a caller that is not coming, for example
  one whose slots all have actions left, costs at most this window).

Forwards never overlap (torch on a CPU gains nothing from it and remote clients are not thread-safe); calls that
arrive during a forward form the next batch. A forward that raised on the rows of several callers is run again per
caller, so that a caller's bad row fails that caller alone.

``expected_callers`` is the number of loops that share the model. A loop that finishes must :meth:`leave` so the
others stop waiting for it.

``across_callers=False`` is the reproducible mode an eval runs in by default: each call is its own forward (forwards
still never overlap) at the policy's usual thread count. A torch forward rounds a row differently depending on the
batch it sits in and the threads it runs on, so stacking rows of several instances, whose composition depends on
thread timing, would make an eval's actions differ at the last bit from run to run; one instance's own rows are a
deterministic batch.

Every wait has a deadline. Forwards run on a daemon thread of the model, and a caller waits for its rows at most
``forward_timeout_s`` from the moment its forward starts: a forward that is late (or never returns) fails exactly
the callers in it with :class:`~hud_pipelines.errors.PolicyTimeoutError`; the forward is abandoned to its thread and
a fresh thread serves the calls queued behind it, so one stuck forward costs only its own callers. A caller may also
bring its own deadline (:meth:`caller_deadline`, an instance's ``rollout_timeout_s``), and :meth:`abort` wakes every
caller at once (a cancelled run): nobody stays blocked on a policy.

While every expected caller waits, no sim they drive is stepping: a forward started then runs inside the inner
policy's ``lockstep(idle_sims)`` (torch-backed policies use the idle sims' cores, see
:mod:`hud_pipelines.agent.torch_runtime`). A forward started by the window or by ``batch_size`` while a caller is
away keeps the policy's usual threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass

from hud_pipelines.agent.policy import (
    Actions,
    BasePolicy,
    BatchingStats,
    Policy,
    PolicyBatch,
    action_array,
    as_base_policy,
)
from hud_pipelines.agent.run_failures import raised_by_its_rows
from hud_pipelines.closing import Closeable
from hud_pipelines.errors import PolicyShapeError, PolicyTimeoutError, RolloutTimeoutError, RunAborted
from hud_pipelines.spec.agent import DEFAULT_FORWARD_TIMEOUT_S, BatchingConfig


@dataclass(eq=False)  # a call is itself: `call in self._running` must never compare two calls' arrays
class _Call:
    batch: PolicyBatch
    arrived: float
    result: Actions | None = None
    error: BaseException | None = None
    forward_rows: int = 0
    done: bool = False
    claimed: bool = False
    started: float | None = None
    """When the forward serving this call began (its ``forward_timeout_s`` counts from there)."""
    abandoned: bool = False
    """The caller gave up (a deadline or an abort); the forward's rows for it are dropped."""


WorkQueue = queue.SimpleQueue[tuple[list["_Call"], int] | None]
"""A worker's forwards (the calls and how many sims wait idle), then ``None`` to end it."""


class BatchedModel(BasePolicy, Closeable):
    """A thread-safe policy that coalesces concurrent ``infer`` calls into one forward."""

    def __init__(
        self,
        policy: Policy | BasePolicy,
        *,
        max_wait_s: float = 0.005,
        batch_size: int | None = None,
        expected_callers: int = 1,
        forward_timeout_s: float = DEFAULT_FORWARD_TIMEOUT_S,
        across_callers: bool = True,
    ) -> None:
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        if expected_callers < 0:
            raise ValueError(f"expected_callers must be >= 0, got {expected_callers}")
        if forward_timeout_s <= 0:
            raise ValueError(f"forward_timeout_s must be > 0, got {forward_timeout_s}")
        self.forward_timeout_s = forward_timeout_s
        self.across_callers = across_callers
        """Stack concurrent callers into one forward (see the module docstring for the reproducible mode)."""
        self.policy = as_base_policy(policy)
        self.max_wait_s = max_wait_s
        self.batch_size = batch_size
        self._expected = expected_callers
        self._pending: list[_Call] = []
        self._cond = threading.Condition()
        self._local = threading.local()
        self._work: WorkQueue = queue.SimpleQueue()
        """The current worker's forwards; ``None`` in a worker's own queue ends it alone (:meth:`close`)."""
        self._worker: threading.Thread | None = None
        self._generation = 0
        """Bumped when a forward is abandoned: the stuck worker exits once (if ever) it returns."""
        self._running: list[_Call] = []
        """The calls of the forward the worker is running now."""
        self._aborted: str | None = None
        self._reset_before = False
        """Whether the inner policy was reset once (before the first run of episodes)."""
        self.stats = BatchingStats()
        self.horizon = self.policy.horizon
        self.observation_steps = self.policy.observation_steps

    @classmethod
    def from_config(
        cls,
        policy: Policy | BasePolicy,
        batching: BatchingConfig,
        *,
        expected_callers: int = 1,
        forward_timeout_s: float = DEFAULT_FORWARD_TIMEOUT_S,
    ) -> BatchedModel:
        """The model an eval shares between its ``expected_callers`` instances, as ``agent.batching`` says."""
        return cls(
            policy,
            max_wait_s=batching.max_wait_ms / 1000.0,
            batch_size=batching.batch_size,
            expected_callers=expected_callers,
            forward_timeout_s=forward_timeout_s,
            across_callers=batching.across_instances,
        )

    # -- callers ---------------------------------------------------------------------------------------

    @property
    def expected_callers(self) -> int:
        return self._expected

    @expected_callers.setter
    def expected_callers(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"expected_callers must be >= 0, got {value}")
        with self._cond:
            self._expected = value
            self._cond.notify_all()

    def leave(self) -> None:
        """One caller is done for good: the others no longer wait for it."""
        with self._cond:
            self._expected = max(0, self._expected - 1)
            self._cond.notify_all()

    def close(self) -> None:
        """Let the forward thread go once it is idle, and close the policy where it holds a resource (a remote
        one's connection); a later call starts a new thread (and connection). For when no caller is left: a
        forward still running loses its connection. The thread holds the model and so the policy's weights: an eval
        that ends without closing its model would keep both for the life of the process (a code server, a sweep's)."""
        with self._cond:
            if self._worker is not None:
                self._work.put(None)  # after the forwards already queued for it
                self._work = queue.SimpleQueue()
                self._worker = None
        if isinstance(self.policy, Closeable):  # a remote policy's connection; a later call opens another
            self.policy.close()

    def abort(self, reason: str) -> None:
        """Fail every waiting and later call with ``reason`` at once (the run is being cancelled)."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    @contextlib.contextmanager
    def caller_deadline(self, seconds: float) -> Generator[None]:
        """Calls from this thread inside the block fail with :class:`RolloutTimeoutError` after ``seconds``."""
        previous: float | None = getattr(self._local, "deadline", None)
        self._local.deadline = time.monotonic() + seconds
        self._local.deadline_s = seconds
        try:
            yield
        finally:
            self._local.deadline = previous

    def last_forward_rows(self) -> int | None:
        """Rows of the forward that served this thread's last call."""
        return getattr(self._local, "rows", None)

    def reset(self) -> None:
        """Reset the inner policy before a run of episodes where no other caller's are under way: before the
        first, and before each while one caller is left. Concurrent instances would clear each other's
        state mid-episode, so theirs are skipped: per-episode state belongs keyed on ``batch.episodes``."""
        with self._cond:
            first, self._reset_before = not self._reset_before, True
            alone = self._expected <= 1
        if first or alone:
            self.policy.reset()

    # -- the seam --------------------------------------------------------------------------------------

    def infer(self, batch: PolicyBatch) -> Actions:
        call = _Call(batch=batch, arrived=time.monotonic())
        caller_deadline: float | None = getattr(self._local, "deadline", None)
        with self._cond:
            self._pending.append(call)
            self._cond.notify_all()
            while not call.done:
                forward_deadline = None if call.started is None else call.started + self.forward_timeout_s
                self._raise_if_late(call, forward_deadline, caller_deadline)
                if not call.claimed:
                    ready, timed_out = self._ready()
                    if ready:  # this thread flushes; the forward runs on the model's worker thread
                        waiting = len(self._pending)
                        idle_sims = waiting if waiting >= self._expected and self.across_callers else 0
                        self.stats.timer_flushes += int(timed_out)
                        self._submit(self._take(), idle_sims)
                        continue
                    wait = self._time_left()
                else:
                    wait = None
                limits = [d - time.monotonic() for d in (forward_deadline, caller_deadline) if d is not None]
                if wait is not None:
                    limits.append(wait)
                self._cond.wait(timeout=max(0.0, min(limits)) if limits else None)  # woken when a forward starts
        self._local.rows = call.forward_rows
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _raise_if_late(self, call: _Call, forward_deadline: float | None, caller_deadline: float | None) -> None:
        """Give up on ``call`` (condition held) when the run aborted or one of its deadlines passed."""
        now = time.monotonic()
        error: BaseException | None = None
        if self._aborted is not None:
            error = RunAborted(self._aborted)
        elif caller_deadline is not None and now >= caller_deadline:
            seconds: float = getattr(self._local, "deadline_s", 0.0)
            error = RolloutTimeoutError(
                f"rollout_timeout_s={seconds:g} reached while waiting for the policy", deadline_s=seconds
            )
        elif forward_deadline is not None and now >= forward_deadline:
            error = PolicyTimeoutError(
                f"the policy forward did not return within forward_timeout_s={self.forward_timeout_s:g}",
                deadline_s=self.forward_timeout_s,
            )
        if error is None:
            return
        if call in self._pending:
            self._pending.remove(call)
        call.abandoned = True
        if call in self._running and isinstance(error, PolicyTimeoutError):
            self._replace_worker()  # the next forwards must not queue behind the one that is stuck
            self.policy.abandon()  # nor wait for what it holds (a remote policy's connection)
        raise error

    def _replace_worker(self) -> None:
        """Leave the stuck forward to its thread and serve the queue from a fresh one (condition held)."""
        self._generation += 1
        self._running = []
        stuck, self._work = self._work, queue.SimpleQueue()
        with contextlib.suppress(queue.Empty):
            while True:  # the forwards queued behind the stuck one go to the fresh worker
                self._work.put(stuck.get_nowait())
        stuck.put(None)  # ends the stuck worker if its forward ever returns to an empty queue
        self._start_worker()

    def _submit(self, calls: list[_Call], idle_sims: int) -> None:
        """Queue one forward for the worker thread (condition held); the worker starts on first use."""
        self._work.put((calls, idle_sims))
        if self._worker is None:
            self._start_worker()

    def _start_worker(self) -> None:
        generation = self._generation
        self._worker = threading.Thread(
            target=self._work_loop,
            args=(generation, self._work),
            name=f"hud-policy-forward-{generation}",
            daemon=True,
        )
        self._worker.start()

    def _work_loop(self, generation: int, work: WorkQueue) -> None:
        """Run queued forwards one at a time (a daemon: an abandoned forward never blocks exit).

        A worker whose forward was abandoned stops when that forward returns, without touching the
        queue again: forwards of the current worker never overlap with another of its own.
        """
        while True:
            item = work.get()
            if item is None:  # closed: its queue ends here
                return
            calls, idle_sims = item
            with self._cond:
                if generation != self._generation:  # replaced while it waited: hand the work on
                    self._work.put(item)
                    return
                wanted = [c for c in calls if not c.abandoned]
                self._running = wanted
                started = time.monotonic()
                for call in wanted:  # each caller's deadline runs from its own forward's start
                    call.started = started
                self._cond.notify_all()
            if wanted:
                self._forward(wanted, idle_sims)
            with self._cond:
                if generation != self._generation:
                    return
                self._running = []

    # -- internals (called with the condition held) --------------------------------------------------

    def _ready(self) -> tuple[bool, bool]:
        """Whether the pending calls should be flushed now, and whether the timer decided it."""
        if not self._pending:
            return False, False
        if not self.across_callers or len(self._pending) >= self._expected:
            return True, False
        if self.batch_size is not None and sum(c.batch.size for c in self._pending) >= self.batch_size:
            return True, False
        if time.monotonic() - self._pending[0].arrived >= self.max_wait_s:
            return True, True
        return False, False

    def _time_left(self) -> float | None:
        if not self._pending:
            return None
        return max(0.0, self._pending[0].arrived + self.max_wait_s - time.monotonic())

    def _take(self) -> list[_Call]:
        """Claim the oldest pending calls, up to ``batch_size`` rows (at least one call)."""
        taken: list[_Call] = []
        rows = 0
        while self._pending:
            size = self._pending[0].batch.size
            if taken and self.batch_size is not None and rows + size > self.batch_size:
                break
            call = self._pending.pop(0)
            call.claimed = True
            taken.append(call)
            rows += size
            if not self.across_callers:
                break
        return taken

    def _forward(self, calls: list[_Call], idle_sims: int) -> None:
        """Run one forward for ``calls`` (outside the condition) and hand every caller its rows.

        ``idle_sims`` > 0 says every expected caller is waiting, so that many sims are idle. When the policy's
        own code raised on the rows of several callers, each caller's call goes back to the queue as a forward
        of its own (its ``forward_timeout_s`` counting from that forward's start, a caller that gave up left
        out): one caller's bad row fails that caller alone (its loop then finds the row).
        """
        rows = sum(c.batch.size for c in calls)
        started = time.perf_counter()
        error = self._attempt(calls, idle_sims, rows)
        forward_s = time.perf_counter() - started
        apart = error is not None and len(calls) > 1 and raised_by_its_rows(error)
        with self._cond:
            self.stats.forwards.add(rows, forward_s)
            self.stats.lockstep_forwards += int(idle_sims > 0)
            self.stats.calls += 0 if apart else len(calls)
            for call in calls:
                if apart:
                    call.started = None
                    self._work.put(([call], 0))  # the current worker's queue, after what is queued already
                    continue
                call.error = error
                call.forward_rows = rows
                call.done = True
            self._cond.notify_all()

    def _attempt(self, calls: list[_Call], idle_sims: int, rows: int) -> BaseException | None:
        """One forward of the ``rows`` stacked rows of ``calls``, each handed its rows; what it raised, if it did."""
        try:
            stacked = PolicyBatch.concat([c.batch for c in calls])
            with self.policy.lockstep(idle_sims) if idle_sims else contextlib.nullcontext():
                answer = self.policy.infer(stacked)
            actions = action_array(answer, source="the batched policy", expected=f"[{rows}, T, A] for {rows} rows")
            if actions.ndim not in (2, 3) or actions.shape[0] != rows:
                expected = f"for {rows} stacked rows; expected [{rows}, T, A]"
                raise PolicyShapeError(f"the batched policy returned {list(actions.shape)} {expected}")
        except BaseException as exc:
            return exc
        offset = 0
        for call in calls:
            call.result = actions[offset : offset + call.batch.size]
            offset += call.batch.size
        return None
