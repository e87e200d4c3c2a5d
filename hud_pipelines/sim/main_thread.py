"""The sim's main thread as a job queue: every sim touch runs there, in arrival order.

Sims such as MuJoCo with EGL, Isaac/Omniverse Kit and pygame insist on owning the main thread, so
the main thread runs :meth:`MainThreadExecutor.run_forever` and nothing else: it blocks on a queue
(no sleep-polling) and runs each job (build, reset, step, result, close) as it arrives. An optional
idle hook runs between jobs, at most every ``idle_interval_s`` (where a Kit-style app is pumped).
It is apart from the WebSocket server because it is the part every way of serving shares: the
threads that read connections only post jobs to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hud_pipelines.errors import SimShuttingDown

T = TypeVar("T")


class MainThreadExecutor:
    """A blocking job queue drained by the thread that calls :meth:`run_forever`."""

    def __init__(self, idle_hook: Callable[[], None] | None = None, idle_interval_s: float = 0.01) -> None:
        self._queue: queue.SimpleQueue[_Posted | _Job | _Signalled | None] = queue.SimpleQueue()
        self.idle_hook = idle_hook
        """Run between jobs, at most every ``idle_interval_s`` (also while no job arrives)."""
        self.idle_interval_s = idle_interval_s
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn`` for the main thread; safe to call from any thread."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                future.set_exception(SimShuttingDown("the sim is shutting down"))
            else:
                self._queue.put((fn, future))
        return future

    def post(self, fn: Callable[[], object], on_failure: Callable[[BaseException], None]) -> None:
        """Queue ``fn`` for the main thread without a future, for a caller that does not wait for it.

        The cheapest hand-off (a served request takes this path): nothing to resolve afterwards.
        ``on_failure`` hears what ``fn`` raised, or :class:`SimShuttingDown` when it never ran.
        """
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.put(_Posted(fn, on_failure))
        if closed:
            on_failure(SimShuttingDown("the sim is shutting down"))

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the main thread and await its result from an asyncio loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def stop(self) -> None:
        """Make :meth:`run_forever` return after the jobs queued so far (safe in a signal handler)."""
        self._queue.put(None)

    def close(self) -> None:
        """Refuse new jobs and fail the queued ones (the main thread no longer serves them)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Posted):
                    item.on_failure(SimShuttingDown("the sim is shutting down"))
                elif isinstance(item, tuple):
                    item[1].set_exception(SimShuttingDown("the sim is shutting down"))

    def run_forever(self) -> None:
        """Run queued jobs until :meth:`stop`; call this on the main thread.

        Without an idle hook the thread blocks on the queue with no timeout at all.
        """
        self._drain()

    def _drain(self) -> None:
        next_idle = time.monotonic()
        while True:
            hook = self.idle_hook
            if hook is None:
                item = self._queue.get()
            else:
                now = time.monotonic()
                if now >= next_idle:
                    hook()
                    next_idle = time.monotonic() + self.idle_interval_s
                try:
                    item = self._queue.get(timeout=max(0.0, next_idle - time.monotonic()))
                except queue.Empty:
                    continue
            if isinstance(item, _Posted):
                item.run()
                continue
            if item is None:
                return
            if isinstance(item, _Signalled):
                signal.pthread_sigmask(signal.SIG_BLOCK, ())  # runs the Python handlers of signals caught so far
                continue
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # a shutdown signal mid-job must still release the waiter
                future.set_exception(exc if isinstance(exc, Exception) else SimShuttingDown(repr(exc)))
                if not isinstance(exc, Exception):
                    raise

    def wake_for_signals(self) -> None:
        """Make the main thread run the Python handlers of the signals caught so far (from any thread).

        Python runs signal handlers on the main thread only, when it next executes bytecode; a
        signal that arrives while another thread runs Python code can leave the main thread asleep
        in the queue with its handler still pending (a SIGTERM that never stops the sim). The
        server's accepting thread watches the signal wake-up descriptor and calls this.
        """
        self._queue.put(_SIGNALLED)


class _Posted:
    """A job queued with :meth:`MainThreadExecutor.post`: no future, a failure hook instead."""

    __slots__ = ("fn", "on_failure")

    def __init__(self, fn: Callable[[], object], on_failure: Callable[[BaseException], None]) -> None:
        self.fn = fn
        self.on_failure = on_failure

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # a shutdown signal mid-job must still be heard, then propagate
            self.on_failure(exc if isinstance(exc, Exception) else SimShuttingDown(repr(exc)))
            if not isinstance(exc, Exception):
                raise


class _Signalled:
    """The queue item that makes the main thread run the Python handlers of the signals caught so far."""


_SIGNALLED = _Signalled()
_Job = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]
