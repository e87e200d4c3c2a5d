"""A process that writes a dataset caps glibc's malloc arenas, so its threads share a bounded number of them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from hud_pipelines.dataset import writer
from hud_pipelines.dataset.arenas import DEFAULT_MAX_ARENAS, ENVIRONMENT
from tests.dataset.support import SPEC, write_episodes

REPO = Path(__file__).resolve().parents[2]
THREADS = 12
"""Threads alive at once, each allocating: uncapped, glibc gives each its own arena (up to 8 per core)."""

ARENAS_AFTER_THREADS = f"""
import ctypes, sys, tempfile, threading
from pathlib import Path
from hud_pipelines.dataset.arenas import cap_malloc_arenas

print(cap_malloc_arenas() if sys.argv[1] == "cap" else None)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
together = threading.Barrier({THREADS})

def allocate():
    libc.malloc(4096)
    together.wait()

threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
report = Path(tempfile.mkdtemp()) / "malloc_info.xml"
stream = libc.fopen(str(report).encode(), b"w")
libc.malloc_info(0, stream)
libc.fclose(stream)
print(report.read_text().count("<heap nr="))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")


def arenas_after_threads(mode: str, **env: str) -> tuple[str, int]:
    """In a fresh process: the cap set (``None`` when not) and the arenas after ``THREADS`` threads allocated."""
    environment = {k: v for k, v in os.environ.items() if k != ENVIRONMENT} | {"PYTHONPATH": str(REPO)} | env
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_AFTER_THREADS, mode],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
        timeout=60,
    )
    cap, arenas = done.stdout.split()
    return cap, int(arenas)


@glibc_only
def test_capped_threads_share_the_arenas() -> None:
    assert arenas_after_threads("cap") == (str(DEFAULT_MAX_ARENAS), DEFAULT_MAX_ARENAS)
    _, uncapped = arenas_after_threads("none")
    assert uncapped > DEFAULT_MAX_ARENAS  # what the cap prevents: an arena per thread


@glibc_only
def test_malloc_arena_max_in_the_environment_wins() -> None:
    assert arenas_after_threads("cap", **{ENVIRONMENT: "3"}) == ("None", 3)


def test_a_dataset_sink_caps_the_arenas_before_its_writers_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(writer, "cap_malloc_arenas", lambda: calls.append(len(writer.threading.enumerate())))
    threads_before = len(writer.threading.enumerate())
    with writer.LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        write_episodes(sink, 1)
    assert calls == [threads_before]
