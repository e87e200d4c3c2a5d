"""A link to a bridge served in this process: the real server session, no socket, no thread.

:class:`InProcessLink` is to :class:`~hud_pipelines.sim.link.WebSocketLink` what httpx's
``MockTransport`` is to its network transport: every frame the client sends goes through the same
server :class:`~hud_pipelines.sim.session.Session` a served sim runs (handshake, decoding,
sequence numbers, the bridge, encoding), and its reply waits for :meth:`InProcessLink.recv`. So a
test of the client, the agent loop or anything that drives a sim exercises every byte of the wire
against a real env in milliseconds, with no child process. What it cannot show is the transport
itself: deadlines, a dying child, the WebSocket layer (the served tests do).

The server session answers each request before :meth:`~InProcessLink.send` returns, so a missing
reply can never come later: :meth:`~InProcessLink.recv` then raises ``TimeoutError`` at once.
"""

from __future__ import annotations

import collections

from hud_pipelines.errors import LinkClosed
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.session import Session
from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES

LEFT_MID_EPISODE = "client disconnected mid-episode"
"""The reason a served sim gives the episodes a vanished client left running (the same here)."""


class InProcessLink:
    """One connection to ``bridge`` (a started bridge), as a served sim would hold it."""

    url = "in-process://bridge"

    def __init__(self, bridge: GymBridge, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.bridge = bridge
        self.max_frame_bytes = max_frame_bytes
        self._session = Session(bridge, max_frame_bytes=max_frame_bytes)
        self._replies: collections.deque[bytes] = collections.deque()
        self._closed: LinkClosed | None = None

    def send(self, data: bytes, timeout_s: float) -> None:
        """Serve one frame now; its reply (if any) waits for :meth:`recv`."""
        if self._closed is not None:
            raise self._closed
        if len(data) > self.max_frame_bytes:  # the WebSocket layer's limit, as a served sim applies it
            self._end(LinkClosed(f"the frame of {len(data)} bytes is over the limit", code=1009))
            return
        outcome = self._session.receive(data)
        if outcome.reply is not None:
            self._replies.append(outcome.reply)
        if outcome.close is not None:
            self._closed = LinkClosed(
                f"the peer closed the connection ({int(outcome.close)} {outcome.reason})".rstrip(),
                code=int(outcome.close),
                reason=outcome.reason,
            )

    def recv(self, timeout_s: float) -> bytes:
        """The oldest reply not yet read."""
        if self._replies:
            return self._replies.popleft()
        if self._closed is not None:
            raise self._closed
        raise TimeoutError("the in-process sim has no reply waiting: nothing was asked that it did not answer")

    def close(self, timeout_s: float = 1.0) -> None:
        """End the connection; episodes still running end as errored, as a served sim ends them."""
        self._end(LinkClosed("the connection was closed", code=1000))

    def abort(self) -> None:
        self._end(LinkClosed("the connection was dropped"))

    def quiet(self) -> bool:
        return self._closed is None and not self._replies

    def _end(self, reason: LinkClosed) -> None:
        if self._closed is None:
            self._closed = reason
        self._replies.clear()
        self._session.abort(LEFT_MID_EPISODE)
