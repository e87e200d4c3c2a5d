"""The in-process link: the real client and server session over a bridge in this process, no socket.

It must behave as a served sim does, byte for byte of the protocol: the same trajectories as plain
gymnasium for every env kind, the same error frames, the same end of running episodes when the
client goes, and the agent loop over it gives what it gives over a spawned child.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hud_pipelines.agent.builtin import scripted_policy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.errors import (
    Fault,
    LinkClosed,
    Phase,
    RemoteError,
    SimCrashedError,
    SimError,
    WireError,
)
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.in_process import InProcessLink
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.sim.slots import SlotState
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import ErrorFrame, Framing, Result, to_wire
from tests.agent.agent_helpers import RecordingSink
from tests.conftest import action_frames, assert_same_trajectory, driven
from tests.sim.test_bridge import CASES, Case


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_in_process_trajectories_are_bit_identical_to_plain_gymnasium(case: Case) -> None:
    with GymBridge(case.factory, case.num_envs, build_args=case.build_args) as bridge:
        framing = None if case.num_envs == 1 else Framing.BATCHED
        with SimClient.in_process(bridge, framing=framing) as client:
            assert client.framing is (Framing.SCALAR if case.num_envs == 1 else Framing.BATCHED)
            frames = action_frames(bridge.envs.single_action_space, case.num_envs, case.steps)
            actual = driven(client.reset, client.step, [{"seed": s} for s in case.seeds()], frames)
    assert_same_trajectory(actual, case.expected(frames))


def test_a_refused_action_is_the_error_frame_a_served_sim_sends() -> None:
    wrong = np.zeros((2, 3), dtype=np.int64)
    with SimProcess.spawn("CartPole-v1", num_envs=2) as process, process.connect() as served:
        served.reset([{"seed": 0}, {"seed": 1}])
        with pytest.raises(RemoteError) as over_the_socket:
            served.step(wrong)
    with GymBridge("CartPole-v1", 2) as bridge, SimClient.in_process(bridge) as client:
        client.reset([{"seed": 0}, {"seed": 1}])
        with pytest.raises(RemoteError) as in_process:
            client.step(wrong)
        assert client.usable, "an error frame leaves the connection usable"
        client.step(np.zeros((2, 1), dtype=np.int64))
    assert (in_process.value.phase, str(in_process.value)) == (over_the_socket.value.phase, str(over_the_socket.value))


def test_closing_mid_episode_ends_the_running_episodes_as_errored() -> None:
    with GymBridge("CartPole-v1", 2) as bridge:
        client = SimClient.in_process(bridge)
        client.reset([{"seed": 0}, {"seed": 1}])
        client.step(np.zeros((2, 1), dtype=np.int64))
        client.close()
        records = bridge.slots.records
        with pytest.raises(SimError, match="unusable: the client was closed"):
            client.step(np.zeros((2, 1), dtype=np.int64))
    assert [r.state for r in records] == [SlotState.ERRORED] * 2
    assert {r.error for r in records} == {"client disconnected mid-episode"}


def test_the_agent_over_the_in_process_link_equals_the_agent_over_a_spawned_child() -> None:
    tasks = [{"seed": 3}, {"seed": 4}, {"seed": 5}]

    def evaluate(client: SimClient) -> tuple[list[object], RecordingSink]:
        sink = RecordingSink()
        policy = scripted_policy("envs.controllers:PendulumSwingUp", client.contract, base_dir=Path())
        outcomes = RobotAgent(policy, client.contract).run(client, tasks, max_steps=60, key=("p", 0, 0), sinks=[sink])
        return list(outcomes), sink

    with GymBridge("Pendulum-v1", 3) as bridge, SimClient.in_process(bridge) as client:
        in_process, in_process_sink = evaluate(client)
    with SimProcess.spawn("Pendulum-v1", num_envs=3) as process, process.connect() as client:
        served, served_sink = evaluate(client)
    assert in_process == served
    assert in_process_sink.frames.keys() == served_sink.frames.keys()
    for trace, frames in served_sink.frames.items():
        for mine, theirs in zip(in_process_sink.frames[trace], frames, strict=True):
            np.testing.assert_array_equal(mine.observation["state"], theirs.observation["state"])
            np.testing.assert_array_equal(mine.action, theirs.action)
            assert mine.reward == theirs.reward


class _AnswersStepsWithResults(InProcessLink):
    """A sim that lies: it answers each step with a ``result`` frame of the right number."""

    aborted = 0

    def recv(self, timeout_s: float) -> bytes:
        frame = unpackb(super().recv(timeout_s))
        if frame.get("type") == "observation" and frame["seq"] > 1:
            return packb(to_wire(Result(seq=frame["seq"], score=0.0, success=False, slots=[])))
        return packb(frame)

    def abort(self) -> None:
        self.aborted += 1
        super().abort()


def test_a_reply_of_the_wrong_kind_drops_the_connection_and_ends_its_episodes() -> None:
    with GymBridge("CartPole-v1", 2) as bridge:
        link = _AnswersStepsWithResults(bridge)
        client = SimClient(link.url, "", link=link)
        client.reset([{"seed": 0}, {"seed": 1}])
        with pytest.raises(WireError, match="expected a Observation reply, got Result"):
            client.step(np.zeros((2, 1), dtype=np.int64))
        assert not client.usable
        assert link.aborted == 1, "a sim that broke the protocol is not talked to again, not even to say goodbye"
        assert [r.state for r in bridge.slots.records] == [SlotState.ERRORED] * 2
        client.close()


class _BreaksItsWord(InProcessLink):
    """A sim written elsewhere that, from its fifth step on, sends what its contract and the protocol forbid."""

    def __init__(self, bridge: GymBridge, fault: str) -> None:
        super().__init__(bridge)
        self.fault = fault

    def recv(self, timeout_s: float) -> bytes:
        frame = unpackb(super().recv(timeout_s))
        if frame.get("type") == "observation" and frame["seq"] > 5:
            observation = frame["observation"]
            if self.fault == "unflagged_nan":  # slot 1's reward, with no 'nonfinite' or 'errors' naming it
                reward = frame["reward"].copy()
                reward[1] = np.nan
                frame["reward"] = reward
            else:  # one column more than the contract's state
                observation["state"] = np.hstack([observation["state"], observation["state"][:, :1]])
        return packb(frame)


@pytest.mark.parametrize(
    ("fault", "said"), [("unflagged_nan", "non-finite reward it did not flag"), ("shape", "broke its contract")]
)
def test_a_sim_that_breaks_its_contract_or_hides_a_nan_ends_its_episodes_as_errored_never_graded(
    fault: str, said: str
) -> None:
    tasks = [{"seed": 3}, {"seed": 4}, {"seed": 5}]
    with GymBridge("Pendulum-v1", 3) as bridge:
        link = _BreaksItsWord(bridge, fault)
        client = SimClient(link.url, "", link=link)
        policy = scripted_policy("envs.controllers:PendulumSwingUp", client.contract, base_dir=Path())
        outcomes = list(RobotAgent(policy, client.contract).run(client, tasks, max_steps=60, key=("p", 0, 0)))
    assert [o.status for o in outcomes] == [EpisodeStatus.ERRORED] * 3
    assert {o.fault for o in outcomes} == {Fault.SIM_LINK if fault == "unflagged_nan" else Fault.CONTRACT}
    assert all(said in (o.error or "") for o in outcomes)
    assert not any(np.isnan(o.total_reward) for o in outcomes)


class _ShutsDown(InProcessLink):
    """A sim whose operator stops it while the client waits: the server closes the connection with 1001."""

    def recv(self, timeout_s: float) -> bytes:
        frame = super().recv(timeout_s)
        if unpackb(frame).get("type") == "observation" and unpackb(frame)["seq"] > 1:
            raise LinkClosed("the peer closed the connection (1001 the sim is shutting down)", code=1001)
        return frame


def test_a_sim_stopped_by_its_operator_is_said_to_have_shut_down_not_to_have_gone_away() -> None:
    with GymBridge("CartPole-v1", 2) as bridge:
        link = _ShutsDown(bridge)
        client = SimClient(link.url, "", link=link)
        client.reset([{"seed": 0}, {"seed": 1}])
        with pytest.raises(SimCrashedError, match=r"shut down during step \(close code 1001\): the peer closed"):
            client.step(np.zeros((2, 1), dtype=np.int64))


class _SaysItShutsDown(InProcessLink):
    """A sim stopped while a step runs: it answers that step with an error of phase ``server``, then closes."""

    def recv(self, timeout_s: float) -> bytes:
        frame = super().recv(timeout_s)
        if unpackb(frame).get("type") == "observation" and unpackb(frame)["seq"] > 1:
            self._closed = LinkClosed("the peer closed the connection (1001 the sim is shutting down)", code=1001)
            return packb(to_wire(ErrorFrame(phase=Phase.SERVER, message="the sim is shutting down")))
        return frame


def test_a_sim_that_answers_that_it_shuts_down_ends_its_episodes_as_crashed_as_when_its_close_comes_first() -> None:
    tasks = [{"seed": 3}, {"seed": 4}]
    with GymBridge("Pendulum-v1", 2) as bridge:
        link = _SaysItShutsDown(bridge)
        client = SimClient(link.url, "", link=link)
        client.reset(tasks)
        with pytest.raises(SimCrashedError, match=r"shut down during step: the sim is shutting down$"):
            client.step(np.zeros((2, 1), dtype=np.float32))
        link = _SaysItShutsDown(bridge)
        client = SimClient(link.url, "", link=link)
        policy = scripted_policy("envs.controllers:PendulumSwingUp", client.contract, base_dir=Path())
        outcomes = list(RobotAgent(policy, client.contract).run(client, tasks, max_steps=60, key=("p", 0, 0)))
    assert {(o.status, o.fault) for o in outcomes} == {(EpisodeStatus.ERRORED, Fault.SIM_CRASHED)}, outcomes


class _DiesAfterServing(InProcessLink):
    """A sim that dies after serving ``steps`` steps: later sends fail, the replies it sent stay readable."""

    def __init__(self, bridge: GymBridge, steps: int) -> None:
        super().__init__(bridge)
        self.steps_left = steps

    def send(self, data: bytes, timeout_s: float) -> None:
        if unpackb(data).get("type") == "step":
            if self.steps_left == 0:
                raise BrokenPipeError(32, "Broken pipe")
            self.steps_left -= 1
        super().send(data, timeout_s)

    def recv(self, timeout_s: float) -> bytes:
        if not self._replies and self.steps_left == 0:
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().recv(timeout_s)


def test_replies_already_sent_by_a_sim_that_died_are_read_before_its_crash_is_reported() -> None:
    """A step sent ahead to a dead sim fails, but the steps it answered before dying are kept."""
    with GymBridge("CartPole-v1", 2) as bridge:
        link = _DiesAfterServing(bridge, steps=3)
        client = SimClient(link.url, "", link=link)
        client.reset([{"seed": 0}, {"seed": 1}])
        sent = [client.send_step(np.zeros((2, 1), dtype=np.int64)) for _ in range(5)]  # steps 4 and 5 are lost
        answered = [client.receive_step(seq) for seq in sent[:3]]
        assert [reply.seq for reply in answered] == sent[:3]
        with pytest.raises(SimCrashedError, match="went away during step"):
            client.receive_step(sent[3])
        assert not client.usable
        with pytest.raises(SimError):
            client.send_step(np.zeros((2, 1), dtype=np.int64))


class _AnnouncesAnEmptyFeature(InProcessLink):
    """A sim written elsewhere whose hello announces a feature of no value (another version's contract)."""

    def recv(self, timeout_s: float) -> bytes:
        frame = unpackb(super().recv(timeout_s))
        if frame.get("type") == "hello":
            frame["contract"]["features"]["state"]["shape"] = [0]
        return packb(frame)


def test_a_hello_whose_contract_is_not_one_is_a_contract_fault_naming_the_sim() -> None:
    """It raised pydantic's error, which no fault maps: the instance failed as if its env had raised."""
    from hud_pipelines.errors import Fault, SimContractError, fault_of

    with GymBridge("CartPole-v1", 2) as bridge:
        link = _AnnouncesAnEmptyFeature(bridge)
        with pytest.raises(SimContractError) as caught:
            SimClient(link.url, "", link=link)
    assert str(caught.value).startswith(f"the sim at {link.url} announced a contract that is not one: ")
    assert "features.state.shape" in str(caught.value)
    assert fault_of(caught.value) is Fault.CONTRACT
