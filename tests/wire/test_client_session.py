"""The client's sans-I/O session: sequence numbers, pending replies and the broken state, without a server."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

from hud_pipelines.errors import Phase, RemoteError, SimError, WireError
from hud_pipelines.wire.client_session import ClientSession
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import (
    PROTOCOL_VERSION,
    Close,
    ErrorFrame,
    Framing,
    Observation,
    Reply,
    Result,
    ServerHello,
    SessionState,
    to_wire,
)
from hud_pipelines.wire.parse import parse_request

SLOTS = 2


def server_hello(framing: Framing = Framing.BATCHED, num_envs: int = SLOTS) -> bytes:
    hello = ServerHello(
        protocol=PROTOCOL_VERSION,
        framing=framing,
        num_envs=num_envs,
        contract={},
        server="test",
        hold="last",
        max_frame_bytes=1 << 20,
    )
    return packb(to_wire(hello, framing))


def observation(seq: int, reward: float = 0.0) -> bytes:
    flags = np.zeros(SLOTS, dtype=np.bool_)
    frame = Observation(
        seq=seq,
        observation={"state": np.full((SLOTS, 3), reward, dtype=np.float32)},
        reward=np.full(SLOTS, reward),
        terminated=flags,
        truncated=flags,
        success=flags,
        success_reported=flags,
        success_now=flags,
        status=["running"] * SLOTS,
    )
    return packb(to_wire(frame))


def frame_of(reply: Reply) -> bytes:
    return packb(to_wire(reply))


@pytest.fixture
def session() -> ClientSession:
    session = ClientSession(peer="ws://sim")
    session.receive_hello(server_hello())
    return session


def test_the_hello_asks_for_the_framing_and_the_answer_starts_serving() -> None:
    session = ClientSession(Framing.SCALAR)
    assert unpackb(session.hello()) == {"type": "hello", "protocol": PROTOCOL_VERSION, "framing": "scalar"}
    assert session.state is SessionState.HANDSHAKE
    hello = session.receive_hello(server_hello(Framing.SCALAR, num_envs=1))
    assert (session.state, session.server_hello.framing, session.num_envs) == (
        SessionState.SERVING,
        Framing.SCALAR,
        1,
    )
    assert hello.server == "test"


def test_a_refused_hello_is_a_remote_error_and_breaks_the_session() -> None:
    session = ClientSession()
    with pytest.raises(RemoteError, match="protocol version 9") as raised:
        session.receive_hello(frame_of(ErrorFrame(phase=Phase.HANDSHAKE, message="protocol version 9 ...")))
    assert raised.value.phase == Phase.HANDSHAKE
    assert not session.usable
    assert session.state is SessionState.CLOSED


def test_requests_are_numbered_in_order_and_framed_for_the_connection(session: ClientSession) -> None:
    seqs: list[int] = []
    for seq, frame in (session.reset([{"seed": 1}, {"seed": 2}]), session.step(np.zeros((SLOTS, 1))), session.result()):
        seqs.append(seq)
        request = parse_request(unpackb(frame), Framing.BATCHED, SLOTS)
        assert not isinstance(request, Close)
        assert request.seq == seq
    assert seqs == [1, 2, 3]
    assert session.in_flight == 3


def test_a_reset_needs_one_task_per_slot_and_uses_no_number(session: ClientSession) -> None:
    with pytest.raises(SimError, match="2 slots, 1 tasks"):
        session.reset([{}])
    assert session.reset([{}, {}])[0] == 1
    assert session.usable


def test_pipelined_replies_wait_for_their_caller(session: ClientSession) -> None:
    first, _ = session.step(np.zeros((SLOTS, 1)))
    second, _ = session.step(np.ones((SLOTS, 1)))
    assert session.take(second) is None, "nothing arrived yet"
    session.receive(observation(first, reward=1.0))
    assert session.take(second) is None, "the reply read answers the older request"
    session.receive(observation(second, reward=2.0))
    later = session.take(second)
    earlier = session.take(first)
    assert isinstance(later, Observation)
    assert isinstance(earlier, Observation)
    assert (earlier.reward[0], later.reward[0]) == (1.0, 2.0)
    assert session.in_flight == 0


def test_an_error_frame_raises_for_its_request_only(session: ClientSession) -> None:
    seq, _ = session.step(np.zeros((SLOTS, 1)))
    session.receive(frame_of(ErrorFrame(phase=Phase.STEP, seq=seq, slot=1, message="action refused")))
    with pytest.raises(RemoteError, match="action refused") as raised:
        session.take(seq)
    assert raised.value.slot == 1
    assert session.usable, "an error frame leaves the connection usable"
    later, _ = session.result()
    session.receive(frame_of(Result(seq=later, score=0.0, success=False, slots=[])))
    assert isinstance(session.take(later), Result)


def test_an_error_the_envs_own_code_caused_is_the_envs_fault_not_the_links(session: ClientSession) -> None:
    from hud_pipelines.errors import Fault, fault_of

    seq, _ = session.step(np.zeros((SLOTS, 1)))
    raised_by_env = ErrorFrame(phase=Phase.STEP, seq=seq, message="env.step raised TypeError: x", cause="env")
    session.receive(frame_of(raised_by_env))
    with pytest.raises(RemoteError) as raised:
        session.take(seq)
    assert (raised.value.cause, fault_of(raised.value)) == ("env", Fault.ENV)
    seq, _ = session.step(np.zeros((SLOTS, 1)))
    session.receive(frame_of(ErrorFrame(phase=Phase.STEP, seq=seq, message="no running slot")))
    with pytest.raises(RemoteError) as raised:
        session.take(seq)
    assert fault_of(raised.value) is Fault.SIM_LINK, "an error the env did not cause is the sim's"


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(lambda seq: observation(seq + 1), id="a later number"),
        pytest.param(lambda seq: observation(seq - 1), id="an earlier number"),
        pytest.param(
            lambda seq: frame_of(ErrorFrame(phase=Phase.STEP, seq=seq + 5, message="x")), id="an error for another"
        ),
        pytest.param(lambda seq: b"\xc1 not msgpack", id="undecodable bytes"),
    ],
)
def test_a_reply_that_does_not_answer_the_oldest_request_breaks_the_session(
    session: ClientSession, reply: Callable[[int], bytes]
) -> None:
    seq, _ = session.step(np.zeros((SLOTS, 1)))
    with pytest.raises(WireError):
        session.receive(reply(seq))
    assert not session.usable
    with pytest.raises(SimError, match="ws://sim is unusable"):
        session.step(np.zeros((SLOTS, 1)))
    with pytest.raises(SimError, match="unusable"):
        session.take(seq)


def test_a_reply_of_the_wrong_kind_breaks_the_session(session: ClientSession) -> None:
    seq, _ = session.result()
    session.receive(observation(seq))
    reply = session.take(seq)
    assert reply is not None
    with pytest.raises(WireError, match="expected a Result reply, got Observation"):
        session.expect(reply, Result)
    assert not session.usable


def test_a_reply_nobody_asked_for_breaks_the_session(session: ClientSession) -> None:
    with pytest.raises(WireError, match="no request was waiting"):
        session.receive(observation(1))
    assert not session.usable


def test_a_request_without_a_pending_reply_is_an_error(session: ClientSession) -> None:
    with pytest.raises(SimError, match="no request numbered 7 is waiting for a reply from ws://sim"):
        session.take(7)


def test_after_a_transport_failure_nothing_more_is_sent_not_even_goodbye(session: ClientSession) -> None:
    session.fail("step timed out")
    with pytest.raises(SimError, match="step timed out"):
        session.result()
    assert session.close() is None


def test_closing_says_goodbye_once(session: ClientSession) -> None:
    goodbye = session.close()
    assert goodbye is not None
    assert unpackb(goodbye) == {"type": "close"}
    assert session.close() is None
    assert not session.usable


def held_to_the_contract(session: ClientSession) -> ClientSession:
    session.hold_to({"state": ("float32", (3,))})
    return session


def observation_of(state: np.ndarray, reward: float = 0.0, **fields: object) -> bytes:
    flags = np.zeros(SLOTS, dtype=np.bool_)
    frame = {
        "seq": 1,
        "observation": {"state": state},
        "reward": np.full(SLOTS, reward),
        "terminated": flags,
        "truncated": flags,
        "success": flags,
        "success_reported": flags,
        "success_now": flags,
        "status": ["running"] * SLOTS,
    }
    return packb(to_wire(Observation(**{**frame, **fields})))  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (np.zeros((SLOTS, 4), np.float32), "'state' came as float32 [4] per slot; the contract says float32 [3]"),
        (np.zeros((SLOTS, 3), np.float64), "'state' came as float64 [3] per slot; the contract says float32 [3]"),
    ],
)
def test_an_observation_that_breaks_the_sims_own_contract_is_a_contract_fault_and_breaks_the_session(
    session: ClientSession, state: np.ndarray, said: str
) -> None:
    from hud_pipelines.errors import Fault, fault_of

    seq, _ = held_to_the_contract(session).step(np.zeros((SLOTS, 1)))
    assert seq == 1
    with pytest.raises(
        WireError, match=re.escape(f"the sim at ws://sim broke its contract: observation feature {said}")
    ) as info:
        session.receive(observation_of(state))
    assert fault_of(info.value) is Fault.CONTRACT
    assert not session.usable


def test_an_observation_missing_a_contract_feature_is_a_contract_fault(session: ClientSession) -> None:
    held_to_the_contract(session).hold_to({"state": ("float32", (3,)), "image": ("uint8", (2, 2, 3))})
    session.step(np.zeros((SLOTS, 1)))
    with pytest.raises(WireError, match=r"observation features \['image'\] missing, \[\] not in the contract"):
        session.receive(observation_of(np.zeros((SLOTS, 3), np.float32)))


@pytest.mark.parametrize("where", ["reward", "state"])
def test_a_non_finite_value_the_sim_did_not_flag_breaks_the_session_naming_the_slot(
    session: ClientSession, where: str
) -> None:
    from hud_pipelines.errors import Fault, fault_of

    state = np.zeros((SLOTS, 3), np.float32)
    state[1, 2] = np.nan if where == "state" else 0.0
    frame = observation_of(state, reward=np.nan) if where == "reward" else observation_of(state)
    held_to_the_contract(session).step(np.zeros((SLOTS, 1)))
    with pytest.raises(
        WireError, match=f"sent slot {0 if where == 'reward' else 1} as running with a non-finite {where}"
    ) as info:
        session.receive(frame)
    assert fault_of(info.value) is Fault.SIM_LINK
    assert not session.usable


def test_a_non_finite_value_the_sim_flagged_or_in_a_slot_that_ended_is_passed_on(session: ClientSession) -> None:
    from hud_pipelines.wire.messages import SlotError

    state = np.zeros((SLOTS, 3), np.float32)
    state[:, 0] = np.nan  # slot 0 flagged in this frame, slot 1 errored earlier (its row frozen as it ended)
    flagged = observation_of(
        state,
        status=["errored", "errored"],
        nonfinite=[0],
        errors=[SlotError(slot=0, message="observation 'state' is not finite at step 1 (slot 0)", cause="nonfinite")],
    )
    held_to_the_contract(session).step(np.zeros((SLOTS, 1)))
    session.receive(flagged)
    reply = session.take(1)
    assert isinstance(reply, Observation)
    assert reply.nonfinite == [0]
    assert session.usable


def test_a_slot_that_ended_keeps_its_non_finite_row_while_a_done_slot_must_still_be_finite(
    session: ClientSession,
) -> None:
    state = np.zeros((SLOTS, 3), np.float32)
    state[0] = np.nan  # slot 0 errored on it earlier: its row stays as it ended, in every later frame
    reward = np.array([np.nan, 0.0])
    frozen = observation_of(state, status=["errored", "done"])
    held_to_the_contract(session).step(np.zeros((SLOTS, 1)))
    session.receive(frozen)
    assert session.usable
    session.take(1)
    frame = {**unpackb(observation_of(state, status=["errored", "done"])), "seq": 2}
    frame["reward"] = reward[::-1].copy()  # now the done slot's reward is NaN, and nothing says so
    session.step(np.zeros((SLOTS, 1)))
    with pytest.raises(WireError, match="sent slot 1 as done with a non-finite reward it did not flag"):
        session.receive(packb(frame))


def test_another_kind_of_server_at_a_sims_address_is_named_by_its_address_and_what_it_may_be() -> None:
    """A pipeline's ``sim.url`` at an openpi policy server said only "a frame must be a msgpack map with a 'type'
    key", naming neither the address nor what was wrong with it."""
    session = ClientSession(peer="ws://gpu-box:8000")
    session.hello()
    with pytest.raises(WireError) as refused:
        session.receive_hello(packb({"policy": "pi0", "action_horizon": 10}))  # an openpi server's metadata frame
    said = str(refused.value)
    assert said.startswith("ws://gpu-box:8000 answered the handshake with a frame that is no sim's hello (a frame must")
    assert said.endswith("by `hud-pipelines serve` of this version, or another kind of server (a policy server)?")
    assert session.broken is not None, "the session is unusable from there on"
