"""One client connection's protocol, sans I/O: bytes in, bytes out, run on the sim's main thread.

A :class:`Session` is fed every frame the client sends and answers with the frame to send back
(and, when the connection must end, a WebSocket close code). It owns everything the protocol
says about a connection:

- the handshake: the first frame must be ``hello`` with this server's protocol version; the reply
  carries the framing, ``num_envs``, the contract, the hold mode and the frame size limit;
- decoding: a frame that is not valid msgpack, not a known request or not well-formed is answered
  with an ``error`` frame of phase ``decode`` (carrying the request's ``seq`` whenever the frame's
  top level still shows one) and never reaches the sim;
- sequence numbers: every request's ``seq`` must be above the previous one, else it is refused
  with phase ``sequence`` (a duplicate or replayed step is never applied twice);
- dispatch to the bridge, where every failure becomes an ``error`` frame (an env exception carries
  its traceback and, when one slot caused it, the slot);
- the connection's own state: a successful hello starts the bridge's records and build arguments
  afresh (:meth:`GymBridge.begin_connection`), so nothing of an earlier client reaches this one.

Decoding, the sim touch and encoding all run in one main-thread job (the server then sends the
reply from that same thread), so the serving threads only move bytes, and an observation is
encoded straight from the bridge's buffers before the next request can change them.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from hud_pipelines.errors import EnvFault, HudPipelinesError, Phase, WireError
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.identity import sim_identity
from hud_pipelines.wire.codec import packb, peek_seq, unpackb
from hud_pipelines.wire.messages import (
    PROTOCOL_VERSION,
    Close,
    CloseCode,
    ErrorFrame,
    Framing,
    MessageType,
    Reply,
    Reset,
    Result,
    ResultRequest,
    ServerHello,
    SessionState,
    Step,
    to_wire,
)
from hud_pipelines.wire.parse import message_type, parse_hello, parse_request

log = logging.getLogger(__name__)
SERVER_NAME = f"hud-pipelines/{PROTOCOL_VERSION}"


@dataclass(frozen=True)
class Outcome:
    """What to do after one frame: send ``reply`` (if any), then close with ``close`` (if set)."""

    reply: bytes | None
    close: CloseCode | None = None
    reason: str = ""


class Session:
    """The protocol state of one connection to ``bridge``."""

    def __init__(self, bridge: GymBridge, *, max_frame_bytes: int) -> None:
        self.bridge = bridge
        self.max_frame_bytes = max_frame_bytes
        self.state = SessionState.HANDSHAKE
        self.framing = Framing.BATCHED
        self.last_seq = 0
        self.said_goodbye = False
        """Whether the client ended the connection with a ``close`` frame: slots it left running are
        episodes it ended itself (at its own ``max_steps``), not a client that vanished."""

    def receive(self, frame: bytes | str) -> Outcome:
        """Handle one frame from the client."""
        match self.state:
            case SessionState.HANDSHAKE:
                return self._hello(frame)
            case SessionState.SERVING:
                return self._request(frame)
            case SessionState.CLOSED:
                return Outcome(None, CloseCode.NORMAL)

    # -- handshake ---------------------------------------------------------------------------------

    def _hello(self, frame: bytes | str) -> Outcome:
        try:
            hello = parse_hello(unpackb(frame))
        except WireError as exc:
            return self._refuse(str(exc))
        if hello.protocol != PROTOCOL_VERSION:
            return self._refuse(
                f"protocol version {hello.protocol} is not supported; this sim speaks {PROTOCOL_VERSION}"
            )
        num_envs = self.bridge.num_envs
        framing = hello.framing or (Framing.SCALAR if num_envs == 1 else Framing.BATCHED)
        if framing is Framing.SCALAR and num_envs != 1:
            return self._refuse(
                f"scalar framing needs num_envs == 1; this sim serves {num_envs} slots, use batched framing"
            )
        self.framing = framing
        self.state = SessionState.SERVING
        self.bridge.begin_connection()
        reply = ServerHello(
            protocol=PROTOCOL_VERSION,
            framing=framing,
            num_envs=num_envs,
            contract=self.bridge.contract.model_dump(mode="json", exclude_none=True),
            server=SERVER_NAME,
            hold=self.bridge.hold.value,
            bounds=self.bridge.bounds.value,
            max_frame_bytes=self.max_frame_bytes,
            sim=sim_identity(self.bridge.factory.spec, self.bridge.operator_args),
        )
        return Outcome(packb(to_wire(reply, framing)))

    def _refuse(self, message: str) -> Outcome:
        self.state = SessionState.CLOSED
        frame = packb(to_wire(ErrorFrame(phase=Phase.HANDSHAKE, message=message)))
        return Outcome(frame, CloseCode.PROTOCOL_ERROR, message[:120])

    # -- requests ----------------------------------------------------------------------------------

    def _request(self, frame: bytes | str) -> Outcome:
        try:
            request = parse_request(unpackb(frame), self.framing, self.bridge.num_envs)
        except WireError as exc:
            return self._error(ErrorFrame(phase=Phase.DECODE, seq=peek_seq(frame), message=str(exc)))
        if isinstance(request, Close):
            self.state = SessionState.CLOSED
            self.said_goodbye = True
            return Outcome(packb(to_wire(Close())), CloseCode.NORMAL)
        if request.seq <= self.last_seq:
            message = (
                f"sequence number {request.seq} is not above the last one ({self.last_seq}): a duplicate or "
                "replayed request is never run"
            )
            return self._error(ErrorFrame(phase=Phase.SEQUENCE, seq=request.seq, message=message))
        self.last_seq = request.seq
        reply = self._dispatch(request)
        try:
            return Outcome(packb(to_wire(reply, self.framing)))
        except WireError as exc:  # e.g. an env whose observation dtype cannot travel
            phase = Phase.RESET if isinstance(request, Reset) else Phase.STEP
            return self._error(ErrorFrame(phase=phase, seq=request.seq, message=f"cannot encode the reply: {exc}"))

    def _error(self, frame: ErrorFrame) -> Outcome:
        return Outcome(packb(to_wire(frame)))

    def _dispatch(self, request: Reset | Step | ResultRequest) -> Reply:
        """Run one request against the bridge; every failure becomes an error frame."""
        phase = _PHASES[type(request)]
        seq = request.seq
        try:
            match request:
                case Reset(tasks=tasks):
                    return self.bridge.reset(tasks, seq, copy=False)
                case Step(action=action):
                    return self.bridge.step(action, seq, copy=False, scalar=self.framing is Framing.SCALAR)
                case ResultRequest():
                    graded: dict[str, Any] = self.bridge.result()
                    return Result(seq=seq, score=graded["score"], success=graded["success"], slots=graded["slots"])
        except EnvFault as fault:
            return ErrorFrame(
                phase=fault.phase, seq=seq, slot=fault.slot, message=str(fault), traceback=fault.formatted, cause="env"
            )
        except HudPipelinesError as exc:
            return ErrorFrame(phase=phase, seq=seq, message=str(exc))
        except Exception as exc:
            log.exception("unexpected failure while serving %s", phase)
            return ErrorFrame(
                phase=phase, seq=seq, message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
            )

    def note_late(self, frame: bytes | str) -> None:
        """A frame that arrived after the connection began to close is not run; a goodbye among them
        still says the client meant to go (a client may close right after its ``close`` frame)."""
        with contextlib.suppress(WireError):  # an undecodable late frame says nothing
            self.said_goodbye = self.said_goodbye or message_type(unpackb(frame)) is MessageType.CLOSE

    def abort(self, reason: str) -> list[int]:
        """The connection ended: running episodes end as errored, so nothing leaks into the next one."""
        self.state = SessionState.CLOSED
        return self.bridge.abort(reason)


_PHASES: dict[type, Phase] = {Reset: Phase.RESET, Step: Phase.STEP, ResultRequest: Phase.RESULT}
