"""A real Redis and real Celery workers for the scale-out tests, each a subprocess that is always stopped.

``redis_server`` starts Debian's ``redis-server`` on 127.0.0.1 on a free port with its files in a
temporary folder; ``celery_workers`` starts ``celery -A hud_pipelines.dagster.worker worker --pool
solo`` processes for a deployment file and waits until each one is ready. Both stop what they
started (SIGTERM, then SIGKILL) however the test ends, and ``alive`` tells whether a process is still
there, so a test can check that nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dagster.support import REPO

REDIS = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS is None and not os.environ.get("CI"),  # CI installs it (scripts/setup): there a missing one fails
    reason="redis-server is not installed (scripts/setup installs it: apt-get install redis-server)",
)
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (say, a test broker's port)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _stop(process: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A Redis on 127.0.0.1 (a free port, files in ``directory``, nothing saved); yields its URL and process."""
    import redis

    if REDIS is None:
        raise RuntimeError("redis-server is not installed; scripts/setup installs it (apt-get install redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    command += ["--appendonly", "no", "--protected-mode", "yes"]
    log = (directory / "redis.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis.from_url(url)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {(directory / 'redis.log').read_text()}") from None
                time.sleep(0.05)
        client.close()
        yield url, process
    finally:
        _stop(process)
        log.close()


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def celery_workers(
    deployment: Path, names: Sequence[str], logs: Path, *, queues: Sequence[str] | None = None
) -> Iterator[list[Worker]]:
    """Solo-pool workers of ``hud_pipelines.dagster.worker`` for ``deployment``, ready when yielded.

    ``queues`` gives each worker its comma-separated queues (default: every worker on ``cpu``)."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HUD_PIPELINES_DEPLOYMENT": str(deployment),
        "HF_HUB_OFFLINE": "1",
    }
    workers: list[Worker] = []
    try:
        for name, listens in zip(names, queues or ["cpu"] * len(names), strict=True):
            log = logs / f"{name}.log"
            command = [sys.executable, "-m", "celery", "-A", "hud_pipelines.dagster.worker", "worker"]
            command += ["--pool", "solo", "--queues", listens, "--hostname", f"{name}@%h", "--loglevel", "INFO"]
            command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--logfile", str(log)]
            process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            workers.append(Worker(name, process, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        for worker in workers:
            while not (worker.log.is_file() and " ready." in worker.log.read_text(errors="replace")):
                if worker.process.poll() is not None or time.monotonic() > deadline:
                    text = worker.log.read_text(errors="replace") if worker.log.is_file() else "(no log)"
                    raise RuntimeError(f"celery worker {worker.name} did not become ready:\n{text[-3000:]}")
                time.sleep(0.1)
        yield workers
    finally:
        for worker in workers:
            _stop(worker.process)


@dataclass
class RestartableRedis:
    """A test Redis that a test can SIGKILL and start again on the same port and folder (nothing saved)."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start ``redis-server`` on the port and wait until it answers (a fresh one: no data)."""
        import redis

        if REDIS is None:
            raise RuntimeError(
                "redis-server is not installed; scripts/setup installs it (apt-get install redis-server)"
            )
        command = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        command += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
        with (self.directory / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis.from_url(self.url, retry=None)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        log_text = (self.directory / "redis.log").read_text()
                        raise RuntimeError(f"redis-server did not start: {log_text}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, nothing saved) and wait until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """SIGKILL the server and start a fresh one on the same port and folder: its queues and keys are gone."""
        self.kill()
        self.start()


@contextlib.contextmanager
def restartable_redis(directory: Path) -> Iterator[RestartableRedis]:
    """A :class:`RestartableRedis` on a free port, started; whichever server runs at the end is stopped."""
    directory.mkdir(parents=True, exist_ok=True)
    server = RestartableRedis(directory, free_port())
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            _stop(server.process)
