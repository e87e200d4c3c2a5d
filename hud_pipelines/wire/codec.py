"""msgpack encoding with numpy arrays as ``{dtype, shape, raw bytes}``; never pickle.

The array layout is the one openpi's ``msgpack_numpy`` uses, so the same codec talks to openpi-style
policy servers::

    {"__ndarray__": true, "data": <bin: C-order raw bytes>, "dtype": "<f4", "shape": [8, 4]}

Decoding is defensive because frames come from the network: only boolean, integer and floating
dtypes are accepted (object, void, complex, string, datetime and structured dtypes are refused), the
byte length must equal ``prod(shape) * itemsize`` (so a frame that claims a huge shape allocates
nothing) and the number of dimensions is capped. Decoded arrays are writable copies in native byte
order: a read-only view of the frame buffer must never reach a caller that mutates it or hands it to
``torch.from_numpy`` (which also refuses non-native byte orders).
"""

from __future__ import annotations

import math
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import WireError

NDARRAY_KEY = "__ndarray__"
NPGENERIC_KEY = "__npgeneric__"
ALLOWED_KINDS = frozenset("biuf")
"""numpy dtype kinds that may travel: bool, signed int, unsigned int, float."""
MAX_NDIM = 8


def check_dtype(dtype: object) -> np.dtype[Any]:
    """Parse ``dtype`` and refuse anything but plain bool/int/uint/float dtypes."""
    if not isinstance(dtype, str | np.dtype):
        raise WireError(f"array dtype must be a string such as '<f4', got {type(dtype).__name__}")
    try:
        parsed = cast("np.dtype[Any]", np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise WireError(f"unknown dtype {dtype!r}") from exc
    if parsed.kind not in ALLOWED_KINDS or parsed.subdtype is not None or parsed.fields is not None:
        raise WireError(
            f"dtype {parsed.str!r} (kind {parsed.kind!r}) is refused: only bool, int, uint and float "
            "arrays travel on the wire"
        )
    return parsed


def encode_array(array: npt.NDArray[Any]) -> dict[str, Any]:
    """The wire fields of ``array``; a C-contiguous array is packed from its own buffer, without a copy."""
    dtype = array.dtype
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        check_dtype(dtype)  # raises, naming the dtype
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    return {NDARRAY_KEY: True, "data": contiguous.data, "dtype": dtype.str, "shape": list(array.shape)}


def _encode_default(obj: object) -> object:
    if type(obj) is np.ndarray or isinstance(obj, np.ndarray):
        return encode_array(cast("npt.NDArray[Any]", obj))
    if isinstance(obj, np.bool_):
        return bool(cast(Any, obj))
    if isinstance(obj, np.integer):
        return int(cast("np.integer[Any]", obj))
    if isinstance(obj, np.floating):
        return float(cast("np.floating[Any]", obj))
    if isinstance(obj, tuple):
        return list(cast("tuple[object, ...]", obj))
    raise WireError(f"cannot encode a value of type {type(obj).__name__} on the wire")


def decode_array(fields: dict[str, Any]) -> npt.NDArray[Any]:
    """Rebuild an array from its wire fields, checking dtype, shape and byte length first."""
    dtype = check_dtype(fields.get("dtype", "<missing>"))
    shape_field: object = fields.get("shape")
    data: object = fields.get("data")
    if not isinstance(shape_field, list):
        raise WireError(f"array shape must be a list of at most {MAX_NDIM} ints, got {shape_field!r}")
    dims = cast("list[object]", shape_field)
    if len(dims) > MAX_NDIM:
        raise WireError(f"array has {len(dims)} dimensions, at most {MAX_NDIM} are allowed")
    shape: list[int] = []
    for dim in dims:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise WireError(f"array shape must hold non-negative ints, got {dims!r}")
        shape.append(dim)
    if not isinstance(data, bytes | bytearray):
        raise WireError(f"array data must be binary, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise WireError(
            f"array of shape {tuple(shape)} and dtype {dtype.str} needs {expected} bytes, the frame carries {len(data)}"
        )
    view = np.frombuffer(data, dtype=dtype).reshape(shape)
    return np.array(view, dtype=dtype.newbyteorder("="), copy=True)


def _decode_hook(obj: dict[str, Any]) -> object:
    if NDARRAY_KEY in obj:
        return decode_array(obj)
    if NPGENERIC_KEY in obj:
        return decode_array({**obj, "shape": []})[()]
    return obj


def packb(message: object) -> bytes:
    """Encode ``message`` (dicts, lists, scalars, numpy arrays) as one binary msgpack frame."""
    try:
        return cast(bytes, msgpack.packb(message, default=_encode_default, use_bin_type=True))
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode frame: {exc}") from exc


def unpackb(frame: bytes | bytearray | memoryview | str) -> Any:
    """Decode one frame; any malformation is a :class:`WireError`, never another exception."""
    if isinstance(frame, str):
        raise WireError("expected a binary msgpack frame, got a text frame")
    try:
        return cast(Any, msgpack.unpackb(frame, object_hook=_decode_hook, raw=False, strict_map_key=False))
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise WireError(f"malformed msgpack frame ({type(exc).__name__}: {exc})") from exc
