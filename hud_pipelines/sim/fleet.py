"""The served sims one eval attaches to: who holds which, which are lost, which another client drives.

A served sim takes one connection at a time, so it serves one instance at a time. Within one process
the fleet knows which instance holds which server and hands out only free ones. Instances of other
processes (the Celery workers of one run, or another run on the same fleet) are not known to it: a
server one of them drives refuses a connection with HTTP 409. That server is busy, not broken: the
instance that met the refusal tries another free server, or waits for one, backing off, up to
``sim.busy_timeout_s``; the server is never lost for it. A server that cannot be reached at all is
lost: the instance that tried it goes on to another server (it errors naming it where none is left), and no
later instance is sent there. One that stops
listening mid-run (its process died, or was restarted) may come back: it is probed again, at most once
every :data:`PROBE_EVERY_S`, and takes instances again once it listens (a restart on the same address);
while no other server is left, an instance waits up to :data:`RETURN_GRACE_S` from the loss for it.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import urllib.parse
from http import HTTPStatus

from hud_pipelines.errors import SimError, SimRefusedError, SimStartError, SimTimeoutError

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.1
"""How long a server that refused as busy is left alone first; it doubles at every refusal after."""
MAX_BACKOFF_S = 2.0
"""The longest a busy server is left alone between two tries (so it is taken soon after it is let go)."""
RETURN_GRACE_S = 5.0
"""How long after a served sim stopped listening an instance with no other server waits for it to come back
(a restart); after that, instances with no server error at once, and it is still taken back if it returns."""
PROBE_EVERY_S = 0.25
"""How often a served sim that stopped listening is probed again (a TCP connection), at most."""


class ServerUnreachable(SimStartError):
    """A served sim of the fleet that could not be reached (connection refused, no route, no handshake): it
    served nothing, so the instance that tried it goes on to another server while one is left."""


def is_busy(exc: SimError) -> bool:
    """Whether ``exc`` is a served sim refusing a connection because another client drives it."""
    return isinstance(exc, SimRefusedError) and exc.status == HTTPStatus.CONFLICT


class Fleet:
    """The served sims of a pool (empty for a spawned sim): taken by one instance at a time (thread-safe).

    :meth:`take` hands out a server no instance of this process holds and that is not backing off
    after a busy refusal, waiting while there is none; :meth:`give_back` returns it. When every
    server is lost, :meth:`take` errors at once.
    """

    def __init__(self, servers: list[str]) -> None:
        self.attached = bool(servers)
        self._all = list(servers)
        self._free = list(servers)
        self._not_before: dict[str, float] = {}
        """Servers that refused as busy, and when they may be tried again (monotonic clock)."""
        self._lost: dict[str, str] = {}
        """Each lost server and why it was lost (the first error that came from it)."""
        self._may_return: dict[str, float] = {}
        """Lost servers that stopped listening mid-run, and when (monotonic clock): they are probed again."""
        self._probed: dict[str, float] = {}
        """When each of those was last probed."""
        self._changed = threading.Condition()

    def take(self) -> str:
        while True:
            self._take_back_returned()  # probes outside the lock: a dead host must not hold up the others
            with self._changed:
                now = time.monotonic()
                if len(self._lost) == len(self._all):
                    if any(now - since < RETURN_GRACE_S for since in self._may_return.values()):
                        self._changed.wait(PROBE_EVERY_S)  # a restart may be on its way
                        continue
                    error = SimStartError(self._every_one_lost())
                    error.server = self._all[0] if len(self._all) == 1 else None  # a fleet's: none in particular
                    raise error
                ready = [server for server in self._free if self._not_before.get(server, 0.0) <= now]
                if ready:
                    self._free.remove(ready[0])
                    return ready[0]
                waits = [self._not_before[server] - now for server in self._free]
                waits += [PROBE_EVERY_S] if self._may_return else []
                self._changed.wait(min(waits) if waits else None)

    def any_left(self) -> bool:
        """Whether a server is not lost: one an instance may still be sent to."""
        with self._changed:
            return len(self._lost) < len(self._all)

    def give_back(self, server: str) -> None:
        with self._changed:
            self._give(server)

    def busy(self, server: str, refusals: int) -> None:
        """Give ``server`` back after its ``refusals``-th busy refusal: it is not tried again for a while.

        The pause doubles with each refusal up to :data:`MAX_BACKOFF_S`, with jitter, so the workers of
        one run that wait for the same server do not all knock at the same moment.
        """
        pause_s = min(FIRST_BACKOFF_S * 2 ** max(refusals - 1, 0), MAX_BACKOFF_S) * random.uniform(0.5, 1.0)
        with self._changed:
            self._not_before[server] = time.monotonic() + pause_s
            self._give(server)

    def lose(self, server: str, reason: str, *, may_return: bool = False) -> None:
        """No later instance goes to ``server``; unless it listens again, where it ``may_return`` (it stopped
        listening mid-run: died, or is being restarted)."""
        with self._changed:
            self._lost.setdefault(server, reason)
            if may_return and self._lost[server] == reason:
                self._may_return[server] = time.monotonic()
            self._changed.notify_all()

    def _take_back_returned(self) -> None:
        """Give the servers that stopped listening and listen again back to the instances."""
        with self._changed:
            now = time.monotonic()
            due = [s for s, since in self._may_return.items() if now - self._probed.get(s, since) >= PROBE_EVERY_S]
            self._probed.update(dict.fromkeys(due, now))
        back = [server for server in due if reachable(server, timeout_s=PROBE_EVERY_S)]
        with self._changed:
            for server in back:
                if self._may_return.pop(server, None) is not None:  # not taken back by another instance meanwhile
                    del self._lost[server], self._probed[server]
                    self._give(server)
                    log.warning(
                        "served sim %s listens again after it stopped mid-run: it takes instances again", server
                    )

    def _give(self, server: str) -> None:
        """``server`` free for the next instance, once (lock held)."""
        if server not in self._lost and server not in self._free:
            self._free.append(server)
        self._changed.notify_all()

    def _every_one_lost(self) -> str:
        """Why no instance can have a served sim: each server's own first error, not just that it is gone."""
        reasons = [
            reason + (f" (and did not listen again within {RETURN_GRACE_S:g} s)" if server in self._may_return else "")
            for server, reason in self._lost.items()
        ]
        if len(self._all) == 1:
            return f"the served sim cannot be used: {reasons[0]}"
        return f"none of the {len(self._all)} served sims can be used: " + "; ".join(reasons)


def stuck_in_a_gone_request(exc: SimError, server: str, step_timeout_s: float) -> SimTimeoutError | None:
    """A busy refusal of a sim that has run a request of a connection that has gone for longer than this run's
    ``step_timeout_s``: hung by this run's own measure (a run that left it so saw it hang), so waiting
    ``busy_timeout_s`` for it, instance after instance, would end in nothing but "busy"."""
    if not isinstance(exc, SimRefusedError) or exc.running_for_s is None or exc.running_for_s < step_timeout_s:
        return None
    hung = SimTimeoutError(
        f"served sim {server} is still running a request of a connection that has gone, with no reply for "
        f"{exc.running_for_s:.0f} s (sim.step_timeout_s = {step_timeout_s:g}): the env is presumed stuck in it; "
        "restart the server",
        deadline_s=step_timeout_s,
    )
    hung.server = server
    return hung


def busy_with(refused: SimError, busy_timeout_s: float, step_timeout_s: float) -> str:
    """What a busy served sim is doing, as its refusal says: a request of a connection that has gone (a run cut short
    while its step ran: its server says for how long), or another client's work."""
    running_for_s = refused.running_for_s if isinstance(refused, SimRefusedError) else None
    if running_for_s is None:
        return (
            "is busy, driven by another client: waiting for it or another one "
            f"(sim.busy_timeout_s = {busy_timeout_s:g})"
        )
    return (
        f"is still running a request of a connection that has gone ({running_for_s:.0f} s so far): waiting for it to "
        f"end, or for another server; past sim.step_timeout_s = {step_timeout_s:g} s it is presumed hung"
    )


def naming(exc: SimError, server: str) -> SimError:
    """``exc`` with its message prefixed by the server it came from, its fields (status, deadline...) kept."""
    named = type(exc).__new__(type(exc))  # not the constructor: each error type has keyword-only fields
    named.__dict__.update(exc.__dict__)
    named.args = (f"served sim {server}: {exc}", *exc.args[1:])
    return named


def reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a served sim still listens (a TCP connection to its host and port opens)."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=timeout_s):
            return True
    except OSError:
        return False
