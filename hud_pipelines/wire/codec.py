"""msgpack encoding with numpy arrays as ``{dtype, shape, raw bytes}``; never pickle.

The array layout is the one openpi's ``msgpack_numpy`` uses, so the same codec talks to openpi-style
policy servers::

    {"__ndarray__": true, "data": <bin: C-order raw bytes>, "dtype": "<f4", "shape": [8, 4]}

Decoding is defensive because frames come from the network: only boolean, integer and floating
dtypes are accepted (object, void, complex, string and structured dtypes are refused), the byte
length must equal ``prod(shape) * itemsize`` (so a frame that claims a huge shape allocates nothing)
and the number of dimensions is capped. Decoded arrays are writable copies: a read-only view of the
frame buffer must never reach a caller that mutates it or hands it to ``torch.from_numpy``.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import WireError

NDARRAY_KEY = "__ndarray__"
NPGENERIC_KEY = "__npgeneric__"
ALLOWED_KINDS = frozenset("biuf")
"""numpy dtype kinds that may travel: bool, signed int, unsigned int, float."""
MAX_NDIM = 8


def check_dtype(dtype: str | np.dtype[Any]) -> np.dtype[Any]:
    """Parse ``dtype`` and refuse anything but plain bool/int/uint/float dtypes."""
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


def _encode_default(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        array: npt.NDArray[Any] = obj
        dtype = check_dtype(array.dtype)
        return {
            NDARRAY_KEY: True,
            "data": np.ascontiguousarray(array).tobytes(),
            "dtype": dtype.str,
            "shape": list(array.shape),
        }
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)  # pyright: ignore[reportUnknownArgumentType]
    if isinstance(obj, np.floating):
        return float(obj)  # pyright: ignore[reportUnknownArgumentType]
    if isinstance(obj, tuple):
        return list(obj)  # pyright: ignore[reportUnknownArgumentType]
    raise WireError(f"cannot encode a value of type {type(obj).__name__} on the wire")


def decode_array(fields: dict[str, Any]) -> npt.NDArray[Any]:
    """Rebuild an array from its wire fields, checking dtype, shape and byte length."""
    dtype = check_dtype(fields.get("dtype", "<missing>"))
    shape_field = fields.get("shape")
    data = fields.get("data")
    if not isinstance(shape_field, list) or len(shape_field) > MAX_NDIM:  # pyright: ignore[reportUnknownArgumentType]
        raise WireError(f"array shape must be a list of at most {MAX_NDIM} ints, got {shape_field!r}")
    shape: list[int] = []
    for dim in shape_field:  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise WireError(f"array shape must hold non-negative ints, got {shape_field!r}")
        shape.append(dim)
    if not isinstance(data, bytes | bytearray):
        raise WireError("array data must be binary")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise WireError(
            f"array of shape {tuple(shape)} and dtype {dtype.str} needs {expected} bytes, the frame carries {len(data)}"
        )
    array = np.empty(shape, dtype=dtype)
    array.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return array


def _decode_hook(obj: dict[str, Any]) -> object:
    if NDARRAY_KEY in obj:
        return decode_array(obj)
    if NPGENERIC_KEY in obj:
        return decode_array({**obj, "shape": []})[()]
    return obj


def packb(message: object) -> bytes:
    """Encode ``message`` (dicts, lists, scalars, numpy arrays) as one binary msgpack frame."""
    try:
        return msgpack.packb(message, default=_encode_default, use_bin_type=True)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode frame: {exc}") from exc


def unpackb(frame: bytes | bytearray | memoryview | str) -> Any:
    """Decode one frame; any malformation is a :class:`WireError`, never another exception."""
    if isinstance(frame, str):
        raise WireError("expected a binary msgpack frame, got a text frame")
    try:
        return msgpack.unpackb(frame, object_hook=_decode_hook, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise WireError(f"malformed msgpack frame ({type(exc).__name__}: {exc})") from exc
