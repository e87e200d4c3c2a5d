"""SIGTERM as an interrupt, so a terminated writer still runs its ``finally`` blocks and finalizes.

Python's default SIGTERM kills the process on the spot: no ``finally``, no context-manager exit, no
``finalize()``. While :func:`sigterm_interrupts` is active, SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``, so ``except Exception`` does not swallow it) in the main thread instead. A
handler someone else installed (Dagster installs its own for run cancellation) is left alone.

An exception raised from a signal handler can land between any two bytecodes, also inside a
``threading.Lock`` or ``queue.Queue`` call that then never releases what it took: the writer
threads and the closing sink would wait on it forever. Code that takes what writer threads share
runs under :func:`signals_deferred`, which holds the interrupt back until the block is left.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


class _Deferral:
    """The main thread's open :func:`signals_deferred` blocks and the interrupt they hold back."""

    depth = 0
    pending: str | None = None


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    message = f"received signal {signal.Signals(signum).name}"
    if _Deferral.depth:
        _Deferral.pending = message
        return
    _Deferral.pending = None  # raised now: nothing is left for a later block to raise again
    raise Terminated(message)


@contextmanager
def signals_deferred() -> Generator[None]:
    """Run the block whole: a SIGTERM that arrives in it raises :class:`Terminated` once it is left.

    Only the main thread takes signals, so other threads run the block as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Deferral.depth += 1
    try:
        yield
    finally:
        _Deferral.depth -= 1
        if not _Deferral.depth and _Deferral.pending is not None:
            message, _Deferral.pending = _Deferral.pending, None
            raise Terminated(message)


@contextmanager
def sigterm_interrupts() -> Generator[bool]:
    """Yields whether the handler was installed (only from the main thread, over the default)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield False
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)
