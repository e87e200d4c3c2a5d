"""SIGTERM as an interrupt, held back while the main thread holds what the writer threads share."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from hud_pipelines.dataset.cancel import Terminated, signals_deferred, sigterm_interrupts


@pytest.fixture(autouse=True)
def default_sigterm() -> Iterator[None]:
    """SIGTERM at its default, as in a fresh process (an earlier in-process Dagster run leaves its own)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def terminate_and_wait() -> None:
    """Send this process SIGTERM and give its handler the bytecodes to run on (it runs at the next ones)."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):
        pass


def test_a_sigterm_raises_terminated_in_the_main_thread() -> None:
    with sigterm_interrupts() as installed:
        assert installed
        with pytest.raises(Terminated, match="SIGTERM"):
            terminate_and_wait()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_someone_else_installed_is_left_alone() -> None:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with sigterm_interrupts() as installed:
        assert not installed
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler


def test_a_sigterm_inside_a_deferred_block_is_raised_when_the_block_is_left() -> None:
    lock = threading.Lock()
    reached: list[str] = []

    def hold_the_lock_through_a_sigterm() -> None:
        with signals_deferred(), lock:
            terminate_and_wait()
            reached.append("end of the block")
        reached.append("after the block")

    with sigterm_interrupts(), pytest.raises(Terminated):
        hold_the_lock_through_a_sigterm()
    assert reached == ["end of the block"]
    assert not lock.locked(), "the lock taken in the block was released before the interrupt"


def test_nested_deferred_blocks_raise_once_the_outermost_is_left() -> None:
    reached: list[str] = []

    def nested() -> None:
        with signals_deferred():
            with signals_deferred():
                terminate_and_wait()
            reached.append("between the blocks")

    with sigterm_interrupts(), pytest.raises(Terminated):
        nested()
    assert reached == ["between the blocks"]
    with signals_deferred():  # nothing is left pending afterwards
        reached.append("a later block")
    assert reached[-1] == "a later block"


def test_other_threads_run_a_deferred_block_as_it_is() -> None:
    ran: list[bool] = []

    def work() -> None:
        with signals_deferred():
            ran.append(True)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert ran == [True]
