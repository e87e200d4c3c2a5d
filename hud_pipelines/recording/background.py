"""A recording sink that does its work on a thread of its own while the agent loop waits on its sim.

A served tick is mostly waiting: the agent sends its actions and blocks until the sim's reply. Formatting
a tick's trace lines (every slot's observation, action, reward and inference) is CPU work the loop
otherwise does between two waits, on the critical path of every tick; done on another thread, it runs
while the loop waits (measured in ``bench/hud_peer.md``). :class:`InBackground` queues a sink's calls in
order and makes them on its thread; a call arriving while nothing is queued and too small to be worth
a hand-off (a tick of few slots, an episode's begin or end) is made at once, in order all the same.

A batch is copied before it is queued, so what the sink writes is what the tick held whatever the caller
(a policy that reuses its output array) does with its arrays afterwards. The sink's first exception
stops the forwarding and is raised to the caller at its next call, or at :meth:`InBackground.close`,
which waits for every queued call and then closes the sink on the caller's thread.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any

from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, FrameBatch, InferenceBatch

HAND_OFF_ROWS = 8
"""Rows from which a batch is handed to the thread: below, waking it costs about what the work does."""
QUEUED_CALLS = 64
"""Calls queued at most; the caller waits beyond (a sink slower than the loop holds its memory to this)."""

Call = tuple[Callable[..., None], tuple[Any, ...]]


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
        self._counting = threading.Lock()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._submit(self.sink.begin, key, prompt)

    def add_frames(self, batch: FrameBatch) -> None:
        if len(batch) < self.hand_off_rows:
            self._submit(self.sink.add_frames, batch)
            return
        owned = dataclasses.replace(
            batch,
            keys=list(batch.keys),
            index=batch.index.copy(),
            observation={name: values.copy() for name, values in batch.observation.items()},
            action=batch.action.copy(),
            reward=batch.reward.copy(),
            terminated=batch.terminated.copy(),
            truncated=batch.truncated.copy(),
            success=batch.success.copy(),
        )
        self._hand_off(self.sink.add_frames, owned)

    def add_inferences(self, batch: InferenceBatch) -> None:
        if len(batch) < self.hand_off_rows:
            self._submit(self.sink.add_inferences, batch)
            return
        owned = dataclasses.replace(batch, keys=list(batch.keys), step=batch.step.copy(), chunk=batch.chunk.copy())
        self._hand_off(self.sink.add_inferences, owned)

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._submit(self.sink.end, key, outcome)

    def close(self) -> None:
        """Wait for every queued call, then close the sink (a writer finalizes what it wrote, failed or not); the
        sink's first exception, if any, is raised after."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        try:
            self.sink.close()
        finally:
            self._raise_failure()

    # -- helpers ---------------------------------------------------------------------------------------

    def _submit(self, call: Callable[..., None], *args: Any) -> None:
        """Make the call now when nothing is queued (the order holds), else queue it behind the others."""
        self._raise_failure()
        if self._pending == 0:  # the thread is idle and stays so: only this caller queues work
            call(*args)
            return
        self._hand_off(call, *args)

    def _hand_off(self, call: Callable[..., None], *args: Any) -> None:
        self._raise_failure()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="recording", daemon=True)
            self._thread.start()
        with self._counting:
            self._pending += 1
        self._queue.put((call, args))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            call, args = item
            try:
                if self._failure is None:  # after the first failure, the sink hears nothing more
                    call(*args)
            except BaseException as exc:  # raised to the caller at its next call
                self._failure = exc
            finally:
                with self._counting:
                    self._pending -= 1

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            raise failure
