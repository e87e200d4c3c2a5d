"""The run's watch on its broker: whether it answers, and whether it came back without its data.

A broker restarted without its data (no persistence: its queues, step results and leases are gone)
is noticed through a marker key the run keeps in it; a broker that does not answer is noticed by the
first call that fails, and counted down from then. :class:`BrokerWatch` only observes: what a step
in flight makes of a restart or an outage is :mod:`hud_pipelines.dagster.step_recovery`'s. It is
apart from the executor and the steps because it holds the one piece of state they share about the
server, checked at most every :data:`CHECK_EVERY_S` however many steps are in flight.
"""

from __future__ import annotations

import contextlib
import time
from urllib.parse import urlsplit, urlunsplit

import kombu.exceptions
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

BROKER_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, kombu.exceptions.OperationalError, OSError)
"""What a call to the broker or the result backend raises when the server is unreachable."""
MARKER_PREFIX = "hud-pipelines:run:"
MARKER_TTL_S = 3600
"""How long a run's marker outlives the run's last look at it (a run that died leaves no key behind)."""
CHECK_EVERY_S = 0.5
"""How often the run looks at its broker (dagster-celery's loop ticks once a second)."""
PROBE_TIMEOUT_S = 2.0


class BrokerWatch:
    """What the run knows of its broker between ticks: whether it answers, and when it last lost its data.

    The run keeps a marker key in the broker (and in the result backend when that is another Redis);
    a marker that is gone means the server came back without its data, so whatever was queued, every
    step result it held and every lease are gone with it. Each look renews the marker (``EXPIRE``),
    so a run that died leaves nothing behind after :data:`MARKER_TTL_S`.
    """

    def __init__(self, broker: str, backend: str, run_id: str, *, down_s: float) -> None:
        self.broker = broker
        self.down_s = down_s
        self._marker = f"{MARKER_PREFIX}{run_id}"
        self._clients = {url: redis_client(url) for url in dict.fromkeys([broker, backend])}
        self._checked_at = float("-inf")
        self.down_since: float | None = None
        self.error: str = ""
        self.restarted_at: float | None = None
        """When a server last came back without its data (``time.monotonic()``)."""
        self.queues_lost_at: float | None = None
        """When the broker itself (the queues) last came back without its data."""

    def start(self) -> None:
        for client in self._clients.values():
            client.set(self._marker, "1", ex=MARKER_TTL_S)

    def stop(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(*BROKER_ERRORS):
                client.delete(self._marker)
            client.close()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    @property
    def down_too_long(self) -> bool:
        return self.down_since is not None and time.monotonic() - self.down_since > self.down_s

    def check(self, *, force: bool = False) -> None:
        """Look at the servers (at most every :data:`CHECK_EVERY_S` unless ``force``): up, and with their data?"""
        now = time.monotonic()
        if not force and now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        try:
            for url, client in self._clients.items():
                if not client.expire(self._marker, MARKER_TTL_S):
                    self._restarted(url, client, now)
        except BROKER_ERRORS as exc:
            self.unreachable(exc)
            return
        self.down_since, self.error = None, ""

    def unreachable(self, error: Exception) -> None:
        """A call to the broker failed: it is down from now (or since it first failed)."""
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.error = f"{type(error).__name__}: {error}"

    def restarted_since(self, since: float) -> bool:
        return self.restarted_at is not None and self.restarted_at > since

    def queues_lost_since(self, since: float) -> bool:
        return self.queues_lost_at is not None and self.queues_lost_at > since

    def _restarted(self, url: str, client: redis.Redis, now: float) -> None:
        self.restarted_at = now
        if url == self.broker:
            self.queues_lost_at = now
        client.set(self._marker, "1", ex=MARKER_TTL_S)  # so that a second restart is seen too


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":**@", 1)))


def redis_client(url: str) -> redis.Redis:
    """A Redis client that answers or fails within seconds (no retries: the run's loop tries again next tick)."""
    return redis.Redis.from_url(
        url, socket_timeout=PROBE_TIMEOUT_S, socket_connect_timeout=PROBE_TIMEOUT_S, retry=Retry(NoBackoff(), 0)
    )
