"""A recording sink that does its work on a thread of its own while the agent loop waits on its sim.

A served tick is mostly waiting: the agent sends its actions and blocks until the sim's reply. Formatting
a tick's trace lines (every slot's observation, action, reward and inference) is CPU work the loop
otherwise does between two waits, on the critical path of every tick; done on another thread, it runs
while the loop waits (measured in ``bench/hud_peer.md``). :class:`InBackground` queues a sink's calls in
order and makes them on its thread; a call arriving while nothing is queued and too small to be worth
a hand-off (a tick of few slots, an episode's begin or end) is made at once, in order all the same.

A batch handed to a sink is the sink's: the agent loop hands each tick arrays of its own, never a buffer
it writes again (the dataset writer keeps a tick's rows until its episode ends, the trace writer's video
encoder until it encodes them), so nothing is copied here. What waits is bounded in calls and in bytes
(:data:`QUEUED_CALLS`, :data:`QUEUED_BYTES`): a few ticks of cameras, never a run's worth. The sink's
first exception stops the forwarding and is raised to the caller at its next call, or at
:meth:`InBackground.close`, which waits for the queued calls and then closes the sink on the caller's
thread, whatever happened to them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, FrameBatch, InferenceBatch

HAND_OFF_ROWS = 8
"""Rows from which a batch is handed to the thread: below, waking it costs about what the work does."""
QUEUED_CALLS = 64
"""Calls waiting at most; the caller waits beyond. Fewer cost throughput: at 4 the loop waited on the thread
whenever a tick's lines took longer than usual (``bench/hud_peer.md``)."""
QUEUED_BYTES = 64 * 2**20
"""The arrays of waiting batches at most (a tick of 32 slots of two 480x640 cameras is 56 MiB): a sink slower
than the loop (a camera's video on a slow disk) holds about this, however many calls it is."""

Call = tuple[Callable[..., None], tuple[Any, ...], int]
"""A call for the thread, its arguments, and the bytes of the arrays they hold."""


class InBackground:
    """``sink``'s calls made in order on a thread of its own (see the module docstring). Its caller is one thread, as
    an instance's agent loop is: a call is made at once only when that caller has nothing queued."""

    def __init__(self, sink: EpisodeSink, *, hand_off_rows: int = HAND_OFF_ROWS) -> None:
        self.sink = sink
        self.hand_off_rows = hand_off_rows
        self._queue: queue.Queue[Call | None] = queue.Queue(maxsize=QUEUED_CALLS)
        """The calls for the thread, in order; ``None`` stops it."""
        self._pending = 0
        """Calls queued or running on the thread: a call is made at once only while there are none."""
        self._queued_bytes = 0
        self._counting = threading.Condition()
        """Guards the two counts; the thread notifies it as it finishes a call (room for the next)."""
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        """Set by the thread as it ends: waited for instead of ``Thread.join``, which an interrupt (a KeyboardInterrupt
        while it waits) leaves believing the thread ended, so the next join returns while it still writes."""

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._submit(self.sink.begin, key, prompt)

    def add_frames(self, batch: FrameBatch) -> None:
        size = batch.action.nbytes + sum(values.nbytes for values in batch.observation.values())
        if len(batch) < self.hand_off_rows:
            self._submit(self.sink.add_frames, batch, size=size)
        else:
            self._hand_off(self.sink.add_frames, batch, size=size)

    def add_inferences(self, batch: InferenceBatch) -> None:
        if len(batch) < self.hand_off_rows:
            self._submit(self.sink.add_inferences, batch, size=batch.chunk.nbytes)
        else:
            self._hand_off(self.sink.add_inferences, batch, size=batch.chunk.nbytes)

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._submit(self.sink.end, key, outcome)

    def close(self) -> None:
        """Wait for every queued call, then close the sink (a writer finalizes what it wrote, failed or not); the
        sink's first exception, if any, is raised after. The thread is forgotten only once it has ended, so a
        close interrupted while it waits leaves the next close to wait again, never to close under it."""
        try:
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
                self._ended.wait()
                thread.join()
                self._thread = None
        finally:
            if self._thread is None:
                try:
                    self.sink.close()
                finally:
                    self._raise_failure()

    # -- helpers ---------------------------------------------------------------------------------------

    def _submit(self, call: Callable[..., None], *args: Any, size: int = 0) -> None:
        """Make the call now when nothing is queued (the order holds), else queue it behind the others."""
        if self._pending == 0:  # the thread is idle and stays so: only this caller queues work
            self._raise_failure()  # read after the count: the thread records a failure before it counts down
            call(*args)
            return
        self._hand_off(call, *args, size=size)

    def _hand_off(self, call: Callable[..., None], *args: Any, size: int = 0) -> None:
        self._raise_failure()
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="recording", daemon=True)
            self._ended.clear()
            thread.start()  # kept only once it runs: a thread that could not start is never waited for
            self._thread = thread
        with self._counting:
            while self._pending and self._queued_bytes + size > QUEUED_BYTES:
                self._counting.wait()
            self._pending += 1
            self._queued_bytes += size
        self._queue.put((call, args, size))

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                call, args, size = item
                try:
                    if self._failure is None:  # after the first failure, the sink hears nothing more
                        call(*args)
                except BaseException as exc:  # raised to the caller at its next call
                    self._failure = exc
                finally:
                    del item, args  # the batch is let go now, not when the next call comes
                    with self._counting:
                        self._pending -= 1
                        self._queued_bytes -= size
                        self._counting.notify()
        finally:
            self._ended.set()

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            raise failure
