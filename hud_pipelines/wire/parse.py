"""Decoding: a decoded frame (a msgpack map) -> a typed message in its internal, batched form.

Strict, because frames come from the network: an unknown ``type``, an unknown or missing key, a
value of the wrong msgpack type or a per-slot field whose length is not the slot count is a
:class:`~hud_pipelines.errors.WireError` naming the message and the key; nothing half-read
reaches the sim or the agent. Scalar framing gets its slot axis back here
(:meth:`~hud_pipelines.wire.messages.Framing.into`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import WireError
from hud_pipelines.wire import messages
from hud_pipelines.wire.codec import is_array, is_map
from hud_pipelines.wire.messages import Framing, MessageType

_HELLO_KEYS = {"protocol", "framing", "num_envs", "contract", "server", "hold", "bounds", "max_frame_bytes", "sim"}
_OBSERVATION_KEYS = {
    *("seq", "observation", "reward", "terminated", "truncated", "success", "success_reported", "success_now"),
    "status",
    *("prompt", "errors", "nonfinite"),
}


# ---------------------------------------------------------------------------------------------
# the msgpack types a field may have


@dataclass(frozen=True)
class _Kind[T]:
    """A msgpack type a field must have: its name in errors, and the check that narrows to it."""

    name: str
    accepts: Callable[[object], TypeGuard[T]]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float | int]:
    return isinstance(value, float | int) and not isinstance(value, bool)


def _is_bool(value: object) -> TypeGuard[bool]:
    return isinstance(value, bool)


def _is_str(value: object) -> TypeGuard[str]:
    return isinstance(value, str)


def _is_list(value: object) -> TypeGuard[list[object]]:
    return isinstance(value, list)


def _is_task(value: object) -> TypeGuard[dict[Any, Any] | list[object]]:
    return isinstance(value, dict | list)


INT = _Kind("int", _is_int)
NUMBER = _Kind("float or int", _is_number)
BOOL = _Kind("bool", _is_bool)
STR = _Kind("str", _is_str)
MAP = _Kind("dict", is_map)
LIST = _Kind("list", _is_list)
ARRAY = _Kind("ndarray", is_array)
TASK = _Kind("dict or list", _is_task)


def _all_str(values: list[object]) -> TypeGuard[list[str]]:
    return all(isinstance(v, str) for v in values)


def _all_int(values: list[object]) -> TypeGuard[list[int]]:
    return all(_is_int(v) for v in values)


def _all_maps(values: list[object]) -> TypeGuard[list[dict[str, Any]]]:
    return all(isinstance(v, dict) for v in values)


def _is_task_list(value: object) -> TypeGuard[list[dict[str, Any]]]:
    return _is_list(value) and _all_maps(value)


class _Fields:
    """Typed access to one decoded frame; unknown or missing keys are errors naming the message."""

    def __init__(self, frame: object, allowed: set[str], *, kind: str | None = None) -> None:
        if not is_map(frame):
            raise WireError(f"a frame must be a msgpack map, got {type(frame).__name__}")
        self.raw = frame
        self.kind = kind or str(frame.get("type"))
        outside = frame.keys() - allowed  # one set operation: this runs for every frame
        if outside and not (len(outside) == 1 and "type" in outside):
            unknown = sorted(set(map(str, frame)) - allowed - {"type"})
            raise WireError(f"{self.kind!r} frame has unknown keys {unknown}; allowed: {sorted(allowed)}")

    def get[T](self, key: str, kind: _Kind[T]) -> T:
        value = self.optional(key, kind)
        if value is None:
            raise WireError(f"{self.kind!r} frame is missing {key!r}")
        return value

    def optional[T](self, key: str, kind: _Kind[T]) -> T | None:
        value: object = self.raw.get(key)
        if value is None:
            return None
        if not kind.accepts(value):
            raise WireError(f"{self.kind!r} frame: {key!r} must be {kind.name}, got {type(value).__name__}")
        return value

    def per_slot(self, key: str, framing: Framing, dtype: npt.DTypeLike, num_slots: int | None) -> npt.NDArray[Any]:
        """A per-slot number or bool: a plain value under ``scalar`` framing, an ``[N]`` array under ``batched``."""
        if framing is Framing.SCALAR:
            value = self.get(key, BOOL) if dtype is np.bool_ else self.get(key, NUMBER)
            return np.asarray([value], dtype=dtype)
        array: object = self.raw.get(key)
        if not is_array(array):
            array = self.get(key, ARRAY)  # raises, naming the key
        if array.ndim != 1 or (num_slots is not None and array.shape[0] != num_slots):
            raise WireError(f"{self.kind!r} frame: {key!r} must have shape [N={num_slots}], got {list(array.shape)}")
        return array.astype(dtype, copy=False)

    def strings(self, key: str, framing: Framing) -> list[str] | None:
        """A per-slot string: a plain string under ``scalar`` framing, a list of strings under ``batched``."""
        if framing is Framing.SCALAR:
            value = self.optional(key, STR)
            return None if value is None else [value]
        items = self.optional(key, LIST)
        if items is None:
            return None
        if not _all_str(items):
            raise WireError(f"{self.kind!r} frame: {key!r} must be a list of strings")
        return items


# ---------------------------------------------------------------------------------------------
# frames


def message_type(frame: object) -> MessageType:
    if not is_map(frame) or "type" not in frame:
        raise WireError("a frame must be a msgpack map with a 'type' key")
    kind: object = frame["type"]
    try:
        return MessageType(kind)
    except ValueError:
        known = ", ".join(t.value for t in MessageType)
        raise WireError(f"unknown message type {kind!r}; known types: {known}") from None


def parse_hello(frame: object) -> messages.Hello:
    kind = message_type(frame)
    if kind is not MessageType.HELLO:
        raise WireError(f"the first frame must be 'hello', got {kind.value!r}")
    fields = _Fields(frame, {"protocol", "framing"})
    framing = fields.optional("framing", STR)
    protocol = fields.get("protocol", INT)
    try:
        return messages.Hello(protocol=protocol, framing=None if framing is None else Framing(framing))
    except ValueError:
        raise WireError(f"unknown framing {framing!r}; use 'scalar' or 'batched'") from None


def parse_request(frame: object, framing: Framing, num_slots: int | None = None) -> messages.Request:
    """Decode a client request into its internal (batched) form.

    ``num_slots`` lets a batched ``reset`` without ``task`` mean one empty task per slot.
    """
    kind = message_type(frame)
    match kind:
        case MessageType.RESET:
            return _reset(frame, framing, num_slots)
        case MessageType.STEP:
            fields = _Fields(frame, {"seq", "action"})
            seq = fields.get("seq", INT)
            return messages.Step(seq=seq, action=framing.into(fields.get("action", ARRAY)))
        case MessageType.RESULT:
            fields = _Fields(frame, {"seq"})
            return messages.ResultRequest(seq=fields.get("seq", INT))
        case MessageType.CLOSE:
            _Fields(frame, set())
            return messages.Close()
        case _:
            raise WireError(f"a client may not send {kind.value!r} frames here; send reset, step, result or close")


def _reset(frame: object, framing: Framing, num_slots: int | None) -> messages.Reset:
    fields = _Fields(frame, {"seq", "task"})
    seq = fields.get("seq", INT)
    task: object = fields.optional("task", TASK)
    if task is None:
        empty: dict[str, Any] = {}
        task = empty if framing is Framing.SCALAR else [dict(empty) for _ in range(num_slots or 1)]
    tasks: object = framing.into(task)
    if not _is_task_list(tasks):
        raise WireError(
            "'reset' frame: 'task' must be a map (scalar framing)"
            if framing is Framing.SCALAR
            else "'reset' frame: 'task' must be a list of maps, one per slot (batched framing)"
        )
    return messages.Reset(seq=seq, tasks=tasks)


def parse_reply(frame: object, framing: Framing, num_slots: int | None = None) -> messages.Reply:
    """Decode a server frame into its internal (batched) form; ``num_slots`` checks the slot axis."""
    kind = message_type(frame)
    match kind:
        case MessageType.HELLO:
            return _server_hello(frame)
        case MessageType.OBSERVATION:
            return _observation(frame, framing, num_slots)
        case MessageType.RESULT:
            f = _Fields(frame, {"seq", "score", "success", "slots"})
            slots = f.get("slots", LIST)
            if not _all_maps(slots):
                raise WireError("'result' frame: 'slots' must be a list of maps")
            return messages.Result(
                seq=f.get("seq", INT), score=float(f.get("score", NUMBER)), success=f.get("success", BOOL), slots=slots
            )
        case MessageType.ERROR:
            f = _Fields(frame, {"seq", "phase", "slot", "message", "traceback", "cause"})
            return messages.ErrorFrame(
                phase=f.get("phase", STR),
                message=f.get("message", STR),
                seq=f.optional("seq", INT),
                slot=f.optional("slot", INT),
                traceback=f.optional("traceback", STR),
                cause=f.optional("cause", STR),
            )
        case MessageType.CLOSE:
            return messages.Close()
        case _:
            raise WireError(f"a server may not send {kind.value!r} frames")


def _server_hello(frame: object) -> messages.ServerHello:
    f = _Fields(frame, _HELLO_KEYS)
    try:
        chosen = Framing(f.get("framing", STR))
    except ValueError:
        raise WireError(f"'hello' frame: unknown framing {f.raw.get('framing')!r}") from None
    return messages.ServerHello(
        protocol=f.get("protocol", INT),
        framing=chosen,
        num_envs=f.get("num_envs", INT),
        contract=f.get("contract", MAP),
        server=f.get("server", STR),
        hold=f.get("hold", STR),
        bounds=f.optional("bounds", STR) or "clip",
        max_frame_bytes=f.get("max_frame_bytes", INT),
        sim=f.optional("sim", MAP) or {},
    )


def _observation(frame: object, framing: Framing, num_slots: int | None) -> messages.Observation:
    f = _Fields(frame, _OBSERVATION_KEYS)
    arrays: dict[str, npt.NDArray[Any]] = {}
    for key, value in f.get("observation", MAP).items():
        if not is_array(value):
            raise WireError(f"'observation' frame: feature {key!r} must be an array")
        array = framing.into(value)
        if num_slots is not None and (array.ndim == 0 or array.shape[0] != num_slots):
            raise WireError(
                f"'observation' frame: feature {key!r} has shape {list(array.shape)}, not [N={num_slots}, ...]"
            )
        arrays[str(key)] = array
    status = f.strings("status", framing)
    if status is None:
        raise WireError("'observation' frame is missing 'status'")
    return messages.Observation(
        seq=f.get("seq", INT),
        observation=arrays,
        reward=f.per_slot("reward", framing, np.float64, num_slots),
        terminated=f.per_slot("terminated", framing, np.bool_, num_slots),
        truncated=f.per_slot("truncated", framing, np.bool_, num_slots),
        success=f.per_slot("success", framing, np.bool_, num_slots),
        success_reported=f.per_slot("success_reported", framing, np.bool_, num_slots),
        success_now=f.per_slot("success_now", framing, np.bool_, num_slots),
        status=status,
        prompt=f.strings("prompt", framing),
        errors=_slot_errors(f.optional("errors", LIST) or []),
        nonfinite=_slot_numbers(f.optional("nonfinite", LIST) or []),
    )


def _slot_errors(items: list[object]) -> list[messages.SlotError]:
    errors: list[messages.SlotError] = []
    for item in items:
        fields = _Fields(item, {"slot", "message", "traceback", "cause"}, kind="errors[]")
        errors.append(
            messages.SlotError(
                slot=fields.get("slot", INT),
                message=fields.get("message", STR),
                traceback=fields.optional("traceback", STR),
                cause=fields.optional("cause", STR) or "env",
            )
        )
    return errors


def _slot_numbers(items: list[object]) -> list[int]:
    if not _all_int(items):
        raise WireError("'observation' frame: 'nonfinite' must be a list of slot numbers")
    return items
