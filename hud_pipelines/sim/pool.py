"""Sims for the instances of one eval: spawned on demand, reused, always torn down.

An eval runs ``group`` instances per task, at most ``max_concurrent`` at once, and each instance is
one vectorized sim of ``num_envs`` slots. :class:`SimPool` hands out a connected sim per instance:
an idle one when there is one (a sim is reset for every instance anyway, so reuse is safe and saves a
start-up), otherwise it spawns a child. A sim whose instance failed is closed, never reused. For a
sim served elsewhere (``url`` + ``token``) the pool attaches instead; a served sim takes one
connection at a time, so attached instances queue for it. With ``shards > 1`` an instance's sim is
K children, each serving a slice of its slots, behind one :class:`~hud_pipelines.sim.sharded_sim.ShardedSim`
(see :mod:`hud_pipelines.sim.shards`); it is pooled, reused and stopped as one sim.

The pool is lazy: nothing is spawned until an instance asks. That matters under Dagster, whose CLI
initialises a job's resources once more after the run (to load outputs): an eager pool would start
a sim for nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from hud_pipelines.closing import Closeable
from hud_pipelines.contract import Contract
from hud_pipelines.errors import HudPipelinesError, SimCrashedError, SimError, SimStartError, SimTimeoutError
from hud_pipelines.sim.client import DEFAULT_CONNECT_TIMEOUT_S, SimClient
from hud_pipelines.sim.fleet import (
    Fleet,
    ServerUnreachable,
    busy_with,
    is_busy,
    naming,
    reachable,
    stuck_in_a_gone_request,
)
from hud_pipelines.sim.identity import describe, same_sim
from hud_pipelines.sim.process import DEFAULT_GRACE_S, SimProcess
from hud_pipelines.sim.settings import SimSettings
from hud_pipelines.sim.sharded_sim import ShardedSim
from hud_pipelines.sim.shards import ShardedProcess
from hud_pipelines.wire.messages import CLOSING_WAIT_S, Framing

log = logging.getLogger(__name__)


@dataclass
class LiveSim:
    """A sim and the client connected to it; ``healthy`` turns false on any fault.

    A sharded instance's ``process`` is its K children and its ``client`` the one client over them.
    """

    process: SimProcess | ShardedProcess
    client: SimClient | ShardedSim
    healthy: bool = True
    server: str | None = None
    """The URL of the served sim it is attached to (``None`` for a spawned one)."""
    hung: bool = False
    """It stopped answering within its deadline. A served sim's server is still busy with the request it never
    answered (nothing here can stop it), so no later instance goes there: it would wait on it as on another
    client's."""
    failure: BaseException | None = None
    """What it failed on, said to the instances that find its server gone since."""

    def kill(self) -> None:
        """Stop the sim now (a rollout timeout): a spawned child's group is killed, an attached link closed."""
        self.healthy = False
        if self.process.owned:
            self.process.kill()
        else:
            self.client.close()


class SimPool(Closeable):
    """Spawns, reuses and finally closes the sims of one eval (thread-safe)."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._idle: list[LiveSim] = []
        self._live: list[LiveSim] = []
        if settings.shards > 1 and settings.servers:
            raise ValueError(f"shards={settings.shards} splits a sim the pool spawns; a served sim's slots are its own")
        self._tokens = dict(settings.servers)
        self._servers = Fleet([url for url, _ in settings.servers])
        self._closed = False
        self._contract: Contract | None = None
        self.served_sim: dict[str, Any] | None = None
        """What the first served sim said it is (:mod:`.identity`); every other one must be the same sim."""
        self._served_by: str | None = None
        """The server that said it first in this process (None: the run's claim, made by another process)."""
        self._start_failure: SimStartError | None = None
        """Why a sim of this pool did not start: later instances fail at once, not after the deadline again."""
        self.spawned = 0
        self._said_busy: set[str] = set()
        """Served sims this pool said it waits for (busy: another client drives them)."""

    def _open(self, server: str | None) -> LiveSim:
        settings = self.settings
        process: SimProcess | ShardedProcess
        if server is not None:
            process = SimProcess.attach(server, self._tokens[server])
        else:
            assert settings.factory is not None
            if self._start_failure is not None:
                failure = self._start_failure
                lines = str(failure).split("\n", 1)  # said on the headline, before the child's stderr tail
                lines[0] += " (not started again: an earlier start in this run failed so)"
                raise SimStartError("\n".join(lines), child_error=failure.child_error)
            spawn: dict[str, Any] = {
                "build_args": settings.build_args,
                "contract_path": settings.contract_path,
                "options": settings.options,
                "startup_timeout_s": settings.startup_timeout_s,
                "cwd": settings.cwd,
                "python": settings.python,
            }
            try:
                if settings.shards > 1:
                    process = ShardedProcess.spawn(
                        settings.factory, num_envs=settings.num_envs, shards=settings.shards, **spawn
                    )
                else:
                    process = SimProcess.spawn(settings.factory, num_envs=settings.num_envs, **spawn)
            except SimStartError as exc:
                if not exc.signalled:  # the same factory and arguments would fail the same way
                    self._start_failure = exc
                raise
            self.spawned += 1
        try:
            # a server that does not answer its handshake is given a step's deadline, at most the default's, and
            # at least the server's own wait for a closing connection: its 409 then says what held the sim
            connect_timeout_s = min(max(settings.step_timeout_s, CLOSING_WAIT_S + 1.0), DEFAULT_CONNECT_TIMEOUT_S)
            client = process.connect(
                framing=Framing.BATCHED,
                step_timeout_s=settings.step_timeout_s,
                connect_timeout_s=connect_timeout_s,
                max_frame_bytes=settings.max_frame_bytes,
            )
            try:
                self._require_same_sim(client, attached=server is not None)
            except BaseException:
                client.close()
                raise
        except BaseException:
            process.close(grace_s=1.0)
            raise
        return LiveSim(process, client, server=server)

    def _require_same_sim(self, client: SimClient | ShardedSim, *, attached: bool) -> None:
        """Refuse a served sim with other slots than the pipeline's, or that is not the sim the run's first one is.

        Only a served sim can differ (a spawned one is ours). Its episodes would be graded, and compared,
        as the same sim's: a server started with another factory, arguments or packages is a different
        sim, whatever its address.
        """
        num_envs = self.settings.num_envs
        if client.num_envs != num_envs:
            raise SimStartError(
                f"it serves {client.num_envs} slot(s), but the pipeline's sim.num_envs is {num_envs}: "
                f"set sim.num_envs: {client.num_envs}, or serve it with --num-envs {num_envs}"
            )
        if not attached or not isinstance(client, SimClient):
            return
        identity = client.hello.sim
        with self._lock:
            if self.served_sim is None:
                self.served_sim, self._served_by = identity, client.url
            expected, first = self.served_sim, self._served_by
        if identity and expected and not same_sim(identity, expected):  # a sim saying nothing is not compared
            if first == client.url:  # one address, restarted otherwise mid-run
                raise SimStartError(
                    f"it now serves {describe(identity)}, but this run began on {describe(expected)} at this address "
                    "(restarted with other arguments or packages): restart it as it was to finish this run, or run "
                    "again to evaluate the sim it serves now"
                )
            met = f" (served by {first}, the first this run met)" if first else ""
            raise SimStartError(
                f"it serves {describe(identity)}, but this run's served sim is {describe(expected)}{met}: every "
                "served sim of a pipeline must serve the same sim with the same arguments and package versions; "
                "start them alike, or list only the servers of the sim to evaluate"
            )
        if self._contract is not None and client.contract != self._contract:  # said nothing, yet serves another
            raise SimStartError(
                "its contract is not the one this run's served sim announced: every served sim of a pipeline must "
                "serve the same sim (observations and actions alike)"
            )

    def hold_to(self, identity: dict[str, Any]) -> None:
        """Hold every served sim of this pool to ``identity`` (the run's claim, which another process may
        have made first): an idle one of another sim is stopped, so the instance that would reuse it
        connects anew and meets the refusal."""
        with self._lock:
            if self.served_sim is None or not same_sim(self.served_sim, identity):
                self._served_by = None  # another process's claim: the server it came from is not known here
            self.served_sim = identity
            other = [live for live in self._idle if _identity(live) and not same_sim(_identity(live), identity)]
            for live in other:
                self._idle.remove(live)
                self._live.remove(live)
        for live in other:
            _shutdown(live, 0.0)

    def contract(self, *, then: Callable[[SimClient | ShardedSim], None] | None = None) -> Contract:
        """The sim's contract, read once from the first sim that starts (the sim then stays in the pool).

        In a fleet, a server that cannot be reached is skipped here (and lost, as an instance would
        lose it): one bad machine must not leave the whole eval without its contract. ``then`` runs on
        the client of the sim that gave the contract, by the call that reads it (the run's seed check):
        it takes no server of its own, so a bad one is still met, and named, by an instance. If it
        fails, the contract stands and that sim is not used again (an instance meets the fault anew).
        """
        if self._contract is not None:
            return self._contract
        attempts = max(1, len(self.settings.servers))
        for attempt in range(attempts):
            try:
                with self.sim() as live:
                    self._contract = live.client.contract
                    if then is not None:
                        try:
                            then(live.client)
                        except HudPipelinesError as exc:
                            live.healthy, live.failure = False, exc
                            log.warning("the sim gave its contract, then failed: %s", exc)
                return self._contract
            except SimError as exc:
                if attempt == attempts - 1:
                    raise
                log.warning("no contract from a served sim of the fleet, trying the next: %s", exc)
        raise AssertionError("unreachable: the last attempt returns or raises")

    @contextlib.contextmanager
    def sim(self) -> Generator[LiveSim]:
        """A connected sim for one instance; returned to the pool if it stayed healthy."""
        server, live = self._acquire()
        try:
            try:
                yield live
            except BaseException as exc:
                live.healthy, live.failure = False, live.failure or exc
                raise
            finally:
                self._release(live)
                if server is not None and live.hung:
                    self._servers.lose(server, f"served sim {server} stopped answering (a step or reset hung)")
                elif server is not None and not live.healthy and not reachable(server):  # it died with its sim
                    after = f" ({str(live.failure).split(chr(10))[0]})" if live.failure is not None else ""
                    self._servers.lose(server, f"served sim {server} stopped listening{after}", may_return=True)
        finally:
            if server is not None:
                self._servers.give_back(server)

    def _acquire(self) -> tuple[str | None, LiveSim]:
        """A sim for one instance, and the served sim it holds (``None`` for a spawned one).

        A served sim that refuses as busy (another process's client drives it) is given back to be
        tried again later while this instance tries the others, for ``busy_timeout_s`` at the most.
        """
        refusals = 0
        waiting_since = time.monotonic()
        while True:
            server = self._servers.take() if self._servers.attached else None  # waits for one no instance holds
            try:
                return server, self._connected(server)
            except ServerUnreachable as exc:  # it served nothing: another server of the fleet, while one is left
                if not self._servers.any_left():
                    raise
                log.warning("%s; the instance goes on to another server of the fleet", exc)
            except BaseException as exc:
                if server is None:
                    raise
                if not isinstance(exc, SimError) or not is_busy(exc):
                    self._servers.give_back(server)  # a lost one is not handed out again
                    raise
                if (hung := stuck_in_a_gone_request(exc, server, self.settings.step_timeout_s)) is not None:
                    self._servers.lose(server, str(hung))  # no later instance waits busy_timeout_s for it again
                    raise hung from exc
                refusals += 1
                waited_s = time.monotonic() - waiting_since
                if server not in self._said_busy:  # once a server: a run that waits says why it does not move
                    self._said_busy.add(server)
                    log.warning(
                        "served sim %s %s",
                        server,
                        busy_with(exc, self.settings.busy_timeout_s, self.settings.step_timeout_s),
                    )
                if waited_s >= self.settings.busy_timeout_s:
                    self._servers.give_back(server)
                    error = SimStartError(
                        f"served sim {server}: busy, driven by another client (HTTP 409), for the {waited_s:.0f} s "
                        f"this instance waited (sim.busy_timeout_s = {self.settings.busy_timeout_s:g}); serve more "
                        "sims, or let fewer clients use them at once"
                    )
                    error.server = server
                    raise error from exc
                self._servers.busy(server, refusals)

    def _connected(self, server: str | None) -> LiveSim:
        """An idle sim on ``server`` (any idle spawned one), or a new one; a server that fails is lost.

        A busy refusal is raised as it is: the server is not lost for it.
        """
        with self._lock:
            if self._closed:
                raise SimError("the run is shutting down: the sim pool is closed")
            live = self._idle_on(server)
        if live is not None and live.client.still_connected():
            return live
        if live is not None:  # closed while idle (a restart, an idle timeout, a proxy's): this instance connects anew
            log.info("the idle connection to %s closed since its last instance", live.server or "a spawned sim")
            live.healthy = False
            self._release(live)
        try:
            live = self._open(server)
        except SimError as exc:
            if server is None or is_busy(exc):
                raise
            named = naming(exc, server)
            if isinstance(exc, SimCrashedError | SimTimeoutError):  # not reached, or silent before any request
                named = ServerUnreachable(str(named))
            elif not isinstance(named, SimStartError):  # refused (a token): it served nothing either
                named = SimStartError(str(named))
            named.server = server
            self._servers.lose(server, str(named))
            raise named from exc
        with self._lock:
            closed = self._closed
            if not closed:
                self._live.append(live)
        if closed:  # the pool closed while this sim was starting: nobody else will stop it
            _shutdown(live, 0.0)
            raise SimError("the run is shutting down: the sim pool is closed")
        return live

    def _idle_on(self, server: str | None) -> LiveSim | None:
        """An idle sim to reuse: the one attached to ``server``, or any spawned one (call with the lock held)."""
        for index, live in enumerate(self._idle):
            if live.server == server:
                return self._idle.pop(index)
        return None

    def _release(self, live: LiveSim) -> None:
        with self._lock:
            if live.healthy and live.process.alive() and not self._closed:
                self._idle.append(live)
                return
            if live in self._live:  # not when close() already took it
                self._live.remove(live)
        _shutdown(live)

    def close(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Close every sim this pool opened (idle or in use); safe to call twice.

        Every sim is told to stop first, then each is waited for (at most ``grace_s``, then killed),
        so closing k sims takes one grace period, not k. ``grace_s=0`` kills every sim at once: a
        cancelled run has no reason to wait. An interrupt that arrives while closing does not leave
        the remaining sims running: every sim is closed, then the first exception is raised.
        """
        with self._lock:
            self._closed = True
            live, self._live, self._idle = self._live, [], []
        first: BaseException | None = None
        for sim in live:
            try:
                if grace_s <= 0:
                    sim.kill()
                else:
                    _terminate(sim)
            except BaseException as exc:
                first = first or exc
        for sim in live:
            try:
                _shutdown(sim, grace_s)  # counted from each sim's SIGTERM above: one grace period for all
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first


def _identity(live: LiveSim) -> dict[str, Any]:
    """What an attached sim said it is (a spawned one: the pool's own, nothing to compare)."""
    return live.client.hello.sim if live.server is not None and isinstance(live.client, SimClient) else {}


def _terminate(live: LiveSim) -> None:
    with contextlib.suppress(Exception):
        live.client.close()
    live.process.terminate()


def _shutdown(live: LiveSim, grace_s: float = DEFAULT_GRACE_S) -> None:
    with contextlib.suppress(Exception):
        live.client.close()
    live.process.close(grace_s=grace_s)
