"""Every connection starts from the operator's configuration; a silent client cannot hold the sim.

One served sim, several clients one after another: build arguments and slot records of one client
never reach the next, a client cannot change what only the operator sets, an idle client is closed
with a code it can read, a decode error names the request's ``seq``, and a client that closes and
reconnects at once is not refused as busy.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator
from typing import Any, cast

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from hud_pipelines.errors import RemoteError, SimCrashedError, SimError
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.sim.server import CLOSE_TIMEOUT_S
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import PROTOCOL_VERSION, CloseCode
from tests.conftest import FAULTY

Spawn = Callable[..., SimProcess]


@contextlib.contextmanager
def raw(sim: SimProcess) -> Generator[ClientConnection]:
    """A plain WebSocket client of ``sim`` after the hello exchange (batched framing)."""
    headers = {"Authorization": f"Bearer {sim.token}"}
    with connect(sim.url, additional_headers=headers, compression=None) as ws:
        ws.send(packb({"type": "hello", "protocol": PROTOCOL_VERSION, "framing": "batched"}))
        assert unpackb(ws.recv(timeout=10))["type"] == "hello"
        yield ws


def call(ws: ClientConnection, frame: bytes) -> dict[str, Any]:
    ws.send(frame)
    return cast(dict[str, Any], unpackb(ws.recv(timeout=10)))


def test_build_arguments_of_one_client_never_reach_the_next(spawn: Spawn) -> None:
    sim = spawn("CartPole-v1", build_args={"max_episode_steps": 50})
    with sim.connect() as first:
        first.reset({"seed": 0, "max_episode_steps": 2})
        assert [first.step([[k % 2]]).truncated[0] for k in range(2)] == [False, True]
    with sim.connect() as second:
        fresh = second.result().slots[0]  # before its first reset: none of the first client's episodes
        second.reset({"seed": 0})
        assert not any(second.step([[k % 2]]).truncated[0] for k in range(3))  # the operator's 50 again
        assert second.result().slots[0]["episode"] == 0  # episodes are counted per connection
    assert (fresh["status"], fresh["episode"], fresh["seed"], fresh["steps"]) == ("idle", -1, None, 0)


def test_a_client_may_not_change_the_vectorization_mode(spawn: Spawn) -> None:
    sim = spawn("CartPole-v1", num_envs=2, build_args={"vectorization_mode": "sync"})
    with sim.connect() as client:
        with pytest.raises(RemoteError) as caught:
            client.reset({"seed": 0, "vectorization_mode": "async"})
        assert caught.value.phase == "reset"
        assert "vectorization_mode='async' is refused: it is fixed when the sim starts" in caught.value.message
        assert "with vectorization_mode='sync'" in caught.value.message
        assert client.reset({"seed": 0, "vectorization_mode": "sync"}).status == ["running", "running"]


def test_a_client_silent_after_its_hello_is_closed_with_a_code_it_can_read(spawn: Spawn) -> None:
    sim = spawn(FAULTY, idle_timeout_s=1.0)
    with raw(sim) as ws:
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=10)
        assert 0.9 < time.monotonic() - started < 8
    received = caught.value.rcvd
    assert received is not None
    assert (received.code, received.reason) == (
        CloseCode.IDLE_TIMEOUT,
        "idle for 1 s: no request since the last reply (--idle-timeout-s)",
    )
    client = sim.connect()  # the sim is free again
    client.reset({"seed": 0})
    time.sleep(1.5)
    with pytest.raises(
        SimError, match=r"closed the connection before step: no request reached it for its idle"
    ) as let_go:
        client.step([[0.0]])
    assert not isinstance(let_go.value, SimCrashedError), "the sim did not die: it let a silent client go"
    assert "--idle-timeout-s" in str(let_go.value)
    client.close()
    with sim.connect() as next_client:
        assert next_client.result().slots[0]["status"] == "idle"
        assert next_client.reset({"seed": 1}).status == ["running"]


def test_a_client_back_after_the_server_dropped_its_idle_connection_still_reads_why(spawn: Spawn) -> None:
    """The server drops the socket :data:`CLOSE_TIMEOUT_S` after its close frame: the client's next write then
    breaks, and the close frame waiting in its socket still says why (never "the sim went away")."""
    sim = spawn(FAULTY, idle_timeout_s=0.5)
    client = sim.connect()
    client.reset({"seed": 0})
    time.sleep(0.5 + CLOSE_TIMEOUT_S + 1.0)  # the close frame sent, unanswered; the socket dropped
    with pytest.raises(SimError, match=r"closed the connection before step: no request reached it") as let_go:
        client.step([[0.0]])
    assert not isinstance(let_go.value, SimCrashedError), str(let_go.value)
    assert "--idle-timeout-s" in str(let_go.value)
    client.close()


def test_a_step_longer_than_the_idle_timeout_is_not_silence(spawn: Spawn) -> None:
    """The idle clock runs from the last reply: a request still running in the env never counts as idle."""
    sim = spawn(FAULTY, idle_timeout_s=0.5, build_args={"fault": "slow_step", "at_step": 1, "delay_s": 1.2})
    with sim.connect() as client:
        client.reset({"seed": 0})
        for step in (1, 2):
            assert client.step([[0.0]]).observation["state"][0, 0] == step


def test_a_decode_error_carries_the_requests_seq_when_it_is_readable(spawn: Spawn) -> None:
    sim = spawn(FAULTY)
    with raw(sim) as ws:
        truncated = call(ws, packb({"type": "step", "seq": 3, "action": np.zeros((1, 1), np.float32)})[:-3])
        assert (truncated["phase"], truncated["seq"]) == ("decode", 3)
        missing = call(ws, packb({"type": "step", "seq": 4}))
        assert (missing["phase"], missing["seq"], missing["message"]) == (
            "decode",
            4,
            "'step' frame is missing 'action'",
        )
        unreadable = call(ws, b"\xc1\xc1")
        assert (unreadable["phase"], unreadable["seq"]) == ("decode", None)
        assert call(ws, packb({"type": "reset", "seq": 3, "task": [{"seed": 0}]}))["type"] == "observation"


def test_a_client_that_closes_and_reconnects_at_once_is_not_refused(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "slow_step", "at_step": 1, "delay_s": 0.5})
    for seed in range(10):
        with sim.connect() as client:
            client.reset({"seed": seed})
    with raw(sim) as ws:  # another client's plain close, then straight back
        call(ws, packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))
    client = sim.connect()
    client.reset({"seed": 0})
    client.send_step([[0.0]])  # the sim sleeps in this step while the client goes away
    client.close()
    with sim.connect() as after:  # waits for the step to end instead of a 409
        assert after.reset({"seed": 1}).status == ["running"]


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7.5", 7.5), ("0", 0.0), (None, None), ("nan", None), ("inf", None), ("-3", None), ("soon", None)],
)
def test_a_refusals_running_for_header_counts_only_as_a_finite_number_of_seconds(
    header: str | None, seconds: float | None
) -> None:
    """A ``nan`` read as seconds compared as "not under the step deadline", and lost a server as hung."""
    from hud_pipelines.sim.link import header_seconds

    assert header_seconds(header) == seconds
