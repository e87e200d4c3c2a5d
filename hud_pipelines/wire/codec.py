"""msgpack encoding with numpy arrays as ``{dtype, shape, raw bytes}``; never pickle.

The array layout is the one openpi's ``msgpack_numpy`` uses, so one codec talks to the sims and to
openpi-style policy servers::

    {"__ndarray__": true, "data": <bin: C-order raw bytes>, "dtype": "<f4", "shape": [8, 4]}

Two spellings go out (:class:`Layout`): the sim protocol's text keys, numpy scalars as plain
msgpack numbers (``docs/protocol.md``), and openpi's binary keys (``b"__ndarray__"``: openpi's
decoder looks for those alone), numpy scalars as ``{b"__npgeneric__", b"data", b"dtype"}``.
Decoding reads both spellings.

Decoding is defensive because frames come from the network: only boolean, integer and floating
dtypes are accepted (object, void, complex, string, datetime and structured dtypes are refused), the
byte length must equal ``prod(shape) * itemsize`` (so a frame that claims a huge shape allocates
nothing) and the number of dimensions is capped. A frame larger than :data:`SCAN_ABOVE_BYTES` is
walked header by header before msgpack builds anything: a container may not declare more elements
than the bytes left in the frame, and a frame may hold at most :data:`MAX_FRAME_OBJECTS` objects, so
decoding costs about the frame's own size (an empty map costs ~70 bytes of memory for one byte of
frame: a frame of nothing else would otherwise cost 70 times its size).

Decoded arrays are writable copies in native byte order: a read-only view of the frame buffer must
never reach a caller that mutates it or hands it to ``torch.from_numpy`` (which also refuses
non-native byte orders).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple, TypeGuard, cast

import msgpack
import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import WireError

NDARRAY_KEY = "__ndarray__"
NPGENERIC_KEY = "__npgeneric__"
ALLOWED_KINDS = frozenset("biuf")
"""numpy dtype kinds that may travel: bool, signed int, unsigned int, float."""
MAX_NDIM = 8
MAX_FRAME_OBJECTS = 1 << 18
"""msgpack objects (maps, arrays, strings, numbers...) one frame may hold; a reset or result of
thousands of slots holds about 30 per slot."""
SCAN_ABOVE_BYTES = 1 << 16
"""Frames up to this size are not walked first: they cannot hold enough objects to matter."""
_CONTAINER_LENGTHS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
"""array16/32 and map16/32: bytes of the length field, child objects per declared element."""
_PAYLOAD_LENGTHS = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
"""bin8/16/32 and str8/16/32: bytes of the length field before the payload."""
_EXT_LENGTHS = {0xC7: 1, 0xC8: 2, 0xC9: 4}
"""ext8/16/32: bytes of the length field (one type byte follows it)."""
_FIXED_PAYLOADS = {
    **{0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8},
    **{0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17},
}
"""floats, ints and fixext types: payload bytes after the type byte."""


class _Keys(NamedTuple):
    ndarray: str | bytes
    npgeneric: str | bytes
    data: str | bytes
    dtype: str | bytes
    shape: str | bytes


_TEXT_KEYS = _Keys(NDARRAY_KEY, NPGENERIC_KEY, "data", "dtype", "shape")
_BINARY_KEYS = _Keys(b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape")


class Layout(StrEnum):
    """How arrays and numpy scalars are spelled on the way out (decoding reads both)."""

    HUD = "hud"
    """The sim protocol: text keys; numpy scalars become plain msgpack numbers."""
    OPENPI = "openpi"
    """openpi's ``msgpack_numpy``: binary keys; numpy scalars travel as ``__npgeneric__`` maps."""

    @property
    def keys(self) -> _Keys:
        return _TEXT_KEYS if self is Layout.HUD else _BINARY_KEYS


def is_array(value: object) -> TypeGuard[npt.NDArray[Any]]:
    """A decoded array (numpy leaves the element type of an ``isinstance`` check unknown)."""
    return isinstance(value, np.ndarray)


def is_map(value: object) -> TypeGuard[dict[Any, Any]]:
    """A decoded msgpack map; its keys and values are whatever the frame held."""
    return isinstance(value, dict)


def _is_dtype_name(value: object) -> TypeGuard[str | np.dtype[Any]]:
    return isinstance(value, str | np.dtype)


def check_dtype(dtype: object) -> np.dtype[Any]:
    """Parse ``dtype`` and refuse anything but plain bool/int/uint/float dtypes."""
    if not _is_dtype_name(dtype):
        raise WireError(f"array dtype must be a string such as '<f4', got {type(dtype).__name__}")
    try:
        parsed = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise WireError(f"unknown dtype {dtype!r}") from exc
    if parsed.kind not in ALLOWED_KINDS or parsed.subdtype is not None or parsed.fields is not None:
        raise WireError(
            f"dtype {parsed.str!r} (kind {parsed.kind!r}) is refused: only bool, int, uint and float "
            "arrays travel on the wire"
        )
    return parsed


def encode_array(array: npt.NDArray[Any], layout: Layout = Layout.HUD) -> dict[str | bytes, object]:
    """The wire fields of ``array``; a C-contiguous array is packed from its own buffer, without a copy."""
    dtype = array.dtype
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        check_dtype(dtype)  # raises, naming the dtype
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    keys = layout.keys
    return {keys.ndarray: True, keys.data: contiguous.data, keys.dtype: dtype.str, keys.shape: list(array.shape)}


def _is_scalar(value: object) -> TypeGuard[np.generic[Any]]:
    return isinstance(value, np.generic)


def _is_number(value: object) -> TypeGuard[np.bool_ | np.integer[Any] | np.floating[Any]]:
    """A numpy bool, int or float scalar: what the sim protocol sends as a plain msgpack value."""
    return isinstance(value, np.bool_ | np.integer | np.floating)


def _is_tuple(value: object) -> TypeGuard[tuple[object, ...]]:
    return isinstance(value, tuple)


def _is_list(value: object) -> TypeGuard[list[object]]:
    return isinstance(value, list)


def _encode_hud(obj: object) -> object:
    if is_array(obj):
        return encode_array(obj)
    if _is_number(obj):
        return obj.item()
    if _is_tuple(obj):
        return list(obj)
    raise WireError(f"cannot encode a value of type {type(obj).__name__} on the wire")


def _encode_openpi(obj: object) -> object:
    if is_array(obj):
        return encode_array(obj, Layout.OPENPI)
    if _is_scalar(obj):
        keys = _BINARY_KEYS
        return {keys.npgeneric: True, keys.data: obj.item(), keys.dtype: check_dtype(obj.dtype).str}
    if _is_tuple(obj):
        return list(obj)
    raise WireError(f"cannot encode a value of type {type(obj).__name__} on the wire")


def decode_array(fields: dict[str, Any]) -> npt.NDArray[Any]:
    """Rebuild an array from its wire fields, checking dtype, shape and byte length first.

    Written for the per-frame path (every observation carries several small arrays): a known dtype
    spelling is one dict lookup, and the shape is checked and multiplied out in one pass.
    """
    name: object = fields.get("dtype", "<missing>")
    known = _WIRE_DTYPES.get(name) if type(name) is str else None
    dtype, native = known if known is not None else _wire_dtype(name)
    dims: object = fields.get("shape")
    data: object = fields.get("data")
    if not _is_list(dims) or len(dims) > MAX_NDIM:
        raise WireError(
            f"array has {len(dims)} dimensions, at most {MAX_NDIM} are allowed"
            if _is_list(dims)
            else f"array shape must be a list of at most {MAX_NDIM} ints, got {dims!r}"
        )
    expected = dtype.itemsize
    shape: list[int] = []
    for dim in dims:
        if type(dim) is not int or dim < 0:  # a bool is an int subclass: refused too
            raise WireError(f"array shape must hold non-negative ints, got {dims!r}")
        expected *= dim
        shape.append(dim)
    if not isinstance(data, bytes | bytearray):
        raise WireError(f"array data must be binary, got {type(data).__name__}")
    if len(data) != expected:
        raise WireError(
            f"array of shape {tuple(shape)} and dtype {dtype.str} needs {expected} bytes, the frame carries {len(data)}"
        )
    view = np.frombuffer(data, dtype=dtype).reshape(shape)
    return view.copy() if native is dtype else view.astype(native)


_WIRE_DTYPES: dict[str, tuple[np.dtype[Any], np.dtype[Any]]] = {}
"""Checked wire dtype strings -> (dtype, its native-order twin): parsing one costs more than a small array."""


def _wire_dtype(name: object) -> tuple[np.dtype[Any], np.dtype[Any]]:
    """The checked dtype a wire ``dtype`` field names, and the native-order dtype the decoded array gets."""
    if isinstance(name, str):
        known = _WIRE_DTYPES.get(name)
        if known is not None:
            return known
    dtype = check_dtype(name)
    native = dtype.newbyteorder("=")
    pair = (dtype, dtype if native == dtype else native)
    if isinstance(name, str) and len(_WIRE_DTYPES) < len(ALLOWED_KINDS) * 16:  # a bounded set of spellings
        _WIRE_DTYPES[name] = pair
    return pair


def _decode_scalar(fields: dict[str, Any]) -> object:
    """A numpy scalar: openpi's (its ``data`` a plain number) or raw bytes of one element."""
    data: object = fields.get("data")
    if isinstance(data, bytes | bytearray):
        return decode_array({**fields, "shape": []})[()]
    dtype = check_dtype(fields.get("dtype", "<missing>"))
    if not isinstance(data, bool | int | float):
        raise WireError(f"a numpy scalar's data must be a number or bytes, got {type(data).__name__}")
    return dtype.type(data)


def _text_keyed(obj: dict[Any, Any]) -> dict[str, Any]:
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _decode_hook(obj: dict[Any, Any]) -> object:
    if NDARRAY_KEY in obj:
        return decode_array(obj)
    if NPGENERIC_KEY in obj:
        return _decode_scalar(obj)
    if _BINARY_KEYS.ndarray in obj:
        return decode_array(_text_keyed(obj))
    if _BINARY_KEYS.npgeneric in obj:
        return _decode_scalar(_text_keyed(obj))
    return obj


def packb(message: object, layout: Layout = Layout.HUD) -> bytes:
    """Encode ``message`` (dicts, lists, scalars, numpy arrays) as one binary msgpack frame."""
    default = _encode_hud if layout is Layout.HUD else _encode_openpi
    try:
        return cast(bytes, msgpack.packb(message, default=default, use_bin_type=True))  # msgpack is untyped
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode frame: {exc}") from exc


def unpackb(frame: bytes | bytearray | memoryview | str) -> Any:
    """Decode one frame; any malformation is a :class:`WireError`, never another exception."""
    if isinstance(frame, str):
        raise WireError("expected a binary msgpack frame, got a text frame")
    if len(frame) > SCAN_ABOVE_BYTES:
        _skip(frame, 0, MAX_FRAME_OBJECTS)
    try:
        return cast(Any, msgpack.unpackb(frame, object_hook=_decode_hook, raw=False, strict_map_key=False))
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        said = _UNSAID.get(type(exc).__name__, "") if not str(exc) else f": {exc}"
        raise WireError(f"malformed msgpack frame ({type(exc).__name__}{said})") from exc


_UNSAID = {
    "FormatError": ": a byte that starts no msgpack object",
    "StackError": ": containers nested too deep",
}
"""What msgpack's errors that come with no words of their own mean."""


def peek_seq(frame: bytes | bytearray | memoryview | str) -> int | None:
    """The ``seq`` of a frame that failed to decode, when its top-level map still shows one.

    Only the top level is walked, key by key, without building the values (a bad array or a
    truncation after ``seq`` does not hide it); anything unreadable gives ``None``.
    """
    if isinstance(frame, str) or not frame:
        return None
    try:
        pos, children, _ = _header(frame, 0)
        if not (0x80 <= frame[0] <= 0x8F or frame[0] in (0xDE, 0xDF)):
            return None
        for _ in range(children // 2):
            key_end = _skip(frame, pos, MAX_FRAME_OBJECTS)
            value_end = _skip(frame, key_end, MAX_FRAME_OBJECTS)
            if key_end - pos <= 8 and msgpack.unpackb(frame[pos:key_end]) == "seq":
                value = cast(object, msgpack.unpackb(frame[key_end:value_end])) if value_end - key_end <= 9 else None
                return value if isinstance(value, int) and not isinstance(value, bool) else None
            pos = value_end
    except Exception:  # unreadable: the error frame goes out without a seq
        return None
    return None


def _header(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int, int]:
    """``(position after the header, child objects, payload bytes)`` of the msgpack object at ``pos``."""
    if pos >= len(data):
        raise WireError("malformed msgpack frame (truncated)")
    kind = data[pos]
    pos += 1
    if kind <= 0x7F or kind >= 0xE0 or kind in (0xC0, 0xC2, 0xC3):  # fixints, nil, booleans
        return pos, 0, 0
    if kind <= 0x8F:
        return pos, 2 * (kind & 0x0F), 0
    if kind <= 0x9F:
        return pos, kind & 0x0F, 0
    if kind <= 0xBF:
        return pos, 0, kind & 0x1F
    if kind in _FIXED_PAYLOADS:
        return pos, 0, _FIXED_PAYLOADS[kind]
    width = _PAYLOAD_LENGTHS.get(kind) or _EXT_LENGTHS.get(kind) or _CONTAINER_LENGTHS.get(kind, (0, 0))[0]
    if not width:
        raise WireError(f"malformed msgpack frame (byte 0x{kind:02x} at offset {pos - 1} is no msgpack type)")
    length = int.from_bytes(data[pos : pos + width], "big")
    pos += width
    if kind in _CONTAINER_LENGTHS:
        return pos, length * _CONTAINER_LENGTHS[kind][1], 0
    return pos, 0, length + 1 if kind in _EXT_LENGTHS else length


def _skip(data: bytes | bytearray | memoryview, pos: int, budget: int) -> int:
    """The position after the msgpack object at ``pos``, walking at most ``budget`` objects.

    Refuses a container that declares more elements than the bytes left (each takes one at least)
    and a walk past ``budget`` objects, before msgpack would allocate for them.
    """
    end = len(data)
    pending = 1
    walked = 0
    while pending:
        pos, children, payload = _header(data, pos)
        pos += payload
        walked += 1
        if children > end - pos:
            raise WireError(
                f"malformed msgpack frame (a container declares {children} elements, {max(end - pos, 0)} bytes remain)"
            )
        if walked > budget:
            raise WireError(f"frame holds more than {budget} msgpack objects; refused before decoding")
        pending += children - 1
    if pos > end:
        raise WireError("malformed msgpack frame (truncated)")
    return pos
