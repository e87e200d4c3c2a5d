"""The msgpack codec: arrays as dtype + shape + raw bytes, nothing else, and never a crash on bad input."""

from __future__ import annotations

import math
import re
import tracemalloc
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.errors import WireError
from hud_pipelines.wire import codec
from hud_pipelines.wire.codec import (
    MAX_NDIM,
    NDARRAY_KEY,
    SCAN_ABOVE_BYTES,
    Layout,
    check_dtype,
    decode_array,
    packb,
    peek_seq,
    unpackb,
)

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


@pytest.mark.parametrize(
    ("frame", "said"),
    [
        (b"\xc1\xc1\xc1", "a byte that starts no msgpack object"),
        (b"\x91" * 2_000 + b"\x00", "containers nested too deep"),
    ],
)
def test_a_malformed_frame_is_said_in_words_even_where_msgpack_gives_none(frame: bytes, said: str) -> None:
    with pytest.raises(WireError, match=rf"malformed msgpack frame \(\w+: {said}\)"):
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


# ---------------------------------------------------------------------------------------------
# memory: decoding a frame costs about the frame's size, whatever it declares


def refusal_peak(frame: bytes) -> tuple[str, int]:
    """The error decoding ``frame`` raises, and the peak bytes traced meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(WireError) as caught:
            unpackb(frame)
        return str(caught.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def array32(count: int, element: bytes) -> bytes:
    """A msgpack array32 declaring ``count`` elements, followed by ``count`` copies of ``element``."""
    return b"\xdd" + count.to_bytes(4, "big") + element * count


@pytest.mark.parametrize(
    "frame",
    [
        array32(1 << 17, b"\xc0"),  # nils: msgpack would build a list of all their slots
        array32(1 << 17, b"\x80"),  # empty maps: ~70 bytes of memory per byte of frame
        b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x91" * 100_000,  # declares more elements than it has bytes
        b"\x81\xa1a" + array32(1 << 17, b"\x90"),  # nested
    ],
    ids=["nils", "empty-maps", "over-declared", "nested"],
)
def test_a_frame_of_small_objects_costs_about_its_own_size_to_refuse(
    frame: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codec, "MAX_FRAME_OBJECTS", 4096)  # the real limit, scaled down with the frame
    message, peak = refusal_peak(frame)
    assert re.search("more than 4096 msgpack objects; refused before decoding|declares .* elements", message)
    assert peak < 2 * len(frame)


def test_the_object_limit_is_what_the_codec_announces() -> None:
    with pytest.raises(WireError, match=f"frame holds more than {codec.MAX_FRAME_OBJECTS} msgpack objects"):
        unpackb(array32(codec.MAX_FRAME_OBJECTS, b"\xc0"))  # the array itself is one object more
    assert len(unpackb(array32(codec.MAX_FRAME_OBJECTS - 1, b"\xc0"))) == codec.MAX_FRAME_OBJECTS - 1


def test_large_frames_of_few_objects_decode_as_before() -> None:
    images = np.arange(8 * 96 * 96 * 3, dtype=np.uint32).astype(np.uint8).reshape(8, 96, 96, 3)
    frame = packb({"seq": 3, "pixels": images, "status": ["running"] * 8})
    assert len(frame) > SCAN_ABOVE_BYTES
    decoded = unpackb(frame)
    np.testing.assert_array_equal(decoded["pixels"], images)
    many = packb({"slots": [{"slot": i, "seed": i, "status": "done"} for i in range(20_000)]})  # 140k objects
    assert len(unpackb(many)["slots"]) == 20_000


@pytest.mark.parametrize(
    ("frame", "seq"),
    [
        (packb({"type": "step", "seq": 7, "action": np.zeros((1, 3))})[:-3], 7),  # truncated after seq
        (pack({"type": "step", "action": {NDARRAY_KEY: True, "data": b"", "dtype": "|O", "shape": [1]}, "seq": 9}), 9),
        (pack({"type": "step", "seq": 4, "action": [1, 2]}), 4),
        (pack({"type": "step", "seq": "4"}), None),
        (pack({"type": "step", "seq": True}), None),
        (pack([1, 2, 3]), None),
        (b"\xc1\xc1", None),
        (b"", None),
        ("text", None),
    ],
)
def test_the_seq_of_an_undecodable_frame_is_read_when_it_is_there(frame: bytes | str, seq: int | None) -> None:
    assert peek_seq(frame) == seq


# ---------------------------------------------------------------------------------------------
# openpi's layout: the same codec speaks to openpi-style policy servers


def openpi_pack(obj: object) -> bytes:
    """openpi's ``msgpack_numpy.Packer``, as openpi writes it (binary keys)."""

    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return {b"__ndarray__": True, b"data": value.tobytes(), b"dtype": value.dtype.str, b"shape": value.shape}
        if isinstance(value, np.generic):
            return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
        return value

    return cast(bytes, msgpack.packb(obj, default=default, use_bin_type=True))


def openpi_unpack(frame: bytes) -> Any:
    """openpi's ``msgpack_numpy.unpackb``: it recognises binary keys only."""

    def hook(obj: dict[Any, Any]) -> Any:
        if b"__ndarray__" in obj:
            return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
        if b"__npgeneric__" in obj:
            return np.dtype(obj[b"dtype"]).type(obj[b"data"])
        return obj

    return msgpack.unpackb(frame, object_hook=hook)


def test_the_openpi_layout_is_what_openpis_own_decoder_reads() -> None:
    state = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]  # not contiguous
    decoded = openpi_unpack(
        packb({"state": state, "step": np.int64(3), "ok": np.bool_(True), "t": (1, 2)}, Layout.OPENPI)
    )
    np.testing.assert_array_equal(decoded["state"], state)
    assert decoded["state"].dtype == np.float32
    assert (type(decoded["step"]), decoded["step"]) == (np.int64, 3)
    assert (type(decoded["ok"]), decoded["ok"]) == (np.bool_, True)
    assert decoded["t"] == [1, 2]
    sim_layout = openpi_unpack(packb({"x": np.zeros(2)}))["x"]
    assert isinstance(sim_layout, dict), "the sim layout's text keys are not openpi's"


def test_frames_in_openpis_layout_decode_with_every_check() -> None:
    decoded = unpackb(openpi_pack({"actions": np.ones((2, 3), np.float32), "t": np.float32(0.5), "n": np.uint8(7)}))
    np.testing.assert_array_equal(decoded["actions"], np.ones((2, 3)))
    assert decoded["actions"].flags.writeable
    assert (type(decoded["t"]), decoded["t"]) == (np.float32, 0.5)
    assert (type(decoded["n"]), decoded["n"]) == (np.uint8, 7)
    unsafe = pack({"a": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}})
    with pytest.raises(WireError, match="dtype"):
        unpackb(unsafe)
    short = pack({"a": {b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "<f4", b"shape": [10**6, 10**6]}})
    with pytest.raises(WireError, match="needs 4000000000000 bytes"):
        unpackb(short)
    with pytest.raises(WireError, match="data must be a number"):
        unpackb(pack({"s": {b"__npgeneric__": True, b"data": "text", b"dtype": "<f4"}}))


def test_unsafe_dtypes_are_refused_in_the_openpi_layout_too() -> None:
    with pytest.raises(WireError, match="kind 'O'"):
        packb({"x": np.array([object()], dtype=object)}, Layout.OPENPI)
    with pytest.raises(WireError, match="kind 'c'"):
        packb({"x": np.complex128(1 + 2j)}, Layout.OPENPI)


def test_arrays_decoded_through_the_dtype_cache_are_independent_native_copies() -> None:
    """The second decode of a dtype spelling takes the cached path: still a fresh native-order copy each time."""
    for dtype in ("<f4", ">f4", "|u1"):
        frame = packb({"x": np.arange(6, dtype=dtype).reshape(2, 3)})
        first, second = (unpackb(frame)["x"] for _ in range(2))
        first += 1
        assert second.dtype.isnative
        np.testing.assert_array_equal(second, np.arange(6).reshape(2, 3))
