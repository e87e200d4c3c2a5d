"""A blocking WebSocket client driven in the caller's thread by websockets' sans-I/O protocol.

The sim client reads replies in the order it sent its requests (one at a time, or a few pipelined
steps ahead), so it needs no reader thread: :meth:`WebSocketLink.recv` reads the socket itself until
a whole message arrived or the deadline passed; replies to pipelined requests wait in the kernel's
socket buffer and the server's send queue meanwhile. That saves a thread
hand-off per reply (the round trip is the cost of a served step) and makes every wait explicit:
there is no read that can block without a deadline.

Nothing here knows the sim protocol; it moves binary messages and reports, as plain exceptions,
a refused handshake (:class:`LinkRefused`, with the HTTP status), a closed or broken connection
(:class:`LinkClosed`, with the close code when the peer sent one) and a missed deadline
(``TimeoutError``).
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import ssl
import time
from typing import Protocol, cast

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from hud_pipelines.errors import LinkClosed, LinkError, LinkRefused
from hud_pipelines.sim.local_socket import address as local_address
from hud_pipelines.wire.messages import RUNNING_FOR_HEADER

RECV_CHUNK_BYTES = 1 << 20
CLOSE_FRAME_WAIT_S = 0.2
"""How long a failed write waits for the close frame that says why the peer closed."""
QUIET_READS = 4
"""How many reads :meth:`WebSocketLink.quiet` makes of what an idle connection holds (pings, a close frame)."""
_CONTROL = (Opcode.PING, Opcode.PONG)


class Link(Protocol):
    """What the sim client needs of a connection: whole binary messages both ways, under deadlines.

    :class:`WebSocketLink` is the real one; :class:`~hud_pipelines.sim.in_process.InProcessLink`
    serves a bridge in the same process (httpx's ``MockTransport`` idea).
    """

    def send(self, data: bytes, timeout_s: float) -> None: ...

    def recv(self, timeout_s: float) -> bytes | bytearray | memoryview | str: ...

    def close(self, timeout_s: float = 1.0) -> None: ...

    def abort(self) -> None: ...

    def quiet(self) -> bool: ...


class WebSocketLink:
    """One WebSocket connection; use it from one thread at a time."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str],
        max_size: int | None,
        timeout_s: float,
        local_socket: str | None = None,
    ) -> None:
        """Connect to ``url``, or to the server of ``url`` through the ``local_socket`` it named (``@name``, see
        :mod:`hud_pipelines.sim.local_socket`), the handshake still addressed to ``url``."""
        try:
            uri = parse_uri(url)
        except InvalidURI as exc:
            raise LinkError(f"not a WebSocket URL: {url!r} ({exc})") from exc
        deadline = time.monotonic() + timeout_s
        if local_socket is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(local_address(local_socket))
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((uri.host, uri.port), timeout=timeout_s)
        try:
            if local_socket is None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=uri.host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._buffer = bytearray(RECV_CHUNK_BYTES)
        self._frames: list[Frame] = []
        self._fragments: list[bytes | bytearray | memoryview] = []
        self._text = False
        self._write_error: OSError | None = None
        """Why the socket stopped taking our writes; what the peer sent before is still read until EOF."""
        self._protocol = ClientProtocol(uri, max_size=max_size)
        request = self._protocol.connect()
        request.headers.update(headers)
        self._protocol.send_request(request)
        try:
            self._flush(deadline)
            while self._protocol.state is State.CONNECTING and self._protocol.handshake_exc is None:
                self._pump(deadline)
        except BaseException:
            self._sock.close()
            raise
        failure = self._protocol.handshake_exc
        if failure is not None:
            self._sock.close()
            if isinstance(failure, InvalidStatus):
                response = failure.response
                body = response.body.decode(errors="replace").strip() if response.body else ""
                raise LinkRefused(
                    response.status_code, body, header_seconds(response.headers.get(RUNNING_FOR_HEADER))
                ) from failure
            raise LinkError(f"the WebSocket handshake with {url} failed: {failure}") from failure

    @property
    def open(self) -> bool:
        return self._protocol.state is State.OPEN

    def receive_up_to(self, max_size: int) -> None:
        """Take messages of up to ``max_size`` bytes from now on: a server's larger bound, announced in its hello,
        which its client applies to what it receives (``docs/protocol.md``), so ``serve --max-frame-bytes`` works."""
        self._protocol.max_message_size = max_size

    def send(self, data: bytes, timeout_s: float) -> None:
        """Send one binary message."""
        if self._write_error is not None:  # the peer's close frame, read before the write broke, says why
            raise (
                self._closed()
                if self._protocol.close_rcvd is not None
                else LinkClosed(f"the connection broke ({self._write_error})")
            )
        if self._protocol.state is not State.OPEN:
            raise self._closed()
        self._protocol.send_binary(data)
        try:
            self._flush(time.monotonic() + timeout_s)
        except LinkClosed as broken:
            raise self._close_frame_left() or broken from None

    def recv(self, timeout_s: float) -> bytes | bytearray | memoryview | str:
        """The next whole message (fragments joined), waiting at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.opcode in (Opcode.BINARY, Opcode.TEXT, Opcode.CONT):
                    if frame.opcode is not Opcode.CONT:
                        self._fragments = []
                        self._text = frame.opcode is Opcode.TEXT
                    self._fragments.append(frame.data)
                    if frame.fin:
                        data = b"".join(self._fragments) if len(self._fragments) > 1 else self._fragments[0]
                        self._fragments = []
                        return bytes(data).decode(errors="replace") if self._text else data
            if self._protocol.state is State.CLOSED or self._protocol.close_rcvd is not None:
                raise self._closed()
            self._pump(deadline)

    def close(self, timeout_s: float = 1.0) -> None:
        """Close politely (wait up to ``timeout_s`` for the peer's close frame), then drop the socket."""
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(LinkError, OSError, TimeoutError):
            if self._protocol.state is State.OPEN:
                self._protocol.send_close(1000)
                self._flush(deadline)
            while self._protocol.state is not State.CLOSED:
                self._pump(deadline)
        self._sock.close()

    def abort(self) -> None:
        """Drop the connection without a closing handshake (the peer is dead, hung or lying)."""
        self._sock.close()

    def quiet(self) -> bool:
        """Whether the connection is open with no message waiting, asked of an idle one before it is used again:
        between requests a peer sends nothing, so what waits there is its close (a restart, an idle timeout, a
        proxy's), or a late reply that must never be read as the answer to a later request."""
        if self._sock.fileno() < 0:
            return False
        waiting = select.poll()  # not select(): it cannot watch a descriptor of 1024 or more
        waiting.register(self._sock, select.POLLIN)
        with contextlib.suppress(LinkError, OSError, TimeoutError):
            for _ in range(QUIET_READS):  # a ping is answered; its close frame or end of file ends the connection
                if self._protocol.state is not State.OPEN or self._messages_waiting() or not self._readable(waiting):
                    break
                self._pump(time.monotonic() + CLOSE_FRAME_WAIT_S)
        self._frames = [frame for frame in self._frames if frame.opcode not in _CONTROL]  # pings, answered
        return (
            self._protocol.state is State.OPEN
            and self._protocol.close_rcvd is None
            and self._write_error is None
            and not self._frames
        )

    def _messages_waiting(self) -> bool:
        return any(frame.opcode not in _CONTROL for frame in self._frames)

    def _readable(self, waiting: select.poll) -> bool:
        """Bytes to read now: in the socket, or decrypted already and held by TLS (which ``poll`` cannot see)."""
        return bool(waiting.poll(0)) or (isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0)

    # -- plumbing ----------------------------------------------------------------------------------

    def _pump(self, deadline: float) -> None:
        """Read once from the socket (waiting until ``deadline``) and feed the protocol."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data before the deadline")
        self._sock.settimeout(remaining)
        try:
            count = self._sock.recv_into(self._buffer)
        except TimeoutError:
            raise
        except OSError as exc:  # reset by a peer that died
            self._protocol.receive_eof()
            self._discard_writes()
            raise LinkClosed(f"the connection broke ({exc})") from exc
        if count == 0:
            self._protocol.receive_eof()
        else:
            # websockets copies the chunk into its own buffer: a view of ours saves a copy per read
            self._protocol.receive_data(cast(bytes, memoryview(self._buffer)[:count]))
        self._frames.extend(e for e in self._protocol.events_received() if isinstance(e, Frame))
        # pongs, and our half of a closing handshake; a peer that dropped the connection after its close frame
        # breaks this write, and its close frame (why it closed) is what the caller reads, not the broken pipe
        with contextlib.suppress(LinkClosed):
            self._flush(deadline)

    def _flush(self, deadline: float) -> None:
        for chunk in self._protocol.data_to_send():
            if self._write_error is not None:
                continue  # nothing reaches the peer any more (pongs, a close frame): only reading is left
            try:
                if chunk:
                    self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    self._sock.sendall(chunk)
                else:  # the protocol asks to half-close the TCP connection
                    self._sock.shutdown(socket.SHUT_WR)
            except TimeoutError:
                raise
            except OSError as exc:
                # The peer is gone, but the replies it sent before may sit in our socket: the read side
                # stays open, and reading reports the end once they are read (EOF or a reset).
                self._write_error = exc
                raise LinkClosed(f"the connection broke ({exc})") from exc

    def _close_frame_left(self) -> LinkClosed | None:
        """The peer's close frame, where a write failed because the peer had closed first (it may say
        why, as an idle timeout does): read what the socket still holds, briefly."""
        deadline = time.monotonic() + CLOSE_FRAME_WAIT_S
        with contextlib.suppress(LinkError, OSError, TimeoutError):
            while self._protocol.close_rcvd is None and self._protocol.state is not State.CLOSED:
                self._pump(deadline)
        return self._closed() if self._protocol.close_rcvd is not None else None

    def _discard_writes(self) -> None:
        self._protocol.data_to_send()

    def _closed(self) -> LinkClosed:
        received, sent = self._protocol.close_rcvd, self._protocol.close_sent
        if received is not None:
            return LinkClosed(
                f"the peer closed the connection ({received.code} {received.reason})".rstrip(),
                code=received.code,
                reason=received.reason,
            )
        if sent is not None and self._protocol.parser_exc is not None:  # this side refused what the peer sent
            return LinkClosed(  # a frame over max_size (1009), a protocol violation (1002) ...
                f"this side closed the connection on a frame the peer sent ({sent.code} {sent.reason})".rstrip(),
                code=sent.code,
                reason=sent.reason,
                refused_here=True,
            )
        return LinkClosed("the connection closed without a close frame")


def header_seconds(value: str | None) -> float | None:
    """A header's seconds (``None`` where absent or no finite count of seconds: an older or other server)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
