"""Cap glibc's malloc arenas in a process that writes datasets, so what its threads leave behind stays bounded.

glibc hands a thread that finds the arenas in use a new one, up to eight per core, and an arena
keeps most of the memory its threads ever freed. Writing a dataset starts threads all the time: a
writer per shard (one per instance), PyAV's encoder threads per episode video, pyarrow's pool.
Measured in an eval's process (``bench/memory.md``): RSS grew with every instance until all 16
arenas of a 2-core machine existed, ~45 MiB at 100-step camera episodes, while the number of Python
objects stayed put; ``malloc_trim`` gave little of it back. With at most
:data:`DEFAULT_MAX_ARENAS` arenas the same eval stays flat: later threads share the arenas that
exist. The cap is the process's (glibc has one ``M_ARENA_MAX``), it is set once, and a
``MALLOC_ARENA_MAX`` in the environment, glibc's own switch, is left to win.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_ARENA_MAX = -8
"""``mallopt``'s parameter number of ``M_ARENA_MAX`` (glibc's ``malloc.h``)."""
DEFAULT_MAX_ARENAS = 2
"""The main arena and one shared by every other thread: the fewest that still lets two threads allocate at once."""
ENVIRONMENT = "MALLOC_ARENA_MAX"

_lock = threading.Lock()
_capped: list[int] = []
"""The cap set in this process (empty until set)."""


def cap_malloc_arenas(limit: int = DEFAULT_MAX_ARENAS) -> int | None:
    """Set glibc's ``M_ARENA_MAX`` once per process; the cap in force, or ``None`` where it is not ours to set.

    ``None`` off glibc, or when ``MALLOC_ARENA_MAX`` is in the environment (glibc applied that at
    start-up). Arenas that exist already stay; no thread gets a new one beyond the cap.
    """
    if limit < 1:
        raise ValueError(f"an arena cap must be at least 1, not {limit}")
    with _lock:
        if _capped:
            return _capped[0]
        if os.environ.get(ENVIRONMENT) or platform.libc_ver()[0] != "glibc":
            return None
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        if mallopt(M_ARENA_MAX, limit) != 1:
            return None
        _capped.append(limit)
        return limit
