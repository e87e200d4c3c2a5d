"""One client connection of the sim server: websockets' sans-I/O protocol over a plain socket.

The connection's own thread reads (``poll()`` with a deadline, whole messages out of the protocol);
the main thread writes the replies, so sends are serialised by a lock and bounded by
:data:`SEND_TIMEOUT_S`. Apart from :mod:`hud_pipelines.sim.server`, which decides who may drive the
sim and what each message does, because this is only the framing and the socket.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import cast

from websockets.frames import Frame, Opcode
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.protocol import State
from websockets.server import ServerProtocol

from hud_pipelines.wire.messages import CloseCode

SEND_TIMEOUT_S = 60.0
"""How long one send may wait for a peer that does not read (then the connection is dropped)."""
TCP_KEEPALIVE_S = (10, 5, 3)
"""Idle seconds before the first probe, seconds between probes, probes before the peer is declared gone."""
RECV_CHUNK_BYTES = 1 << 20
_CLOSING = frozenset({State.CLOSING, State.CLOSED})


class Connection:
    """One accepted socket and its WebSocket protocol (sans I/O).

    Its reader thread feeds the protocol; whoever has something to send (the main thread's replies,
    the reader's pongs and closing frames) writes it under the send lock, so frames never interleave.
    The protocol's own lock is never held while a send waits for a slow reader, so reading goes on
    meanwhile.
    """

    def __init__(self, sock: socket.socket, protocol: ServerProtocol) -> None:
        self.tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        """Over TCP (another host, or this one by its URL); else a local socket (``SimServer.local_socket``)."""
        if self.tcp:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(SEND_TIMEOUT_S)  # bounds sends; reads wait in poll() with their own deadline
        self.sock = sock
        self.protocol = protocol
        self.peer: object = _peer_of(sock)
        self.leaving = False
        """A close was sent or received, or the client went away: no further request is run for it."""
        self._lock = threading.RLock()
        """Guards the protocol state."""
        self._send_lock = threading.RLock()
        """Held from taking bytes out of the protocol until they are written: frames go out whole, in order."""
        self._events: list[object] = []
        self._fragments: list[bytes | bytearray | memoryview] = []
        self._text = False
        self._eof = False
        self._in_flight = 0
        self._request_since = 0.0
        self._last_activity = time.monotonic()
        self._buffer = bytearray(RECV_CHUNK_BYTES)
        self._poller = select.poll()  # not select(): a sim process may well hold more than 1024 descriptors
        self._poller.register(sock, select.POLLIN)

    # -- reading (the connection's own thread) -----------------------------------------------------

    @property
    def ended(self) -> bool:
        """Nothing more will arrive: the peer closed, the stream ended or the protocol failed it."""
        return self._eof or self.protocol.state is State.CLOSED or self.protocol.close_rcvd is not None

    def read(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` for bytes and feed them to the protocol; ``False`` on timeout."""
        wait_ms = None if timeout_s is None else max(math.ceil(timeout_s * 1000), 0)
        try:
            ready = bool(self._poller.poll(wait_ms))
        except (OSError, ValueError):  # the socket was closed under us: the read below sees the end
            ready = True
        if not ready:
            return False
        try:
            count = self.sock.recv_into(self._buffer)
        except OSError:
            count = 0
        with self._lock:
            if count:
                # websockets copies the chunk into its own buffer: a view of ours saves a copy per read
                self.protocol.receive_data(cast(bytes, memoryview(self._buffer)[:count]))
            else:
                self._eof = True
                self.protocol.receive_eof()
            self._events.extend(self.protocol.events_received())
            # the peer closed, or the protocol failed the connection (a frame over the size limit):
            # leaving before the close frame goes out, so a client that reconnects at once is waited for
            if self.protocol.close_rcvd is not None or self._eof or self.protocol.state in _CLOSING:
                self.leaving = True
            pending = bool(self.protocol.writes)
        if pending:  # a pong, our half of a closing handshake
            self._flush(lambda: None)
        if count:
            self._last_activity = time.monotonic()
        return True

    def read_request(self, deadline: float) -> HttpRequest | None:
        """The opening HTTP request, or ``None`` when it is malformed, never comes or comes too late."""
        while True:
            for event in self._events:
                if isinstance(event, HttpRequest):
                    self._events.clear()
                    return event
            if self.ended or self.protocol.handshake_exc is not None:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.read(remaining):
                return None

    def next_message(self) -> bytes | str | None:
        """The next whole data message read so far (fragments joined), else ``None``."""
        while self._events:
            frame = self._events.pop(0)
            if not isinstance(frame, Frame) or frame.opcode not in (Opcode.BINARY, Opcode.TEXT, Opcode.CONT):
                continue
            if frame.opcode is not Opcode.CONT:
                self._fragments = []
                self._text = frame.opcode is Opcode.TEXT
            self._fragments.append(frame.data)
            if frame.fin:
                data = b"".join(self._fragments) if len(self._fragments) > 1 else bytes(self._fragments[0])
                self._fragments = []
                return data.decode(errors="replace") if self._text else data
        return None

    def idle_for(self) -> float:
        """Seconds since the client's last frame or the last reply, 0 while a request is queued or running."""
        if self._in_flight:
            return 0.0
        return time.monotonic() - self._last_activity

    def running_for(self) -> float | None:
        """Seconds the request the sim works on now has run (``None``: none is queued or running): since the
        last reply, as requests run one after another, or since the first came; the client's frames do not count."""
        return time.monotonic() - self._request_since if self._in_flight else None

    def begin_request(self) -> None:
        with self._lock:
            if not self._in_flight:
                self._request_since = time.monotonic()
            self._in_flight += 1

    def end_request(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last_activity = self._request_since = time.monotonic()

    # -- writing (any thread) ----------------------------------------------------------------------

    def send_response(self, response: HttpResponse) -> None:
        self._flush(lambda: self.protocol.send_response(response))

    def send_message(self, data: bytes) -> None:
        """Send one binary message; a connection that is no longer open drops it."""

        def queue() -> None:
            if self.protocol.state is State.OPEN:
                self.protocol.send_binary(data)

        self._flush(queue)

    def close(self, code: CloseCode, reason: str) -> None:
        """Start the closing handshake (once); the reader sees it through and drops the socket."""
        self.leaving = True

        def queue() -> None:
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(code, reason)

        self._flush(queue)

    def keepalive(self) -> None:
        """Probe a TCP peer that may vanish with its host; a local socket's peer is known gone at once."""
        if self.tcp:
            _enable_tcp_keepalive(self.sock)

    def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the closing handshake to complete, then drop the socket."""
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(OSError):
            while self.protocol.state is not State.CLOSED and not self._eof:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.read(remaining):
                    break
        with self._send_lock, self._lock:  # never under a send in progress: its descriptor could be reused
            self.sock.close()

    def _flush(self, queue: Callable[[], None]) -> None:
        """Run ``queue`` on the protocol (what to send), then write out everything it has to send."""
        with self._send_lock:
            with self._lock:
                queue()
                chunks = self.protocol.data_to_send()
            for chunk in chunks:
                try:
                    if chunk:
                        self.sock.sendall(chunk)
                    else:  # the protocol asks to half-close the TCP connection
                        self.sock.shutdown(socket.SHUT_WR)
                except OSError:  # a peer that vanished or stopped reading: nothing more goes out
                    with self._lock:
                        self._eof = True
                        self.leaving = True
                        self.protocol.receive_eof()
                        self.protocol.data_to_send()
                    return


def _peer_of(sock: socket.socket) -> object:
    try:
        return sock.getpeername()
    except OSError:
        return None


def _enable_tcp_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = TCP_KEEPALIVE_S
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
