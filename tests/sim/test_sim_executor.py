"""The main-thread executor: every sim touch runs on the thread that serves, in order, without polling."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hud_pipelines.errors import SimShuttingDown
from hud_pipelines.sim.server import MainThreadExecutor


def test_jobs_run_in_order_on_the_serving_thread_and_stop_returns() -> None:
    executor = MainThreadExecutor()
    ran_on: list[tuple[int, str]] = []

    def job(index: int) -> int:
        ran_on.append((index, threading.current_thread().name))
        return index * 10

    futures = [executor.submit(lambda i=i: job(i)) for i in range(5)]
    executor.stop()
    executor.run_forever()  # returns after the jobs queued before stop()
    assert [f.result(timeout=1) for f in futures] == [0, 10, 20, 30, 40]
    assert ran_on == [(i, threading.current_thread().name) for i in range(5)]


def test_jobs_from_an_asyncio_thread_are_awaited() -> None:
    executor = MainThreadExecutor()
    results: list[object] = []

    async def client() -> None:
        results.append(await executor.run(lambda: threading.current_thread() is threading.main_thread()))
        try:
            await executor.run(lambda: 1 / 0)
        except ZeroDivisionError as exc:
            results.append(type(exc).__name__)
        executor.stop()

    thread = threading.Thread(target=lambda: asyncio.run(client()))
    thread.start()
    executor.run_forever()
    thread.join(timeout=5)
    assert results == [True, "ZeroDivisionError"]


def test_without_an_idle_hook_the_thread_blocks_without_polling() -> None:
    executor = MainThreadExecutor()
    worker = threading.Thread(target=executor.run_forever)
    started = time.thread_time()
    worker.start()
    time.sleep(0.3)
    executor.stop()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert time.thread_time() - started < 0.1  # this thread only slept; the worker blocked in the queue


def test_the_idle_hook_runs_while_idle_and_between_busy_jobs() -> None:
    calls: list[float] = []
    executor = MainThreadExecutor(idle_hook=lambda: calls.append(time.monotonic()), idle_interval_s=0.01)
    worker = threading.Thread(target=executor.run_forever)
    worker.start()
    time.sleep(0.2)
    idle_calls = len(calls)
    for _ in range(30):  # a steady stream of 5 ms jobs must not starve the hook
        executor.submit(lambda: time.sleep(0.005))
    executor.submit(lambda: None).result(timeout=5)
    executor.stop()
    worker.join(timeout=5)
    assert idle_calls >= 5
    assert len(calls) - idle_calls >= 5


def test_close_fails_queued_and_later_jobs() -> None:
    executor = MainThreadExecutor()
    queued = executor.submit(lambda: "never")
    executor.close()
    with pytest.raises(SimShuttingDown):
        queued.result(timeout=1)
    with pytest.raises(SimShuttingDown):
        executor.submit(lambda: "late").result(timeout=1)


def test_an_interrupt_in_a_job_releases_its_waiter_and_propagates() -> None:
    executor = MainThreadExecutor()

    def interrupted() -> None:
        raise KeyboardInterrupt

    future = executor.submit(interrupted)
    with pytest.raises(KeyboardInterrupt):
        executor.run_forever()
    with pytest.raises(SimShuttingDown, match="KeyboardInterrupt"):
        future.result(timeout=1)
