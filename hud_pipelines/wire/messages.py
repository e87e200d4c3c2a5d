"""Typed wire messages and the two framings; see ``docs/protocol.md`` for the normative text.

Inside the project every message is *batched*: arrays carry a leading ``[N]`` slot axis, masks are
``[N]`` bool arrays and per-slot fields are lists. :class:`Framing` is applied only at the edge:
``SCALAR`` framing (one env) drops the slot axis on the way out and adds it back on the way in, so
a single env and ``N`` slots go through one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import WireError

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame either side accepts (websockets closes the connection with 1009 above it)."""


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
        """Frame an internal batched value (array, mask or per-slot list) for the wire."""
        if self is Framing.BATCHED:
            return value
        if isinstance(value, np.ndarray):
            row: Any = value[0]  # pyright: ignore[reportUnknownVariableType]
            return row.item() if value.ndim == 1 and value.dtype.kind in "bf" else row
        return value[0]

    def into(self, value: Any, dtype: type | None = None) -> Any:
        """Turn a wire value into the internal batched form (adds the slot axis for ``scalar``)."""
        if self is Framing.BATCHED:
            return value
        if isinstance(value, np.ndarray):
            return value[None]
        if dtype is not None:
            return np.asarray([value], dtype=dtype)
        return [value]


class Phase(StrEnum):
    """Where an error happened; carried by every error frame."""

    HANDSHAKE = "handshake"
    DECODE = "decode"
    RESET = "reset"
    STEP = "step"
    RESULT = "result"
    SERVER = "server"


# ---------------------------------------------------------------------------------------------
# client -> server


@dataclass(frozen=True)
class Hello:
    protocol: int
    framing: Framing | None = None


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
    framing: Framing
    num_envs: int
    contract: dict[str, Any]
    server: str
    hold: str
    max_frame_bytes: int


@dataclass(frozen=True)
class SlotError:
    slot: int
    message: str
    traceback: str | None = None


@dataclass(frozen=True)
class Observation:
    """The reply to ``reset`` and ``step``: the state of every slot after the request."""

    seq: int
    observation: dict[str, npt.NDArray[Any]]
    reward: npt.NDArray[np.float64]
    terminated: npt.NDArray[np.bool_]
    truncated: npt.NDArray[np.bool_]
    success: npt.NDArray[np.bool_]
    status: list[str]
    prompt: list[str] | None = None
    errors: list[SlotError] = field(default_factory=list[SlotError])

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
                "max_frame_bytes": message.max_frame_bytes,
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
                "status": framing.out(message.status),
                "errors": [{"slot": e.slot, "message": e.message, "traceback": e.traceback} for e in message.errors],
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
            }


# ---------------------------------------------------------------------------------------------
# decoding (wire dict -> internal), strict: every problem is a WireError naming the field


class _Fields:
    """Typed access to one decoded frame; unknown or missing keys are errors naming the message."""

    def __init__(self, frame: object, allowed: set[str]) -> None:
        if not isinstance(frame, dict):
            raise WireError(f"a frame must be a msgpack map, got {type(frame).__name__}")
        self.raw: dict[str, Any] = frame  # pyright: ignore[reportUnknownMemberType]
        self.kind = str(self.raw.get("type"))
        unknown = sorted(set(map(str, self.raw)) - allowed - {"type"})
        if unknown:
            raise WireError(f"{self.kind!r} frame has unknown keys {unknown}; allowed: {sorted(allowed)}")

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.raw or self.raw[key] is None:
            if optional:
                return None
            raise WireError(f"{self.kind!r} frame is missing {key!r}")
        value = self.raw[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise WireError(f"{self.kind!r} frame: {key!r} has type {type(value).__name__}")
        return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def message_type(frame: object) -> MessageType:
    if not isinstance(frame, dict) or "type" not in frame:
        raise WireError("a frame must be a msgpack map with a 'type' key")
    kind = frame["type"]  # pyright: ignore[reportUnknownVariableType]
    try:
        return MessageType(kind)
    except ValueError:
        known = ", ".join(t.value for t in MessageType)
        raise WireError(f"unknown message type {kind!r}; known types: {known}") from None


def parse_hello(frame: object) -> Hello:
    fields = _Fields(frame, {"protocol", "framing"})
    if message_type(frame) is not MessageType.HELLO:
        raise WireError(f"the first frame must be 'hello', got {fields.kind!r}")
    framing = fields.get("framing", str, optional=True)
    try:
        return Hello(protocol=fields.get("protocol", int), framing=None if framing is None else Framing(framing))
    except ValueError:
        raise WireError(f"unknown framing {framing!r}; use 'scalar' or 'batched'") from None


def parse_request(frame: object, framing: Framing) -> Request:
    """Decode a client request into its internal (batched) form."""
    kind = message_type(frame)
    match kind:
        case MessageType.RESET:
            fields = _Fields(frame, {"seq", "task"})
            task = fields.get("task", (dict, list), optional=True)
            tasks: list[Any] = framing.into({} if task is None else task)
            if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise WireError(
                    f"'reset' frame: 'task' must be a map ({framing.value} framing)"
                    if framing is Framing.SCALAR
                    else "'reset' frame: 'task' must be a list of maps, one per slot (batched framing)"
                )
            return Reset(seq=fields.get("seq", int), tasks=tasks)
        case MessageType.STEP:
            fields = _Fields(frame, {"seq", "action"})
            action = fields.get("action", np.ndarray)
            return Step(seq=fields.get("seq", int), action=framing.into(action))
        case MessageType.RESULT:
            fields = _Fields(frame, {"seq"})
            return ResultRequest(seq=fields.get("seq", int))
        case MessageType.CLOSE:
            _Fields(frame, set())
            return Close()
        case _:
            raise WireError(f"a client may not send {kind.value!r} frames; send reset, step, result or close")


def parse_reply(frame: object, framing: Framing) -> Reply:
    """Decode a server frame into its internal (batched) form."""
    kind = message_type(frame)
    match kind:
        case MessageType.HELLO:
            f = _Fields(frame, {"protocol", "framing", "num_envs", "contract", "server", "hold", "max_frame_bytes"})
            return ServerHello(
                protocol=f.get("protocol", int),
                framing=Framing(f.get("framing", str)),
                num_envs=f.get("num_envs", int),
                contract=f.get("contract", dict),
                server=f.get("server", str),
                hold=f.get("hold", str),
                max_frame_bytes=f.get("max_frame_bytes", int),
            )
        case MessageType.OBSERVATION:
            f = _Fields(
                frame,
                {"seq", "observation", "reward", "terminated", "truncated", "success", "status", "prompt", "errors"},
            )
            observation: dict[str, Any] = f.get("observation", dict)
            prompt = f.get("prompt", (str, list), optional=True)
            return Observation(
                seq=f.get("seq", int),
                observation={str(k): framing.into(v) for k, v in observation.items()},
                reward=framing.into(f.get("reward", (float, int, np.ndarray)), np.float64),
                terminated=framing.into(f.get("terminated", (bool, np.ndarray)), np.bool_),
                truncated=framing.into(f.get("truncated", (bool, np.ndarray)), np.bool_),
                success=framing.into(f.get("success", (bool, np.ndarray)), np.bool_),
                status=framing.into(f.get("status", (str, list))),
                prompt=None if prompt is None else framing.into(prompt),
                errors=[
                    SlotError(slot=e["slot"], message=e["message"], traceback=e.get("traceback"))
                    for e in f.get("errors", list, optional=True) or []
                ],
            )
        case MessageType.RESULT:
            f = _Fields(frame, {"seq", "score", "success", "slots"})
            return Result(
                seq=f.get("seq", int),
                score=float(f.get("score", (float, int))),
                success=f.get("success", bool),
                slots=f.get("slots", list),
            )
        case MessageType.ERROR:
            f = _Fields(frame, {"seq", "phase", "slot", "message", "traceback"})
            return ErrorFrame(
                phase=f.get("phase", str),
                message=f.get("message", str),
                seq=f.get("seq", int, optional=True),
                slot=f.get("slot", int, optional=True),
                traceback=f.get("traceback", str, optional=True),
            )
        case MessageType.CLOSE:
            return Close()
        case _:
            raise WireError(f"a server may not send {kind.value!r} frames")
