"""The main-thread executor: every sim touch runs on the thread that serves, in order, without polling."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable

import pytest

from hud_pipelines.errors import SimShuttingDown
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.connection import Connection
from hud_pipelines.sim.main_thread import MainThreadExecutor
from hud_pipelines.sim.server import SimServer


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
    deadline = time.monotonic() + 5.0  # a loaded machine may take its time; an idle executor calls it soon
    while len(calls) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
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


def driven_from_a_thread(executor: MainThreadExecutor, port: int, drive: Callable[[SimClient], None]) -> None:
    """Run ``drive`` with a client of the server at ``port`` on a thread of its own while this (main) thread serves
    the sim, until it is done."""

    def client_main() -> None:
        try:
            with SimClient(f"ws://127.0.0.1:{port}", "secret", step_timeout_s=10) as client:
                drive(client)
        finally:
            executor.stop()

    client_thread = threading.Thread(target=client_main)
    client_thread.start()
    executor.run_forever()
    client_thread.join(timeout=10)


def test_replies_leave_from_the_thread_that_runs_the_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    """One hand-off per request: the serving thread queues it, the sim's thread steps and sends the reply itself."""
    senders: list[str] = []
    send_message = Connection.send_message

    def spy(connection: Connection, data: bytes) -> None:
        senders.append(threading.current_thread().name)
        send_message(connection, data)

    monkeypatch.setattr(Connection, "send_message", spy)
    executor = MainThreadExecutor()
    with GymBridge("CartPole-v1") as bridge:
        sim = SimServer(bridge, executor, token="secret")
        port = sim.start()
        statuses: list[list[str]] = []

        def drive(client: SimClient) -> None:
            statuses.append(client.reset({"seed": 0}).status)
            statuses.append(client.step([[1]]).status)

        driven_from_a_thread(executor, port, drive)
        sim.stop()
    assert statuses == [["running"], ["running"]]
    assert senders[:3] == [threading.current_thread().name] * 3  # hello, reset, step
    assert set(senders) == {threading.current_thread().name}


def test_a_signal_taken_by_another_thread_still_runs_its_handler_on_the_main_thread() -> None:
    """A SIGTERM that lands on another thread must still stop a serving main thread asleep in the queue."""
    executor = MainThreadExecutor()
    handled_on: list[str] = []

    def handler(signum: int, frame: object) -> None:
        handled_on.append(threading.current_thread().name)
        executor.stop()

    fallback: list[bool] = []
    stopped = threading.Event()

    def signal_from_here() -> None:
        time.sleep(0.2)  # the main thread is asleep in the queue by now
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # this thread takes it, not the main one
        if not stopped.wait(5):
            fallback.append(True)
            executor.stop()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with GymBridge("CartPole-v1") as bridge:
            sim = SimServer(bridge, executor, token="secret")
            sim.start()
            sender = threading.Thread(target=signal_from_here)
            sender.start()
            executor.run_forever()
            stopped.set()
            sender.join(timeout=10)
            sim.stop()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not fallback
    assert handled_on == [threading.main_thread().name]


def test_posted_jobs_run_in_order_and_their_failures_reach_the_hook() -> None:
    executor = MainThreadExecutor()
    ran: list[int] = []
    failures: list[str] = []

    def fail() -> None:
        raise ZeroDivisionError("posted")

    executor.post(lambda: ran.append(1), lambda exc: failures.append(repr(exc)))
    executor.post(fail, lambda exc: failures.append(repr(exc)))
    executor.post(lambda: ran.append(2), lambda exc: failures.append(repr(exc)))
    executor.stop()
    executor.run_forever()
    assert ran == [1, 2]
    assert failures == ["ZeroDivisionError('posted')"]
    executor.post(lambda: ran.append(3), lambda exc: failures.append(type(exc).__name__))  # queued, never run
    executor.close()
    executor.post(lambda: ran.append(4), lambda exc: failures.append(type(exc).__name__))  # refused
    assert ran == [1, 2]
    assert failures[1:] == ["SimShuttingDown", "SimShuttingDown"]
