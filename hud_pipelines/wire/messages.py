"""Typed wire messages, the two framings and each message's wire form; see ``docs/protocol.md``.

Inside the project every message is *batched*: arrays carry a leading ``[N]`` slot axis, masks are
``[N]`` bool arrays and per-slot fields are lists. :class:`Framing` is applied only at the edge:
``SCALAR`` framing (one env) drops the slot axis on the way out (:func:`to_wire`) and adds it back
on the way in (:mod:`.parse`), so a single env and ``N`` slots go through one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.wire.codec import is_array

PROTOCOL_VERSION = 4
"""2: every ``observation`` says whether each slot's env reports success at all (``success_reported``);
3: and whether it reported success on the slot's latest step (``success_now``), so success at the end is known;
4: an ``error`` the env's own code caused says so (``cause: env``: the env's fault, not the link's), and the
hello's ``sim`` carries the digests of the sim's code (``sources``)."""


class SessionState(StrEnum):
    """Where either end of one connection stands: the ``hello`` first, then requests until it closes."""

    HANDSHAKE = "handshake"
    SERVING = "serving"
    CLOSED = "closed"
    """Closed by either side, or no longer usable: a rule of the protocol was broken, the transport failed."""


DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame either side accepts (websockets closes the connection with 1009 above it)."""


UPGRADE_TIMEOUT_S = 10.0
"""How long the opening HTTP upgrade may take on the server, its wait for a closing connection included."""
CLOSING_WAIT_S = 5.0
"""How long a new connection waits on the server for a closing one to let go of the sim before it gets a 409; a
client's handshake deadline covers it, so that the 409 (and what it says) reaches the client."""
RUNNING_FOR_HEADER = "Hud-Running-For"
"""Of a 409: seconds the sim has been running a request of a connection that has gone, with no reply."""


class CloseCode(IntEnum):
    """WebSocket close codes this server uses (RFC 6455, section 7.4.1)."""

    NORMAL = 1000
    """The client sent ``close``."""
    GOING_AWAY = 1001
    """The sim is shutting down."""
    PROTOCOL_ERROR = 1002
    """The handshake failed: no ``hello``, a wrong protocol version or an impossible framing."""
    MESSAGE_TOO_BIG = 1009
    """A frame exceeded ``max_frame_bytes`` (sent by the WebSocket layer itself)."""
    INTERNAL_ERROR = 1011
    """Serving a request failed in the server itself (a bug: the error is logged)."""
    TRY_AGAIN_LATER = 1013
    """Another connection drives the sim (normally refused earlier with HTTP 409)."""
    IDLE_TIMEOUT = 4408
    """The client sent nothing for ``--idle-timeout-s`` after its hello (private-use code, like HTTP 408)."""


class MessageType(StrEnum):
    HELLO = "hello"
    RESET = "reset"
    STEP = "step"
    OBSERVATION = "observation"
    RESULT = "result"
    ERROR = "error"
    CLOSE = "close"


class Framing(StrEnum):
    """How arrays are framed: ``scalar`` for one env, ``batched`` (leading ``[N]`` axis) for N slots."""

    SCALAR = "scalar"
    BATCHED = "batched"

    def out(self, value: Any) -> Any:
        """Frame an internal batched value (array, mask or per-slot list) for the wire.

        ``scalar`` framing sends row 0 without the slot axis; a one-dimensional float or bool array
        (a reward, a done mask) becomes a plain msgpack float or bool.
        """
        if self is Framing.BATCHED:
            return value
        if is_array(value):
            return value[0].item() if value.ndim == 1 and value.dtype.kind in "bf" else value[0]
        return value[0]

    def into(self, value: Any, dtype: npt.DTypeLike | None = None) -> Any:
        """Turn a wire value into the internal batched form (adds the slot axis for ``scalar``)."""
        if self is Framing.BATCHED:
            return value
        if is_array(value):
            return value[None]
        if dtype is not None:
            return np.asarray([value], dtype=dtype)
        return [value]


# ---------------------------------------------------------------------------------------------
# client -> server


@dataclass(frozen=True)
class Hello:
    protocol: int
    framing: Framing | None = None
    """``None`` lets the server choose: ``scalar`` for one slot, else ``batched``."""


@dataclass(frozen=True)
class Reset:
    seq: int
    tasks: list[dict[str, Any]]
    """One task per slot: ``seed``, ``options`` and build arguments (see the bridge)."""


@dataclass(frozen=True)
class Step:
    seq: int
    action: npt.NDArray[Any]
    """``[N, A]`` in the internal (batched) form."""


@dataclass(frozen=True)
class ResultRequest:
    seq: int


@dataclass(frozen=True)
class Close:
    pass


Request = Reset | Step | ResultRequest | Close


# ---------------------------------------------------------------------------------------------
# server -> client


@dataclass(frozen=True)
class ServerHello:
    protocol: int
    """The protocol version the server speaks."""
    framing: Framing
    """The connection's framing: the client's choice, else ``scalar`` for one slot and ``batched`` for more."""
    num_envs: int
    """The slots every request addresses."""
    contract: dict[str, Any]
    """The sim's contract as JSON (features, control rate, robot type)."""
    server: str
    hold: str
    """What a finished slot receives while the others step: its ``last`` action or ``zero``."""
    max_frame_bytes: int
    """The largest frame the server accepts."""
    bounds: str = "clip"
    """How out-of-bounds continuous actions are treated: ``clip`` or ``error``."""
    sim: dict[str, Any] = field(default_factory=dict[str, Any])
    """What the sim says it is: factory, build arguments, interpreter, package versions
    (:mod:`hud_pipelines.sim.identity`); how a client tells two differently started servers apart."""


@dataclass(frozen=True)
class SlotError:
    slot: int
    message: str
    traceback: str | None = None
    cause: str = "env"
    """What ended the slot: ``env`` (its env raised), ``action`` (its row was refused) or ``nonfinite``."""


@dataclass(frozen=True)
class Observation:
    """The reply to ``reset`` and ``step``: the state of every slot after the request."""

    seq: int
    observation: dict[str, npt.NDArray[Any]]
    reward: npt.NDArray[np.float64]
    terminated: npt.NDArray[np.bool_]
    truncated: npt.NDArray[np.bool_]
    success: npt.NDArray[np.bool_]
    success_reported: npt.NDArray[np.bool_]
    """Whether the slot's env gave a success signal in this episode (sticky). It decides what the
    episode's score is: its success (1 or 0) when reported, else its return."""
    success_now: npt.NDArray[np.bool_]
    """Whether the slot's env reported success on the slot's latest step (not sticky): on the frame that
    ends an episode, its success at the end (ManiSkill's ``success_at_end``) where ``success`` is its
    success at any step."""
    status: list[str]
    prompt: list[str] | None = None
    errors: list[SlotError] = field(default_factory=list[SlotError])
    """Slots that became errored in this request: their env raised, their action row was refused, or
    their observation or reward was not finite."""
    nonfinite: list[int] = field(default_factory=list[int])
    """Slots whose observation holds NaN or infinity in this frame (passed on as it came, flagged, and
    ended as errored: each is in ``errors`` too)."""

    @property
    def num_slots(self) -> int:
        return len(self.status)


@dataclass(frozen=True)
class Result:
    seq: int
    score: float
    success: bool
    slots: list[dict[str, Any]]


@dataclass(frozen=True)
class ErrorFrame:
    phase: str
    message: str
    seq: int | None = None
    slot: int | None = None
    traceback: str | None = None
    cause: str | None = None
    """``env`` when the env's own code raised (its episodes end as the env's fault); absent otherwise."""


Reply = ServerHello | Observation | Result | ErrorFrame | Close


# ---------------------------------------------------------------------------------------------
# encoding (internal -> wire dict)


def to_wire(message: Request | Reply | Hello, framing: Framing = Framing.BATCHED) -> dict[str, Any]:
    """The wire dict of ``message`` under ``framing`` (pass it to ``codec.packb``)."""
    match message:
        case Hello(protocol=protocol, framing=requested):
            out: dict[str, Any] = {"type": MessageType.HELLO.value, "protocol": protocol}
            if requested is not None:
                out["framing"] = requested.value
            return out
        case Reset(seq=seq, tasks=tasks):
            return {"type": MessageType.RESET.value, "seq": seq, "task": framing.out(tasks)}
        case Step(seq=seq, action=action):
            return {"type": MessageType.STEP.value, "seq": seq, "action": framing.out(action)}
        case ResultRequest(seq=seq):
            return {"type": MessageType.RESULT.value, "seq": seq}
        case Close():
            return {"type": MessageType.CLOSE.value}
        case ServerHello():
            return {
                "type": MessageType.HELLO.value,
                "protocol": message.protocol,
                "framing": message.framing.value,
                "num_envs": message.num_envs,
                "contract": message.contract,
                "server": message.server,
                "hold": message.hold,
                "bounds": message.bounds,
                "max_frame_bytes": message.max_frame_bytes,
                "sim": message.sim,
            }
        case Observation():
            out = {
                "type": MessageType.OBSERVATION.value,
                "seq": message.seq,
                "observation": {k: framing.out(v) for k, v in message.observation.items()},
                "reward": framing.out(message.reward),
                "terminated": framing.out(message.terminated),
                "truncated": framing.out(message.truncated),
                "success": framing.out(message.success),
                "success_reported": framing.out(message.success_reported),
                "success_now": framing.out(message.success_now),
                "status": framing.out(message.status),
                "errors": [
                    {"slot": e.slot, "message": e.message, "traceback": e.traceback, "cause": e.cause}
                    for e in message.errors
                ],
                "nonfinite": list(message.nonfinite),
            }
            if message.prompt is not None:
                out["prompt"] = framing.out(message.prompt)
            return out
        case Result():
            return {
                "type": MessageType.RESULT.value,
                "seq": message.seq,
                "score": message.score,
                "success": message.success,
                "slots": message.slots,
            }
        case ErrorFrame():
            return {
                "type": MessageType.ERROR.value,
                "seq": message.seq,
                "phase": message.phase,
                "slot": message.slot,
                "message": message.message,
                "traceback": message.traceback,
                **({"cause": message.cause} if message.cause is not None else {}),
            }
