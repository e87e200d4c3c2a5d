"""Free heap pages go back to the system between instances (glibc's malloc_trim)."""

from __future__ import annotations

import gc
import platform
from pathlib import Path

import pytest

from hud_pipelines.eval.heap import release_free_heap


def resident_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_buffers_leave_the_process_once_the_heap_is_released() -> None:
    chunks = [bytearray(3000) for _ in range(60_000)]  # ~180 MiB of heap chunks, below the mmap threshold
    kept = chunks[::50]  # a few survivors keep the heap from shrinking from its top on its own
    grown = resident_mib()
    del chunks
    gc.collect()
    freed = resident_mib()
    assert freed > grown - 50, "glibc keeps freed chunks on its free lists"
    assert release_free_heap()
    assert resident_mib() < freed - 100
    assert len(kept) == 1200
