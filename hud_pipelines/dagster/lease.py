"""Leases in Redis: how a run tells a Celery worker that died from one that is still busy with its step.

A worker that is killed (SIGKILL, the OOM killer, a lost machine) reports nothing: with Celery's
early acknowledgement its task is simply gone, and a run waiting on the task's result would wait
forever. So while a worker runs a step, the step holds a *lease*: a Redis key with a time to live.
The run that submitted the step reads the key on every tick of its loop; a step whose lease is gone
before its result came is *lost*, and the run decides what follows (another attempt, or a failure).

The lease is kept by a small *keeper* process beside each worker (``python -m
hud_pipelines.dagster.lease``), not by a thread of the worker: a step may hold the worker's GIL for
a long while (an import, a long C call), and a busy worker must never look dead. The worker takes
the lease itself before the step starts and tells the keeper over a pipe to renew it; the keeper
renews every lease it holds a few times per period and gives it up when the worker says the step
ended. When the worker dies, the pipe closes and the keeper deletes the leases it held at once, so
the run sees the loss within a tick; when the whole machine is lost, the leases expire after
``lease_s``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from typing import IO

import redis

LEASE_PREFIX = "hud-pipelines:lease:"
RENEWALS_PER_PERIOD = 4
"""How many times the keeper renews a lease per ``ttl_s``: a late renewal or two never loses it."""


def lease_url(broker: str, backend: str | None) -> str:
    """The Redis the leases live in: the result backend when it is a Redis, else the broker."""
    return backend if backend and backend.startswith(("redis://", "rediss://")) else broker


def lease_key(task_id: str) -> str:
    """The Redis key of the lease of the Celery task ``task_id``."""
    return f"{LEASE_PREFIX}{task_id}"


def lease_holder(client: redis.Redis, task_id: str) -> str | None:
    """Who holds the lease of ``task_id`` (the worker and its process), or None when nobody does."""
    value = client.get(lease_key(task_id))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class LeaseKeeper:
    """The worker's side: takes a step's lease and has its keeper process renew it until the step ends."""

    def __init__(self, url: str, *, ttl_s: float) -> None:
        self._url = url
        self._ttl_s = ttl_s
        self._client = redis.Redis.from_url(url)
        self._keeper: subprocess.Popen[str] | None = None

    def hold(self, task_id: str, owner: str) -> None:
        """Take the lease of ``task_id`` now (before the step starts), then have the keeper renew it."""
        self._client.set(lease_key(task_id), owner, px=_ms(self._ttl_s))
        self._tell(f"hold {task_id} {owner}")

    def release(self, task_id: str) -> None:
        """The step ended, whatever its outcome: the keeper gives its lease up."""
        self._tell(f"release {task_id}")

    def close(self) -> None:
        """Stop the keeper (it gives up every lease it still holds)."""
        if self._keeper is not None and self._keeper.stdin is not None:
            with contextlib.suppress(OSError):
                self._keeper.stdin.close()
            self._keeper.wait(timeout=10)
        self._keeper = None
        self._client.close()

    def _tell(self, line: str) -> None:
        for _ in range(2):  # a keeper that died is started again once
            pipe = self._pipe()
            try:
                pipe.write(line + "\n")
                pipe.flush()
                return
            except OSError:
                self._keeper = None

    def _pipe(self) -> IO[str]:
        if self._keeper is None or self._keeper.poll() is not None:
            command = [sys.executable, "-m", __name__, self._url, repr(self._ttl_s)]
            self._keeper = subprocess.Popen(command, stdin=subprocess.PIPE, text=True)
        assert self._keeper.stdin is not None
        return self._keeper.stdin


def keep(url: str, ttl_s: float, commands: IO[str]) -> None:
    """The keeper: renew the leases ``commands`` hold until released; at end of input, drop them all."""
    client = redis.Redis.from_url(url)
    held: dict[str, str] = {}
    lock = threading.Lock()
    stopped = threading.Event()

    def renew() -> None:
        while not stopped.wait(ttl_s / RENEWALS_PER_PERIOD):
            with lock:
                leases = dict(held)
            for key, owner in leases.items():
                # A broker that is briefly unreachable must not end the keeper; the run sees the lease
                # expire only if the outage outlasts it.
                with contextlib.suppress(redis.RedisError):
                    client.set(key, owner, px=_ms(ttl_s))

    renewer = threading.Thread(target=renew, name="hud-lease-renew", daemon=True)
    renewer.start()
    try:
        for line in commands:
            verb, _, rest = line.rstrip("\n").partition(" ")
            task_id, _, owner = rest.partition(" ")
            with lock:
                if verb == "hold":
                    held[lease_key(task_id)] = owner
                elif verb == "release":
                    held.pop(lease_key(task_id), None)
            if verb == "release":
                with contextlib.suppress(redis.RedisError):
                    client.delete(lease_key(task_id))
    finally:  # the worker is gone (or stopping): what it still held, it no longer runs
        stopped.set()
        with lock:
            leases = list(held)
        if leases:
            with contextlib.suppress(redis.RedisError):
                client.delete(*leases)
        client.close()


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


if __name__ == "__main__":
    keep(sys.argv[1], float(sys.argv[2]), sys.stdin)
