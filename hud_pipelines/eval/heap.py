"""Give the heap's free memory back to the system between instances (glibc's ``malloc_trim``).

An instance churns through frame-sized buffers (observations, trace video, dataset frames through
numpy and PyAV) that glibc keeps on its free lists once they are freed. Those pages stay in the
process, so its peak grew with the number of episodes although no Python object outlived its
instance (``bench/memory.md``: 1.07x at 16x the episodes, Python memory flat). Trimming once an
instance is done returns them: 1.03x at 16x, for one call per instance. Pinning glibc's thresholds
would do the same on every allocation and costs a quarter more CPU on PushT, so it is not done.

Elsewhere than glibc (macOS, musl) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc: no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the heap's free pages to the system; whether there was a ``malloc_trim`` to call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
