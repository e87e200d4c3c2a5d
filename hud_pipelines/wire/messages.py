"""Typed wire messages and the two framings; see ``docs/protocol.md`` for the normative text.

Inside the project every message is *batched*: arrays carry a leading ``[N]`` slot axis, masks are
``[N]`` bool arrays and per-slot fields are lists. :class:`Framing` is applied only at the edge:
``SCALAR`` framing (one env) drops the slot axis on the way out and adds it back on the way in, so
a single env and ``N`` slots go through one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

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
        """Frame an internal batched value (array, mask or per-slot list) for the wire.

        ``scalar`` framing sends row 0 without the slot axis; a one-dimensional float or bool array
        (a reward, a done mask) becomes a plain msgpack float or bool.
        """
        if self is Framing.BATCHED:
            return value
        if isinstance(value, np.ndarray):
            array = cast("npt.NDArray[Any]", value)
            return array[0].item() if array.ndim == 1 and array.dtype.kind in "bf" else array[0]
        return cast("list[Any]", value)[0]

    def into(self, value: Any, dtype: type | None = None) -> Any:
        """Turn a wire value into the internal batched form (adds the slot axis for ``scalar``)."""
        if self is Framing.BATCHED:
            return value
        if isinstance(value, np.ndarray):
            return cast("npt.NDArray[Any]", value)[None]
        if dtype is not None:
            return cast("npt.NDArray[Any]", np.asarray([value], dtype=dtype))
        return [value]


class Phase(StrEnum):
    """Where an error happened; carried by every error frame."""

    HANDSHAKE = "handshake"
    """The first frame was not an acceptable ``hello`` (the server closes with 1002 after it)."""
    DECODE = "decode"
    """A frame could not be decoded or is not a valid request; nothing reached the sim."""
    SEQUENCE = "sequence"
    """A request's ``seq`` was not above the previous one (duplicate or replayed); it was not run."""
    RESET = "reset"
    STEP = "step"
    RESULT = "result"
    SERVER = "server"
    """The server itself failed (for example it is shutting down)."""


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
    framing: Framing
    num_envs: int
    contract: dict[str, Any]
    server: str
    hold: str
    max_frame_bytes: int
    bounds: str = "clip"
    """How out-of-bounds continuous actions are treated: ``clip`` or ``error``."""


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
            }


# ---------------------------------------------------------------------------------------------
# decoding (wire dict -> internal), strict: every problem is a WireError naming the field


class _Fields:
    """Typed access to one decoded frame; unknown or missing keys are errors naming the message."""

    def __init__(self, frame: object, allowed: set[str]) -> None:
        if not isinstance(frame, dict):
            raise WireError(f"a frame must be a msgpack map, got {type(frame).__name__}")
        self.raw = cast("dict[Any, Any]", frame)
        self.kind = str(self.raw.get("type"))
        unknown = sorted(set(map(str, self.raw)) - allowed - {"type"})
        if unknown:
            raise WireError(f"{self.kind!r} frame has unknown keys {unknown}; allowed: {sorted(allowed)}")

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        value: object = self.raw.get(key)
        if value is None:
            if optional:
                return None
            raise WireError(f"{self.kind!r} frame is missing {key!r}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            expected = " or ".join(t.__name__ for t in _as_tuple(types))
            raise WireError(f"{self.kind!r} frame: {key!r} must be {expected}, got {type(value).__name__}")
        return value

    def per_slot(self, key: str, framing: Framing, dtype: type, num_slots: int | None) -> npt.NDArray[Any]:
        """A per-slot number or bool: a plain value under ``scalar`` framing, an ``[N]`` array under ``batched``."""
        if framing is Framing.SCALAR:
            kinds: tuple[type, ...] = (bool,) if dtype is np.bool_ else (float, int)
            return cast("npt.NDArray[Any]", np.asarray([self.get(key, kinds)], dtype=dtype))
        array: npt.NDArray[Any] = self.get(key, np.ndarray)
        if array.ndim != 1 or (num_slots is not None and array.shape[0] != num_slots):
            raise WireError(f"{self.kind!r} frame: {key!r} must have shape [N={num_slots}], got {list(array.shape)}")
        return cast("npt.NDArray[Any]", array.astype(dtype, copy=False))

    def strings(self, key: str, framing: Framing, *, optional: bool = False) -> list[str] | None:
        """A per-slot string: a plain string under ``scalar`` framing, a list of strings under ``batched``."""
        if framing is Framing.SCALAR:
            value = self.get(key, str, optional=optional)
            return None if value is None else [value]
        items = self.get(key, list, optional=optional)
        if items is None:
            return None
        values = cast("list[object]", items)
        if not all(isinstance(v, str) for v in values):
            raise WireError(f"{self.kind!r} frame: {key!r} must be a list of strings")
        return cast("list[str]", values)


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def message_type(frame: object) -> MessageType:
    if not isinstance(frame, dict) or "type" not in frame:
        raise WireError("a frame must be a msgpack map with a 'type' key")
    kind: object = cast("dict[Any, Any]", frame)["type"]
    try:
        return MessageType(kind)
    except ValueError:
        known = ", ".join(t.value for t in MessageType)
        raise WireError(f"unknown message type {kind!r}; known types: {known}") from None


def parse_hello(frame: object) -> Hello:
    if message_type(frame) is not MessageType.HELLO:
        kind: object = cast("dict[Any, Any]", frame)["type"]
        raise WireError(f"the first frame must be 'hello', got {kind!r}")
    fields = _Fields(frame, {"protocol", "framing"})
    framing = fields.get("framing", str, optional=True)
    protocol = fields.get("protocol", int)
    try:
        return Hello(protocol=protocol, framing=None if framing is None else Framing(framing))
    except ValueError:
        raise WireError(f"unknown framing {framing!r}; use 'scalar' or 'batched'") from None


def parse_request(frame: object, framing: Framing, num_slots: int | None = None) -> Request:
    """Decode a client request into its internal (batched) form.

    ``num_slots`` lets a batched ``reset`` without ``task`` mean one empty task per slot.
    """
    kind = message_type(frame)
    match kind:
        case MessageType.RESET:
            fields = _Fields(frame, {"seq", "task"})
            seq = fields.get("seq", int)
            task: object = fields.get("task", (dict, list), optional=True)
            if task is None:
                empty: dict[str, Any] = {}
                task = empty if framing is Framing.SCALAR else [dict(empty) for _ in range(num_slots or 1)]
            tasks: object = framing.into(task)
            if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in cast("list[object]", tasks)):
                raise WireError(
                    "'reset' frame: 'task' must be a map (scalar framing)"
                    if framing is Framing.SCALAR
                    else "'reset' frame: 'task' must be a list of maps, one per slot (batched framing)"
                )
            return Reset(seq=seq, tasks=cast("list[dict[str, Any]]", tasks))
        case MessageType.STEP:
            fields = _Fields(frame, {"seq", "action"})
            seq = fields.get("seq", int)
            action = fields.get("action", np.ndarray)
            return Step(seq=seq, action=framing.into(action))
        case MessageType.RESULT:
            fields = _Fields(frame, {"seq"})
            return ResultRequest(seq=fields.get("seq", int))
        case MessageType.CLOSE:
            _Fields(frame, set())
            return Close()
        case _:
            raise WireError(f"a client may not send {kind.value!r} frames here; send reset, step, result or close")


def parse_reply(frame: object, framing: Framing, num_slots: int | None = None) -> Reply:
    """Decode a server frame into its internal (batched) form; ``num_slots`` checks the slot axis."""
    kind = message_type(frame)
    match kind:
        case MessageType.HELLO:
            f = _Fields(
                frame, {"protocol", "framing", "num_envs", "contract", "server", "hold", "bounds", "max_frame_bytes"}
            )
            try:
                chosen = Framing(f.get("framing", str))
            except ValueError:
                raise WireError(f"'hello' frame: unknown framing {f.raw.get('framing')!r}") from None
            return ServerHello(
                protocol=f.get("protocol", int),
                framing=chosen,
                num_envs=f.get("num_envs", int),
                contract=f.get("contract", dict),
                server=f.get("server", str),
                hold=f.get("hold", str),
                bounds=f.get("bounds", str, optional=True) or "clip",
                max_frame_bytes=f.get("max_frame_bytes", int),
            )
        case MessageType.OBSERVATION:
            f = _Fields(
                frame,
                {
                    "seq",
                    "observation",
                    "reward",
                    "terminated",
                    "truncated",
                    "success",
                    "status",
                    "prompt",
                    "errors",
                    "nonfinite",
                },
            )
            observation: dict[Any, Any] = f.get("observation", dict)
            arrays: dict[str, npt.NDArray[Any]] = {}
            for key, value in observation.items():
                if not isinstance(value, np.ndarray):
                    raise WireError(f"'observation' frame: feature {key!r} must be an array")
                array = cast("npt.NDArray[Any]", framing.into(value))
                if num_slots is not None and (array.ndim == 0 or array.shape[0] != num_slots):
                    raise WireError(
                        f"'observation' frame: feature {key!r} has shape {list(array.shape)}, not [N={num_slots}, ...]"
                    )
                arrays[str(key)] = array
            status = f.strings("status", framing)
            assert status is not None
            return Observation(
                seq=f.get("seq", int),
                observation=arrays,
                reward=f.per_slot("reward", framing, np.float64, num_slots),
                terminated=f.per_slot("terminated", framing, np.bool_, num_slots),
                truncated=f.per_slot("truncated", framing, np.bool_, num_slots),
                success=f.per_slot("success", framing, np.bool_, num_slots),
                status=status,
                prompt=f.strings("prompt", framing, optional=True),
                errors=_slot_errors(f.get("errors", list, optional=True) or []),
                nonfinite=_ints(f.get("nonfinite", list, optional=True) or [], "nonfinite"),
            )
        case MessageType.RESULT:
            f = _Fields(frame, {"seq", "score", "success", "slots"})
            slots = cast("list[object]", f.get("slots", list))
            if not all(isinstance(s, dict) for s in slots):
                raise WireError("'result' frame: 'slots' must be a list of maps")
            return Result(
                seq=f.get("seq", int),
                score=float(f.get("score", (float, int))),
                success=f.get("success", bool),
                slots=cast("list[dict[str, Any]]", slots),
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


def _slot_errors(items: list[object]) -> list[SlotError]:
    errors: list[SlotError] = []
    for item in items:
        fields = _Fields(item, {"slot", "message", "traceback", "cause"})
        fields.kind = "errors[]"
        errors.append(
            SlotError(
                slot=fields.get("slot", int),
                message=fields.get("message", str),
                traceback=fields.get("traceback", str, optional=True),
                cause=fields.get("cause", str, optional=True) or "env",
            )
        )
    return errors


def _ints(items: list[object], key: str) -> list[int]:
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise WireError(f"'observation' frame: {key!r} must be a list of slot numbers")
    return cast("list[int]", items)
