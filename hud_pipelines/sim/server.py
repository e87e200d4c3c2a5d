"""The sim server: the sim on the main thread, serving on a background asyncio thread.

Sims such as MuJoCo with EGL, Isaac/Omniverse Kit and pygame insist on owning the main thread, so
the main thread runs :meth:`MainThreadExecutor.run_forever` and nothing else: it blocks on a queue
(no sleep-polling) and runs each sim touch (build, reset, step, result, close) in arrival order. An
optional idle hook runs between touches, at most every ``idle_interval_s`` (where a Kit-style app
is pumped). The WebSocket server runs in an asyncio loop on a daemon thread and hands every frame
to the main thread as one job (decode, sim touch, encode: see :mod:`hud_pipelines.sim.session`),
so a reply can never be read while its step is still running.

One connection drives the sim at a time; a second one is refused with HTTP 409 until the first
closes (one that arrives while the first is closing waits up to :data:`CLOSING_WAIT_S` instead).
Every connection must present the capability token (``Authorization: Bearer <token>`` or
``?token=``), checked before the WebSocket handshake completes: a connection without it never
reaches the sim. The upgrade must complete within :data:`UPGRADE_TIMEOUT_S`, the ``hello`` must
follow within :data:`HANDSHAKE_TIMEOUT_S`, and a client that then sends nothing for
``idle_timeout_s`` is closed with :attr:`CloseCode.IDLE_TIMEOUT`, so a silent client cannot hold
the sim forever. WebSocket keepalive pings are off (a long reset or a slow policy must not get a
healthy connection dropped); TCP keepalive notices a peer that vanished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hmac
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.protocol import State

from hud_pipelines.errors import Phase, SimShuttingDown
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.session import SERVER_NAME, CloseCode, Session
from hud_pipelines.wire.codec import packb
from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES, ErrorFrame, to_wire

log = logging.getLogger(__name__)
T = TypeVar("T")
UPGRADE_TIMEOUT_S = 10.0
"""How long the opening HTTP upgrade may take, the wait for a closing connection included."""
HANDSHAKE_TIMEOUT_S = 30.0
"""How long a connection may take to send its ``hello`` frame."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""How long a client may stay silent after its hello (longer than a slow policy's forward)."""
CLOSING_WAIT_S = 5.0
"""How long a new connection waits for a closing one to let go of the sim before it gets a 409."""
TCP_KEEPALIVE_S = (10, 5, 3)
"""Idle seconds before the first probe, seconds between probes, probes before the peer is declared gone."""

__all__ = ["SERVER_NAME", "MainThreadExecutor", "SimServer", "SimShuttingDown"]


class MainThreadExecutor:
    """A blocking job queue drained by the thread that calls :meth:`run_forever`."""

    def __init__(self, idle_hook: Callable[[], None] | None = None, idle_interval_s: float = 0.01) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self.idle_hook = idle_hook
        """Run between jobs, at most every ``idle_interval_s`` (also while no job arrives)."""
        self.idle_interval_s = idle_interval_s
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn`` for the main thread; safe to call from any thread."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                future.set_exception(SimShuttingDown("the sim is shutting down"))
            else:
                self._queue.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the main thread and await its result from an asyncio loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def stop(self) -> None:
        """Make :meth:`run_forever` return after the jobs queued so far (safe in a signal handler)."""
        self._queue.put(None)

    def close(self) -> None:
        """Refuse new jobs and fail the queued ones (the main thread no longer serves them)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[1].set_exception(SimShuttingDown("the sim is shutting down"))

    def run_forever(self) -> None:
        """Run queued jobs until :meth:`stop`; call this on the main thread.

        Without an idle hook the thread blocks on the queue with no timeout at all.
        """
        next_idle = time.monotonic()
        while True:
            hook = self.idle_hook
            if hook is None:
                item = self._queue.get()
            else:
                now = time.monotonic()
                if now >= next_idle:
                    hook()
                    next_idle = time.monotonic() + self.idle_interval_s
                try:
                    item = self._queue.get(timeout=max(0.0, next_idle - time.monotonic()))
                except queue.Empty:
                    continue
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # a shutdown signal mid-job must still release the waiter
                future.set_exception(exc if isinstance(exc, Exception) else SimShuttingDown(repr(exc)))
                if not isinstance(exc, Exception):
                    raise


class SimServer:
    """Serves one :class:`GymBridge` over WebSocket from a background asyncio thread."""

    def __init__(
        self,
        bridge: GymBridge,
        executor: MainThreadExecutor,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.bridge = bridge
        self.executor = executor
        self.token = token
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s or None
        """Seconds a client may send nothing after its hello before it is closed (``None``: forever)."""
        self.connections_served = 0
        self._busy = False
        self._closing = False
        """The connection that drives the sim is on its way out; a newcomer waits for it instead of a 409."""
        self._idle: asyncio.Event | None = None
        self._current: ServerConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> int:
        """Start serving on a daemon thread; returns the bound port (the OS picks one for port 0)."""
        self._thread = threading.Thread(target=self._thread_main, name="hud-sim-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the sim server did not bind within {timeout_s} s")
        if self._failure is not None:
            raise self._failure
        return self.port

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close every connection (1001, going away) and the listening socket."""
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start() or logged; never kill the process from here
            self._failure = exc
            self._ready.set()
            if not isinstance(exc, OSError):
                log.exception("sim server thread failed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        server: Server
        async with serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._admit,
            compression=None,
            max_size=self.max_frame_bytes,
            ping_interval=None,
            open_timeout=UPGRADE_TIMEOUT_S,
            close_timeout=1,
            server_header=SERVER_NAME,
        ) as server:
            self.port = int(next(iter(server.sockets)).getsockname()[1])
            self._ready.set()
            await self._stopped.wait()
            server.close(close_connections=True)

    # -- admission ---------------------------------------------------------------------------------

    async def _admit(self, connection: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        """Refuse a connection before the WebSocket handshake: 401 without the token, 409 when busy.

        A connection that arrives while the previous one is closing (its close frame, its ``close``
        request or its EOF has been read) waits up to :data:`CLOSING_WAIT_S` for it to let go, so a
        client may close and reconnect at once; only a sim still busy after that (a request of the
        old connection still running in the env) is a 409.
        """
        offered = _bearer(request.headers.get("Authorization"))
        if offered is None:
            offered = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            log.warning("refused a connection from %s: missing or wrong token", connection.remote_address)
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong capability token\n")
        if self._busy and self._leaving() and self._idle is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CLOSING_WAIT_S)
        if self._busy:
            return connection.respond(HTTPStatus.CONFLICT, "the sim is driven by another connection\n")
        return None

    def _leaving(self) -> bool:
        """Whether the connection that drives the sim is on its way out."""
        current = self._current
        return self._closing or (current is not None and current.state is not State.OPEN)

    # -- one connection ----------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        if self._busy:  # two connections admitted at the same instant: the later one goes
            await ws.close(CloseCode.TRY_AGAIN_LATER, "the sim is driven by another connection")
            return
        self._busy = True
        self._closing = False
        self._current = ws
        assert self._idle is not None
        self._idle.clear()
        self.connections_served += 1
        _enable_tcp_keepalive(ws)
        session = Session(self.bridge, max_frame_bytes=self.max_frame_bytes)
        left = "client disconnected mid-episode"
        try:
            try:
                first = await asyncio.wait_for(ws.recv(), HANDSHAKE_TIMEOUT_S)
            except TimeoutError:
                await ws.close(CloseCode.PROTOCOL_ERROR, "no hello frame")
                return
            frame: bytes | str | None = first
            while frame is not None:
                outcome = await self.executor.run(functools.partial(session.receive, frame))
                if outcome.reply is not None:
                    await ws.send(outcome.reply)
                if outcome.close is not None:
                    self._closing = True
                    await ws.close(outcome.close, outcome.reason)
                    return
                frame = await _next_frame(ws, self.idle_timeout_s)
            self._closing = True
        except _ClientIdle:
            self._closing = True
            reason = f"idle for {self.idle_timeout_s:g} s: no request since the last reply (--idle-timeout-s)"
            left = f"client dropped: {reason}"
            log.warning("closing a client that stayed silent: %s", reason)
            await ws.close(CloseCode.IDLE_TIMEOUT, reason)
        except ConnectionClosed:
            self._closing = True
        except SimShuttingDown:
            message = "the sim is shutting down"
            try:
                await ws.send(packb(to_wire(ErrorFrame(phase=Phase.SERVER, message=message))))
                await ws.close(CloseCode.GOING_AWAY, message)
            except ConnectionClosed:
                pass
        finally:
            try:
                aborted = await self.executor.run(functools.partial(session.abort, left))
                if aborted:
                    log.warning("client left with slots %s running: their episodes are marked errored", aborted)
            except SimShuttingDown:
                pass
            self._busy = False
            self._current = None
            self._idle.set()


class _ClientIdle(Exception):
    """The client sent nothing within the idle timeout."""


async def _next_frame(ws: ServerConnection, idle_timeout_s: float | None) -> bytes | str | None:
    """The client's next frame, ``None`` once it closed; :class:`_ClientIdle` after ``idle_timeout_s`` of silence."""
    try:
        return await asyncio.wait_for(ws.recv(), idle_timeout_s)
    except ConnectionClosed:
        return None
    except TimeoutError:
        raise _ClientIdle from None


def _enable_tcp_keepalive(ws: ServerConnection) -> None:
    sock: socket.socket | None = ws.transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = TCP_KEEPALIVE_S
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None
