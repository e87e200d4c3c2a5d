"""SIGTERM as an interrupt, so a terminated writer still runs its ``finally`` blocks and finalizes.

Python's default SIGTERM kills the process on the spot: no ``finally``, no context-manager exit, no
``finalize()``. While :func:`sigterm_interrupts` is active, SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``, so ``except Exception`` does not swallow it) in the main thread instead. A
handler someone else installed (Dagster installs its own for run cancellation) is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


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
