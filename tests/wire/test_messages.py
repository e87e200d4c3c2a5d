"""Typed messages and the two framings, produced by one code path from one batched form."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hud_pipelines.errors import WireError
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import (
    Close,
    ErrorFrame,
    Framing,
    Hello,
    MessageType,
    Observation,
    Reset,
    Result,
    ResultRequest,
    ServerHello,
    SlotError,
    Step,
    to_wire,
)
from hud_pipelines.wire.parse import message_type, parse_hello, parse_reply, parse_request


def observation(num_slots: int) -> Observation:
    rng = np.random.default_rng(num_slots)
    return Observation(
        seq=7,
        observation={
            "state": rng.random((num_slots, 4)).astype(np.float32),
            "pixels": rng.integers(0, 255, (num_slots, 96, 96, 3), dtype=np.uint8),
        },
        reward=rng.random(num_slots),
        terminated=np.arange(num_slots) % 2 == 1,
        truncated=np.zeros(num_slots, dtype=np.bool_),
        success=np.ones(num_slots, dtype=np.bool_),
        success_reported=np.arange(num_slots) % 3 != 2,
        success_now=np.arange(num_slots) % 4 == 0,
        status=["running"] * num_slots,
        prompt=[f"task {i}" for i in range(num_slots)],
        errors=[SlotError(slot=0, message="boom", traceback="Traceback ...")],
        nonfinite=[0],
    )


def over_the_wire(message: Any, framing: Framing, num_slots: int | None = None) -> tuple[dict[str, Any], Any]:
    """The wire dict after a real encode/decode, and the message parsed back."""
    wire = unpackb(packb(to_wire(message, framing)))
    parse = parse_reply if isinstance(message, Observation | Result | ErrorFrame | ServerHello) else parse_request
    return wire, parse(wire, framing, num_slots)


def assert_same_observation(left: Observation, right: Observation) -> None:
    assert left.seq == right.seq
    assert left.observation.keys() == right.observation.keys()
    for key, array in left.observation.items():
        assert right.observation[key].dtype == array.dtype
        np.testing.assert_array_equal(right.observation[key], array)
    for name in ("reward", "terminated", "truncated", "success", "success_reported", "success_now"):
        np.testing.assert_array_equal(getattr(right, name), getattr(left, name))
        assert getattr(right, name).dtype == getattr(left, name).dtype
    assert (right.status, right.prompt, right.errors, right.nonfinite) == (
        left.status,
        left.prompt,
        left.errors,
        left.nonfinite,
    )


def test_batched_observation_keeps_the_slot_axis_and_masks() -> None:
    message = observation(3)
    wire, parsed = over_the_wire(message, Framing.BATCHED, 3)
    assert wire["observation"]["state"].shape == (3, 4)
    assert wire["observation"]["pixels"].shape == (3, 96, 96, 3)
    assert wire["reward"].shape == (3,)
    assert wire["terminated"].dtype == np.bool_
    assert wire["status"] == ["running"] * 3
    assert wire["prompt"] == ["task 0", "task 1", "task 2"]
    assert_same_observation(message, parsed)


def test_scalar_observation_drops_the_slot_axis_and_uses_plain_bools() -> None:
    message = observation(1)
    wire, parsed = over_the_wire(message, Framing.SCALAR, 1)
    assert wire["observation"]["state"].shape == (4,)
    assert wire["observation"]["pixels"].shape == (96, 96, 3)
    assert type(wire["reward"]) is float
    assert type(wire["terminated"]) is bool
    assert wire["status"] == "running"
    assert wire["prompt"] == "task 0"
    assert_same_observation(message, parsed)  # back in the internal batched form


@pytest.mark.parametrize("key", ["success_reported", "success_now"])
def test_an_observation_without_a_later_versions_key_is_refused_naming_the_key(key: str) -> None:
    wire, _ = over_the_wire(observation(3), Framing.BATCHED, 3)
    del wire[key]  # an older server's frame (refused at the hello before it gets here)
    with pytest.raises(WireError, match=f"missing '{key}'"):
        parse_reply(wire, Framing.BATCHED, 3)


def test_step_action_framing() -> None:
    action = np.arange(6, dtype=np.float32).reshape(3, 2)
    wire, parsed = over_the_wire(Step(seq=4, action=action), Framing.BATCHED)
    assert wire == {"type": "step", "seq": 4, "action": wire["action"]}
    assert wire["action"].shape == (3, 2)
    np.testing.assert_array_equal(parsed.action, action)
    wire, parsed = over_the_wire(Step(seq=5, action=action[:1]), Framing.SCALAR)
    assert wire["action"].shape == (2,)
    assert parsed.action.shape == (1, 2)


def test_reset_tasks_framing_and_defaults() -> None:
    tasks = [{"seed": 1}, {"seed": 2, "options": {"level": 3}}]
    wire, parsed = over_the_wire(Reset(seq=1, tasks=tasks), Framing.BATCHED)
    assert wire["task"] == tasks
    assert parsed == Reset(seq=1, tasks=tasks)
    wire, parsed = over_the_wire(Reset(seq=2, tasks=tasks[:1]), Framing.SCALAR)
    assert wire["task"] == {"seed": 1}
    assert parsed.tasks == [{"seed": 1}]
    assert parse_request({"type": "reset", "seq": 3}, Framing.BATCHED, 3) == Reset(seq=3, tasks=[{}, {}, {}])
    assert parse_request({"type": "reset", "seq": 3}, Framing.SCALAR) == Reset(seq=3, tasks=[{}])


def test_result_error_close_and_hello_round_trip() -> None:
    result = Result(seq=3, score=0.5, success=False, slots=[{"slot": 0, "score": 0.5}])
    assert over_the_wire(result, Framing.SCALAR)[1] == result
    error = ErrorFrame(phase="step", message="bad", seq=4, slot=2, traceback="tb")
    assert over_the_wire(error, Framing.BATCHED)[1] == error
    assert over_the_wire(ResultRequest(seq=9), Framing.BATCHED)[1] == ResultRequest(seq=9)
    assert over_the_wire(Close(), Framing.BATCHED)[1] == Close()
    assert parse_reply(to_wire(Close()), Framing.BATCHED) == Close()
    hello = ServerHello(
        protocol=1, framing=Framing.SCALAR, num_envs=1, contract={"a": 1}, server="s", hold="last", max_frame_bytes=9
    )
    assert over_the_wire(hello, Framing.SCALAR)[1] == hello
    assert parse_hello(to_wire(Hello(protocol=1, framing=Framing.BATCHED))) == Hello(1, Framing.BATCHED)
    assert parse_hello({"type": "hello", "protocol": 1}) == Hello(1, None)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "teleport", "seq": 1}, "unknown message type 'teleport'"),
        ({"seq": 1}, "'type' key"),
        ([1, 2], "'type' key"),
        ({"type": "step", "seq": 1}, "'step' frame is missing 'action'"),
        ({"type": "step", "seq": "1", "action": np.zeros((1, 1))}, "'seq' must be int"),
        ({"type": "step", "seq": True, "action": np.zeros((1, 1))}, "'seq' must be int"),
        ({"type": "step", "seq": 1, "action": [0.0]}, "'action' must be ndarray"),
        ({"type": "step", "seq": 1, "action": np.zeros(1), "extra": 1}, r"unknown keys \['extra'\]"),
        ({"type": "reset", "seq": 1, "task": {"seed": 1}}, "list of maps, one per slot"),
        ({"type": "reset", "seq": 1, "task": [1, 2]}, "list of maps, one per slot"),
        ({"type": "observation", "seq": 1}, "a client may not send 'observation'"),
        ({"type": "hello", "protocol": 1}, "a client may not send 'hello'"),
    ],
)
def test_malformed_requests_name_the_problem(frame: dict[str, Any], message: str) -> None:
    with pytest.raises(WireError, match=message):
        parse_request(frame, Framing.BATCHED, 2)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "step", "seq": 1}, "the first frame must be 'hello', got 'step'"),
        ({"type": "hello"}, "missing 'protocol'"),
        ({"type": "hello", "protocol": 1, "framing": "diagonal"}, "unknown framing 'diagonal'"),
        ({"type": "hello", "protocol": 1, "token": "x"}, r"unknown keys \['token'\]"),
    ],
)
def test_malformed_hello_names_the_problem(frame: dict[str, Any], message: str) -> None:
    with pytest.raises(WireError, match=message):
        parse_hello(frame)


def test_replies_are_checked_against_the_slot_count() -> None:
    wire = to_wire(observation(3), Framing.BATCHED)
    wire["reward"] = np.zeros(4)
    with pytest.raises(WireError, match=r"'reward' must have shape \[N=3\], got \[4\]"):
        parse_reply(wire, Framing.BATCHED, 3)
    wire = to_wire(observation(3), Framing.BATCHED)
    wire["observation"]["state"] = np.zeros((2, 4), np.float32)
    with pytest.raises(WireError, match=r"feature 'state' has shape \[2, 4\], not \[N=3"):
        parse_reply(wire, Framing.BATCHED, 3)
    scalar = to_wire(observation(1), Framing.SCALAR)
    scalar["terminated"] = "yes"
    with pytest.raises(WireError, match="'terminated' must be bool"):
        parse_reply(scalar, Framing.SCALAR, 1)
    scalar = to_wire(observation(1), Framing.SCALAR)
    scalar["errors"] = [{"slot": "zero", "message": "m"}]
    with pytest.raises(WireError, match="'slot' must be int"):
        parse_reply(scalar, Framing.SCALAR, 1)
    with pytest.raises(WireError, match="a server may not send 'step'"):
        parse_reply({"type": "step", "seq": 1, "action": np.zeros(1)}, Framing.SCALAR)


def test_message_types_are_the_documented_set() -> None:
    assert {t.value for t in MessageType} == {"hello", "reset", "step", "observation", "result", "error", "close"}
    assert message_type({"type": "result"}) is MessageType.RESULT
