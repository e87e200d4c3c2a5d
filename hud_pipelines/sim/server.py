"""The sim server: the sim on the main thread, serving on background threads.

Sims such as MuJoCo with EGL, Isaac/Omniverse Kit and pygame insist on owning the main thread, so
the main thread drains a job queue (:mod:`hud_pipelines.sim.main_thread`) and nothing else, running
each sim touch (build, reset, step, result, close) in arrival order.

The WebSocket side is websockets' sans-I/O protocol driven by plain threads: one thread accepts
connections, one thread per connection reads its socket and queues every whole message for the
main thread as one job (decode, sim touch, encode, *send*: see :mod:`hud_pipelines.sim.session`).
The main thread writes the reply to the socket itself, so a tick costs one hand-off between threads
(the reader waking the main thread) instead of three through an asyncio loop (reader to main
thread, main thread back to the loop, the loop's task resuming): each cross-thread wake-up costs
tens of microseconds, most of a served round trip. Replies go out in request order because the one
main thread runs the jobs in order; a reply can never be read while its step is still running.

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

import contextlib
import dataclasses
import functools
import hmac
import logging
import os
import select
import signal
import socket
import threading
import time
from http import HTTPStatus
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.server import ServerProtocol

from hud_pipelines.errors import HudPipelinesError, Phase, SimShuttingDown
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.connection import Connection
from hud_pipelines.sim.local_socket import listen as listen_locally
from hud_pipelines.sim.main_thread import MainThreadExecutor
from hud_pipelines.sim.session import SERVER_NAME, Outcome, Session
from hud_pipelines.wire.codec import packb
from hud_pipelines.wire.messages import (
    CLOSING_WAIT_S,
    DEFAULT_MAX_FRAME_BYTES,
    RUNNING_FOR_HEADER,
    UPGRADE_TIMEOUT_S,
    CloseCode,
    ErrorFrame,
    SessionState,
    to_wire,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
HANDSHAKE_TIMEOUT_S = 30.0
"""How long a connection may take to send its ``hello`` frame."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""How long a client may stay silent after its hello (longer than a slow policy's forward)."""
CLOSE_NOTICE_S = 0.5
"""How long a new connection waits for the reader of the driving one to read its close: a client that closes
and reconnects at once can reach the server before its close frame is read, and would get a 409 for itself."""
CLOSE_TIMEOUT_S = 1.0
"""How long a closing connection waits for the peer's close frame before the socket is dropped."""

__all__ = ["SERVER_NAME", "SimServer", "SimShuttingDown"]


@dataclasses.dataclass(eq=False, repr=False)
class SimServer:
    """Serves one :class:`GymBridge` over WebSocket from background threads; replies leave from the main thread."""

    bridge: GymBridge
    executor: MainThreadExecutor
    _: dataclasses.KW_ONLY
    token: str
    host: str = "127.0.0.1"
    port: int = 0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    """Seconds a client may send nothing after its hello before it is closed (``None``, or 0 given: forever)."""
    local_socket: str | None = None
    """A name of Linux's abstract socket namespace (``@name``) to listen on as well, for a client of this host: a
    third of loopback TCP's kernel cost per message. Same token, same admission. ``None`` once it cannot be opened
    (the URL serves alone: it is only a shortcut)."""

    def __post_init__(self) -> None:
        self.idle_timeout_s = self.idle_timeout_s or None
        self.connections_served = 0
        self._state = threading.Condition()
        """Guards who drives the sim; notified when the driving connection lets go."""
        self._driver: Connection | None = None
        """The connection that drives the sim (admitted, until its episodes were aborted)."""
        self._live: set[Connection] = set()
        self._listener: socket.socket | None = None
        self._local_listener: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        """A socket pair whose write end wakes the accepting thread to stop."""
        self._signals: tuple[int, int] | None = None
        """The pipe the C signal handler writes to (``signal.set_wakeup_fd``), watched by the accepting thread."""
        self._previous_wakeup_fd = -1
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> int:
        """Bind and start accepting on a daemon thread; returns the bound port (the OS picks one for port 0)."""
        del timeout_s  # binding is synchronous; kept for callers that bound the start
        family, kind, proto, _, address = socket.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(16)
        except OSError as exc:  # name the address: "address already in use" alone does not say which
            listener.close()
            reason = (exc.strerror or str(exc)).lower()
            raise HudPipelinesError(  # a setting to change, not a bug: said in a line, without a traceback
                f"cannot listen on {address[0]}:{address[1]}: {reason} (another program listens there? pick another "
                "--port, or 0 for any free one)"
            ) from exc
        except BaseException:
            listener.close()
            raise
        try:
            self._local_listener = None if self.local_socket is None else listen_locally(self.local_socket)
            if self._local_listener is None:
                self.local_socket = None
            self._wake = socket.socketpair()
            self._watch_signals()
        except BaseException:  # nothing left bound: a retry may take the same port and name
            for sock in (listener, self._local_listener, *(self._wake or ())):
                if sock is not None:
                    sock.close()
            raise
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept_forever, name="hud-sim-server", daemon=True)
        self._thread.start()
        return self.port

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close every connection (1001, going away) and the listening socket."""
        self._stopped.set()
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"x")
        for connection in list(self._live):
            connection.close(CloseCode.GOING_AWAY, "the sim is shutting down")
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        if self._signals is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.close(self._signals[1])
            self._signals = None

    def _watch_signals(self) -> None:
        """Started on the main thread: signals caught by any thread wake the main thread's queue.

        The C signal handler writes to the wake-up descriptor from whichever thread took the signal;
        the accepting thread, already waiting in ``poll()``, turns that into
        :meth:`MainThreadExecutor.wake_for_signals` (no thread of its own: an extra thread delays a
        killed process's end, and with it the closing of its listening socket).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
        self._signals = (reader, writer)

    def _accept_forever(self) -> None:
        listener, wake = self._listener, self._wake
        assert listener is not None
        assert wake is not None
        signals = self._signals[0] if self._signals is not None else None
        poller = select.poll()  # not select(): a sim process may well hold more than 1024 descriptors
        listeners = {sock.fileno(): sock for sock in (listener, self._local_listener) if sock is not None}
        for sock in listeners.values():
            poller.register(sock, select.POLLIN)
        poller.register(wake[0], select.POLLIN)
        if signals is not None:
            poller.register(signals, select.POLLIN)
        try:
            while not self._stopped.is_set():
                ready = {fd for fd, _ in poller.poll()}
                if signals in ready:
                    with contextlib.suppress(OSError):
                        os.read(signals, 64)
                    self.executor.wake_for_signals()
                for fd in ready.intersection(listeners):
                    try:
                        sock, _ = listeners[fd].accept()
                    except OSError:
                        continue
                    threading.Thread(
                        target=self._connection_main, args=(sock,), name="hud-sim-connection", daemon=True
                    ).start()
        except BaseException:  # logged; never kill the process from here
            log.exception("sim server thread failed")
        finally:
            for sock in listeners.values():
                sock.close()
            for end in wake:
                end.close()
            if signals is not None:
                os.close(signals)

    # -- one connection ----------------------------------------------------------------------------

    def _connection_main(self, sock: socket.socket) -> None:
        connection = Connection(sock, ServerProtocol(max_size=self.max_frame_bytes, logger=log))
        self._live.add(connection)
        try:
            deadline = time.monotonic() + UPGRADE_TIMEOUT_S
            request = connection.read_request(deadline)
            if request is None:
                return
            response = self._admit(connection, request, deadline)
            admitted = response is None
            if response is None:
                response = connection.protocol.accept(request)
            response.headers["Server"] = SERVER_NAME
            connection.send_response(response)
            if response.status_code != HTTPStatus.SWITCHING_PROTOCOLS:
                if admitted:
                    self._let_go(connection)
                return
            self._drive(connection)
        except BaseException:  # a broken connection must never take the server down
            log.exception("serving a connection failed")
        finally:
            self._live.discard(connection)
            connection.finish(CLOSE_TIMEOUT_S)

    def _admit(self, connection: Connection, request: HttpRequest, deadline: float) -> HttpResponse | None:
        """Refuse a connection before the WebSocket handshake: 401 without the token, 409 when busy.

        A connection that arrives while the previous one is closing (its close frame, its ``close``
        request or its EOF has been read, or is read within :data:`CLOSE_NOTICE_S`) waits up to
        :data:`CLOSING_WAIT_S` for it to let go, so a client may close and reconnect at once; only a sim
        still busy after that (a request of the old connection still running in the env) is a 409, with how
        long that request has run (at once where it has run that long already): the client judges by its own
        step deadline whether the sim hung. An admitted connection drives the sim.
        """
        offered = _bearer(request.headers.get("Authorization"))
        if offered is None:
            offered = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            log.warning("refused a connection from %s: missing or wrong token", connection.peer or "the local socket")
            return connection.protocol.reject(HTTPStatus.UNAUTHORIZED, "missing or wrong capability token\n")
        with self._state:
            noticed_by = time.monotonic() + min(CLOSE_NOTICE_S, max(deadline - time.monotonic(), 0.0))
            while self._driver is not None and not self._driver.leaving and time.monotonic() < noticed_by:
                self._state.wait(0.01)  # ``leaving`` is set by the reader without notifying: look again soon
            driver = self._driver
            # a request of a gone connection that has run this long already will not end in a moment: say so now
            if driver is not None and driver.leaving and (driver.running_for() or 0.0) < CLOSING_WAIT_S:
                wait_s = min(CLOSING_WAIT_S, max(deadline - time.monotonic(), 0.0))
                self._state.wait_for(lambda: self._driver is None, timeout=wait_s)
            if self._driver is not None:
                busy, running_for = "the sim is driven by another connection", None
                if self._driver.leaving and (running_for := self._driver.running_for()) is not None:
                    # its client went away, but a request of it still runs in the env
                    busy = (
                        f"the sim is still running a request of a connection that has gone (no reply for "
                        f"{running_for:.0f} s): the env may be stuck in it; restart the server"
                    )
                response = connection.protocol.reject(HTTPStatus.CONFLICT, busy + "\n")
                if running_for is not None:  # the client judges by its own step deadline whether the sim hung
                    response.headers[RUNNING_FOR_HEADER] = f"{running_for:.1f}"
                return response
            self._driver = connection
        return None

    def _let_go(self, connection: Connection) -> None:
        with self._state:
            if self._driver is connection:
                self._driver = None
                self._state.notify_all()

    def _drive(self, connection: Connection) -> None:
        """Queue each whole message of the connection for the main thread until it closes, then abort its episodes."""
        self.connections_served += 1
        connection.keepalive()
        session = Session(self.bridge, max_frame_bytes=self.max_frame_bytes)
        left = "client disconnected mid-episode"
        try:
            left = self._read_requests(connection, session) or left
        finally:
            connection.leaving = True
            try:
                aborted = self.executor.submit(functools.partial(session.abort, left)).result()
                if aborted and session.said_goodbye:
                    log.info("client said goodbye with slots %s running: it ended their episodes itself", aborted)
                elif aborted:
                    log.warning("client left with slots %s running: their episodes are marked errored", aborted)
            except SimShuttingDown:
                pass
            finally:
                self._let_go(connection)

    def _read_requests(self, connection: Connection, session: Session) -> str | None:
        """Hand every message to the main thread; returns why the client was dropped, if it was."""
        hello_by = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while True:
            message = connection.next_message()
            if message is not None:
                if not connection.leaving:
                    self._submit(connection, session, message)
                else:
                    session.note_late(message)
                hello_by = None
                continue
            if connection.ended:
                return None
            if not connection.read(self._wait_s(connection, hello_by)):
                if connection.leaving:  # closing, and the peer does not finish the handshake
                    return None
                if hello_by is not None and time.monotonic() >= hello_by:
                    connection.close(CloseCode.PROTOCOL_ERROR, "no hello frame")
                    return None
                idle = self.idle_timeout_s
                if idle is not None and connection.idle_for() >= idle:
                    reason = f"idle for {idle:g} s: no request since the last reply (--idle-timeout-s)"
                    log.warning("closing a client that stayed silent: %s", reason)
                    connection.close(CloseCode.IDLE_TIMEOUT, reason)
                    return f"client dropped: {reason}"

    def _wait_s(self, connection: Connection, hello_by: float | None) -> float | None:
        """How long the reader may block: until the hello is due, or until the client would be idle too long."""
        if hello_by is not None:
            return max(hello_by - time.monotonic(), 0.0)
        if connection.leaving:
            return CLOSE_TIMEOUT_S
        if self.idle_timeout_s is None:
            return None
        return max(self.idle_timeout_s - connection.idle_for(), 0.0) + 0.01

    def _submit(self, connection: Connection, session: Session, message: bytes | str) -> None:
        """Queue one message for the main thread, which runs it and sends the reply itself."""
        connection.begin_request()

        def run() -> None:
            try:
                if not (connection.leaving and session.state is not SessionState.SERVING):
                    self._answer(connection, session.receive(message))
            finally:
                connection.end_request()

        self.executor.post(run, functools.partial(self._request_failed, connection))

    def _answer(self, connection: Connection, outcome: Outcome) -> None:
        if outcome.reply is not None:
            connection.send_message(outcome.reply)
        if outcome.close is not None:
            connection.leaving = True
            connection.close(outcome.close, outcome.reason)

    def _request_failed(self, connection: Connection, failure: BaseException) -> None:
        """A request refused or cut short by shutdown says so and closes; any other failure is a bug, logged."""
        if isinstance(failure, SimShuttingDown):
            message = "the sim is shutting down"
            connection.leaving = True
            connection.send_message(packb(to_wire(ErrorFrame(phase=Phase.SERVER, message=message))))
            connection.close(CloseCode.GOING_AWAY, message)
            return
        log.error("serving a request failed", exc_info=failure)
        connection.leaving = True
        connection.close(CloseCode.INTERNAL_ERROR, "internal error")


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None
