"""The msgpack codec: arrays as dtype + shape + raw bytes, nothing else, and never a crash on bad input."""

from __future__ import annotations

import math
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.errors import WireError
from hud_pipelines.wire.codec import MAX_NDIM, NDARRAY_KEY, check_dtype, decode_array, packb, unpackb

ALLOWED = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]


def pack(message: object) -> bytes:
    """Plain msgpack, bypassing the codec's checks."""
    return cast(bytes, msgpack.packb(message, use_bin_type=True))


def raw_array(data: bytes, dtype: str, shape: object) -> bytes:
    """A frame holding one hand-made array."""
    return pack({"a": {NDARRAY_KEY: True, "data": data, "dtype": dtype, "shape": shape}})


@pytest.mark.parametrize("dtype", ALLOWED)
def test_every_plain_dtype_round_trips_bit_exactly(dtype: str) -> None:
    rng = np.random.default_rng(0)
    array = (rng.random((3, 4, 2)) * 100).astype(dtype)
    decoded = unpackb(packb({"x": array}))["x"]
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()


def test_decoded_arrays_are_writable_copies_torch_could_take() -> None:
    frame = packb({"image": np.arange(96 * 96 * 3, dtype=np.uint8).reshape(96, 96, 3), "state": np.ones(4)})
    decoded = unpackb(frame)
    for array in decoded.values():
        assert array.flags.writeable
        assert array.flags.owndata or (array.base is not None and array.base.flags.writeable)
        assert array.flags.c_contiguous
        array += 1  # must not raise


def test_non_native_byte_order_is_decoded_to_native() -> None:
    big_endian = np.arange(5, dtype=">f4")
    decoded = unpackb(packb({"x": big_endian}))["x"]
    assert decoded.dtype.isnative
    np.testing.assert_array_equal(decoded, np.arange(5, dtype=np.float32))


def test_non_contiguous_and_zero_size_and_zero_dim_arrays() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    for array in (base[:, ::2], base.T, np.zeros((0, 3), np.float32), np.array(7.5)):
        decoded = unpackb(packb({"x": array}))["x"]
        np.testing.assert_array_equal(decoded, array)
        assert decoded.shape == array.shape


def test_numpy_scalars_and_tuples_become_plain_msgpack_values() -> None:
    decoded = unpackb(packb({"b": np.bool_(True), "i": np.int64(3), "f": np.float32(0.5), "t": (1, 2)}))
    assert decoded == {"b": True, "i": 3, "f": 0.5, "t": [1, 2]}
    assert type(decoded["b"]) is bool


@pytest.mark.parametrize(
    ("array", "kind"),
    [
        (np.array([object()], dtype=object), "'O'"),
        (np.array([1 + 2j]), "'c'"),
        (np.array(["text"]), "'U'"),
        (np.zeros(2, dtype=[("x", "f4")]), "'V'"),
        (np.array([np.datetime64("2020-01-01")]), "'M'"),
    ],
)
def test_unsafe_dtypes_are_refused_when_encoding(array: npt.NDArray[Any], kind: str) -> None:
    with pytest.raises(WireError, match=f"kind {kind}"):
        packb({"x": array})


@pytest.mark.parametrize("dtype", ["|O", "<c16", "<U4", "|V8", "|S3", "<M8[D]", "bogus", "(2,)f4"])
def test_unsafe_or_unknown_dtypes_are_refused_when_decoding(dtype: str) -> None:
    with pytest.raises(WireError, match="dtype"):
        unpackb(raw_array(b"\0" * 8, dtype, [1]))


def test_check_dtype_refuses_a_non_string() -> None:
    with pytest.raises(WireError, match="must be a string"):
        check_dtype(12)


def test_byte_length_must_match_the_shape() -> None:
    with pytest.raises(WireError, match=r"needs 16 bytes, the frame carries 12"):
        unpackb(raw_array(b"\0" * 12, "<f4", [2, 2]))


def test_a_huge_declared_shape_allocates_nothing() -> None:
    shape = [10**6, 10**6]  # 10^12 elements, 4 TB as float32
    with pytest.raises(WireError, match="needs 4000000000000 bytes, the frame carries 4"):
        unpackb(raw_array(b"\0" * 4, "<f4", shape))
    assert math.prod(shape) == 10**12


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([-1], "non-negative"),
        ([1.5], "non-negative"),
        ([True], "non-negative"),
        ("3", "list"),
        ([1] * (MAX_NDIM + 1), f"at most {MAX_NDIM} are allowed"),
    ],
)
def test_malformed_shapes_are_refused(shape: object, message: str) -> None:
    frame = pack({"a": {NDARRAY_KEY: True, "data": b"", "dtype": "<f4", "shape": shape}})
    with pytest.raises(WireError, match=message):
        unpackb(frame)


def test_array_data_must_be_binary() -> None:
    frame = pack({"a": {NDARRAY_KEY: True, "data": "text", "dtype": "<f4", "shape": [1]}})
    with pytest.raises(WireError, match="must be binary"):
        unpackb(frame)


@pytest.mark.parametrize(
    "frame",
    [
        packb({"type": "step", "seq": 1, "action": np.zeros((2, 3))})[:-5],  # truncated
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array announced with two items, holding one
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
        bytes(range(256)),
        b"",
    ],
)
def test_truncated_or_garbage_frames_are_wire_errors(frame: bytes) -> None:
    with pytest.raises(WireError, match="malformed msgpack frame"):
        unpackb(frame)


def test_a_text_frame_is_refused() -> None:
    with pytest.raises(WireError, match="text frame"):
        unpackb('{"type": "hello"}')


def test_objects_without_a_wire_form_are_refused() -> None:
    with pytest.raises(WireError, match="type set"):
        packb({"x": {1, 2}})


def test_decode_array_rebuilds_from_fields() -> None:
    array = decode_array({"data": np.arange(3, dtype="<i2").tobytes(), "dtype": "<i2", "shape": [3]})
    np.testing.assert_array_equal(array, [0, 1, 2])
