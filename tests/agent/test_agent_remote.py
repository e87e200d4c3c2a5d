"""The remote kind against a tiny in-test server that speaks openpi's websocket policy protocol.

The server encodes arrays the way openpi's ``msgpack_numpy`` does (binary ``__ndarray__`` keys),
independently of the client's own codec, so the round trip proves the two layouts agree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from agent_helpers import countdown_contract
from websockets.exceptions import ConnectionClosedError
from websockets.sync.server import Server, ServerConnection, serve

from hud_pipelines.agent.factory import build_policy
from hud_pipelines.agent.policy import Policy, PolicyBatch
from hud_pipelines.agent.remote import RemotePolicy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.errors import PolicyError
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.spec.agent import RemotePolicyConfig


def openpi_pack(obj: Any) -> bytes:
    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return {b"__ndarray__": True, b"data": value.tobytes(), b"dtype": value.dtype.str, b"shape": value.shape}
        if isinstance(value, np.generic):
            return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
        return value

    return msgpack.packb(obj, default=default, use_bin_type=True)


def openpi_unpack(data: bytes) -> Any:
    def hook(obj: dict[Any, Any]) -> Any:
        if b"__ndarray__" in obj:
            return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
        return obj

    return msgpack.unpackb(data, object_hook=hook)


class PolicyServer:
    """Metadata frame first, then ``infer(obs) -> {"actions": ...}`` per message; text frames on error."""

    def __init__(
        self,
        infer: Callable[[dict[str, Any]], Any],
        api_key: str | None = None,
        *,
        answers: int | None = None,
        port: int = 0,
        late_metadata: dict[int, float] | None = None,
        metadata: Any = None,
    ) -> None:
        self.infer = infer
        self.metadata = {"policy": "test", "action_horizon": 3} if metadata is None else metadata
        """What its first frame on each connection says of its policy."""
        self.late_metadata = late_metadata or {}
        """Connection number -> seconds its metadata frame is held back (a server busy when a client connects)."""
        self.answers = answers
        """How many requests it answers before it goes away (its connections dropped unanswered): a crash."""
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[str | None] = []
        self.ends: list[str] = []
        """How each connection ended: ``closed`` (a close frame came), ``dropped`` (none came) or ``served``."""
        self.server: Server = serve(self._handle, "127.0.0.1", port, compression=None, max_size=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.socket.getsockname()[:2]
        return f"ws://{host}:{port}"

    def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.headers.append(ws.request.headers.get("Authorization"))
        time.sleep(self.late_metadata.get(len(self.headers) - 1, 0.0))
        ws.send(openpi_pack(self.metadata))
        try:
            for message in ws:
                assert isinstance(message, bytes)
                observation = openpi_unpack(message)
                self.requests.append(observation)
                if self.answers is not None and len(self.requests) > self.answers:
                    self.ends.append("served")
                    return  # the connection drops with the request unanswered
                try:
                    ws.send(openpi_pack({"actions": self.infer(observation), "server_timing": {"infer_ms": 1.0}}))
                except Exception as exc:
                    ws.send(f"Traceback (most recent call last):\n  {type(exc).__name__}: {exc}")
        except ConnectionClosedError:
            self.ends.append("dropped")
            raise
        self.ends.append("closed")

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def pd_server() -> Iterator[PolicyServer]:
    """Serves the CartPole PD law over one unbatched observation, as a 3-step chunk."""

    def infer(observation: dict[str, Any]) -> np.ndarray:
        x, x_dot, theta, theta_dot = observation["observation/state"].tolist()
        push = float(0.1 * x + 0.5 * x_dot + 10 * theta + 2 * theta_dot > 0)
        assert observation["prompt"] == "CartPole-v1"
        return np.full((3, 1), push, dtype=np.float32)

    server = PolicyServer(infer, api_key="secret")
    yield server
    server.close()


def test_remote_policy_round_trip_balances_cartpole(pd_server: PolicyServer) -> None:
    with GymBridge("CartPole-v1", 2) as bridge:
        config = RemotePolicyConfig(
            url=pd_server.url, api_key="secret", rename={"state": "observation/state"}, timeout_s=10
        )
        policy = build_policy(config, bridge.contract, base_dir=Path())
        assert isinstance(policy, RemotePolicy)
        assert policy.metadata == {"policy": "test", "action_horizon": 3}
        agent = RobotAgent(policy, bridge.contract, horizon=1)
        outcomes = agent.run(bridge, [{"seed": 0}, {"seed": 1}], max_steps=600, key=("remote", 0, 0))
        policy.close()
    assert [o.steps for o in outcomes] == [500, 500]
    assert pd_server.headers == ["Api-Key secret"]
    assert len(pd_server.requests) == 2 * 500, "one unbatched request per slot per refill"
    assert pd_server.requests[0]["observation/state"].shape == (4,)


def test_batched_requests_carry_the_batch_axis() -> None:
    server = PolicyServer(lambda obs: np.repeat(obs["x"][:, None, :] * 2, 2, axis=1))
    try:
        contract = countdown_contract()
        with RemotePolicy(server.url, contract, batched=True, rename={"state": "x"}) as policy:
            out = policy.infer(
                PolicyBatch(observation={"state": np.array([[1.0], [2.0]], dtype=np.float32)}, prompts=["a", "b"])
            )
    finally:
        server.close()
    assert out.shape == (2, 2, 1)
    assert out[:, 0, 0].tolist() == [2.0, 4.0]
    assert server.requests[0]["prompt"] == ["a", "b"]


def test_server_errors_and_bad_replies_are_policy_errors() -> None:
    contract = countdown_contract()

    def infer(observation: dict[str, Any]) -> Any:
        if observation["state"][1] > 0:
            raise ValueError("the model is not loaded")
        if observation["state"][0] > 0:
            return "not an array"
        return np.zeros((5, 2), dtype=np.float32)

    server = PolicyServer(infer)
    url = server.url
    try:
        with RemotePolicy(url, contract, timeout_s=10) as policy:
            good = PolicyBatch(observation={"state": np.zeros((1, 2), dtype=np.float32)}, prompts=[""])
            said = r"returned actions of shape \[5, 2\] for one observation; expected \[T, A=1\] or \[A=1\]"
            with pytest.raises(PolicyError, match=said):  # the server's own shape, not one with a batch axis added
                policy.infer(good)
            bad = PolicyBatch(observation={"state": np.ones((1, 2), dtype=np.float32)}, prompts=[""])
            with pytest.raises(PolicyError) as failed:
                policy.infer(bad)
            headline, *rest = str(failed.value).splitlines()
            assert headline == f"the policy server at {url} reported an error: ValueError: the model is not loaded"
            assert rest[0] == "Traceback (most recent call last):", "the whole traceback follows"
            words = PolicyBatch(observation={"state": np.array([[1.0, 0.0]], dtype=np.float32)}, prompts=[""])
            with pytest.raises(PolicyError) as unreadable:
                policy.infer(words)
            assert str(unreadable.value) == (
                f"the policy server at {url} replied with 'actions' that are no array of numbers ('not an array'); "
                "expected [T, A=1] or [A=1]"
            )
            assert unreadable.value.__suppress_context__, "one error, not the conversion's traceback before it"
    finally:
        server.close()
    with pytest.raises(PolicyError, match="cannot connect to the policy server"):
        RemotePolicy(url, contract, timeout_s=2)


def test_a_reply_that_misses_its_deadline_is_never_taken_for_the_next_requests() -> None:
    """The protocol numbers no request: after a timeout the connection is one reply behind, so it is
    dropped and the next call gets its own answer on a new one (it got the late reply before)."""
    import time

    from hud_pipelines.errors import Fault, PolicyTimeoutError, fault_of

    def infer(observation: dict[str, Any]) -> np.ndarray:
        if observation["state"][0] == 7:
            time.sleep(1.5)  # past the client's deadline
        return np.full((1, 1), observation["state"][0], dtype=np.float32)

    server = PolicyServer(infer)
    try:
        with RemotePolicy(server.url, countdown_contract(), timeout_s=0.5) as policy:

            def ask(value: float) -> float:
                batch = PolicyBatch(observation={"state": np.full((1, 2), value, np.float32)}, prompts=[""])
                return float(policy.infer(batch)[0, 0, 0])

            assert ask(1) == 1
            with pytest.raises(PolicyTimeoutError, match=r"did not send an inference reply within 0.5 s") as late:
                ask(7)
            assert fault_of(late.value) is Fault.POLICY_TIMEOUT, "the fault forward_timeout_s gives: the instance fails"
            assert [ask(value) for value in (2, 3)] == [2, 3], "each call its own reply, not the one before"
    finally:
        server.close()
    assert len(server.headers) == 2, "one new connection after the timeout"


def test_a_rename_of_no_feature_and_a_url_without_its_scheme_are_refused_before_connecting() -> None:
    import pydantic

    with pytest.raises(PolicyError, match=r"rename names \['stat'\], which are not observation features.*'state'"):
        RemotePolicy("ws://127.0.0.1:9", countdown_contract(), rename={"stat": "observation/state"})
    with pytest.raises(pydantic.ValidationError, match="url"):
        RemotePolicyConfig.model_validate({"kind": "remote", "url": "localhost:8790"})


def test_a_policy_config_error_errors_every_instance_with_its_message_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import json
    import logging

    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text

    policy = {"kind": "remote", "url": "ws://127.0.0.1:9", "rename": {"stat": "observation/state"}}
    text = {"name": "remote_typo", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": policy}, "max_steps": 5}
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "remote_typo.yaml")
    with caplog.at_level(logging.ERROR, logger="hud_pipelines"):
        evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in evaluation.rows} == {Fault.SETUP}
    assert all("rename names ['stat']" in (row.error or "") for row in evaluation.rows)
    logged = [r for r in caplog.records if "could not be built" in r.getMessage()]
    assert logged
    assert all(r.exc_info is None for r in logged), "our own clear message, without a traceback burying it"


def test_a_policy_server_that_goes_away_fails_its_instance_and_earlier_results_stand(tmp_path: Path) -> None:
    """A server lost mid-run errored every later episode as the policy's fault: the run passed with 2 of 12
    answered, and those errored rows replaced the complete results of an earlier run. Now the instance
    fails (``policy_link``), as when its sim dies, and the earlier results of its configuration are kept."""
    import time

    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.kept import kept_failure
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.steps import evaluate

    def push(observation: dict[str, Any]) -> np.ndarray:
        return np.ones((2, 1), dtype=np.float32)

    def spec_for(url: str) -> Any:
        return _remote_pipeline(tmp_path / "remote_lost.yaml", url, num_envs=2, max_steps=30, max_concurrent=1)

    healthy = PolicyServer(push)
    url = healthy.url  # the same server is restarted below: the same configuration
    port = int(url.rsplit(":", 1)[1])
    try:
        first = evaluate(spec_for(url), outputs_dir=tmp_path / "out")
        deadline = time.monotonic() + 5
        while not healthy.ends and time.monotonic() < deadline:
            time.sleep(0.05)
        assert healthy.ends == ["closed"], "the run ends its connection with a close frame (it left it open)"
    finally:
        healthy.close()
    assert first.passed
    crashing = PolicyServer(push, answers=3, port=port)  # answers the first instance's first requests, then drops all
    try:
        spec = spec_for(url)
        lost = evaluate(spec, outputs_dir=tmp_path / "out")
    finally:
        crashing.close()
    assert [(r.key, r.fault) for r in lost.failed_instances] == [(f"task0-i{i}", Fault.POLICY_LINK) for i in (0, 1)]
    assert all("went away" in (r.error or "") for r in lost.failed_instances)
    assert not lost.passed
    assert lost.rows == first.rows, "the earlier complete results stand"
    said = kept_failure(spec, EvalOutputs(tmp_path / "out", "remote_lost"), lost.results) or ""
    assert f"task0-i0, task0-i1 did not complete (policy_link: the policy server at {url} went away" in said


def test_a_forward_given_up_on_frees_the_connection_for_the_next_at_once() -> None:
    """A forward past ``forward_timeout_s`` held the policy's lock while its read waited out ``timeout_s``: the next
    forwards queued behind it timed out too, failing instances that never reached the server. Now the connection
    under it is cut, and the next forward gets its own reply on a new one."""
    from hud_pipelines.agent.batching import BatchedModel
    from hud_pipelines.errors import PolicyTimeoutError

    server = PolicyServer(_echo(slow_on=7, seconds=3))  # past forward_timeout_s, well within the policy's timeout_s
    try:
        remote = RemotePolicy(server.url, countdown_contract(), timeout_s=60)
        with BatchedModel(remote, forward_timeout_s=1.0, max_wait_s=0.0) as model:
            with pytest.raises(PolicyTimeoutError, match="forward_timeout_s=1"):
                _ask(model, 7)
            asked = time.monotonic()
            assert _ask(model, 2) == 2, "its own reply, not the late one"
            assert time.monotonic() - asked < 1.0, "not queued behind the abandoned forward"
    finally:
        server.close()
    assert len(server.headers) == 2, "a new connection after the abandoned one"


def test_a_policy_server_that_cannot_be_reached_at_the_start_is_a_policy_link_fault(tmp_path: Path) -> None:
    import json
    import socket

    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{unused.getsockname()[1]}"
    policy = {"kind": "remote", "url": url, "timeout_s": 5}
    text = {"name": "remote_down", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": policy}, "max_steps": 5}
    evaluation = evaluate(load_pipeline_text(json.dumps(text), source=tmp_path / "down.yaml"), outputs_dir=tmp_path)
    assert {row.fault for row in evaluation.rows} == {Fault.POLICY_LINK}, "as when it goes away later, not setup"
    assert all(f"cannot connect to the policy server at {url}" in (row.error or "") for row in evaluation.rows)


def test_a_server_that_sends_no_metadata_within_timeout_s_is_a_link_fault_not_the_rows() -> None:
    """It was the policy's own error, so a forward of several rows was run again row by row, each waiting out
    ``timeout_s`` on a connection of its own."""
    from hud_pipelines.errors import PolicyLinkError

    server = PolicyServer(_echo(slow_on=-1, seconds=0), late_metadata={0: 3.0})
    try:
        with pytest.raises(PolicyLinkError, match=r"did not send the metadata frame within 0\.5 s"):
            RemotePolicy(server.url, countdown_contract(), timeout_s=0.5)  # every connection reads it, as this one
    finally:
        server.close()


def test_a_forward_given_up_on_while_it_connects_frees_the_next_at_once() -> None:
    """A forward abandoned while it read a new connection's metadata frame kept the lock until ``timeout_s``."""
    from hud_pipelines.agent.batching import BatchedModel
    from hud_pipelines.errors import PolicyTimeoutError

    server = PolicyServer(_echo(slow_on=7, seconds=2), late_metadata={1: 3.0})  # the 2nd connection's comes late
    try:
        remote = RemotePolicy(server.url, countdown_contract(), timeout_s=60)
        with BatchedModel(remote, forward_timeout_s=1.0, max_wait_s=0.0) as model:
            with pytest.raises(PolicyTimeoutError):
                _ask(model, 7)
            with pytest.raises(PolicyTimeoutError):
                _ask(model, 2)  # given up on while it waits for the second connection's metadata
            assert _ask(model, 3) == 3, "on a third connection, not behind the forward that waited for the metadata"
    finally:
        server.close()
    assert len(server.headers) == 3


def _echo(*, slow_on: float, seconds: float) -> Callable[[dict[str, Any]], np.ndarray]:
    """A server's policy answering each observation with its first value, ``seconds`` late for ``slow_on``."""

    def infer(observation: dict[str, Any]) -> np.ndarray:
        if observation["state"][0] == slow_on:
            time.sleep(seconds)
        return np.full((1, 1), observation["state"][0], dtype=np.float32)

    return infer


def _remote_pipeline(path: Path, url: str, *, num_envs: int, max_steps: int, **more: Any) -> Any:
    """A CartPole pipeline of two instances driven by the policy server at ``url``, named by ``path``'s stem."""
    import json

    from hud_pipelines.spec.loader import load_pipeline_text

    policy = {"kind": "remote", "url": url, "rename": {"state": "observation/state"}, "timeout_s": 10}
    text = {
        "name": path.stem,
        "sim": {"factory": "CartPole-v1", "num_envs": num_envs},
        "agent": {"policy": policy},
        "group": 2,
        "max_steps": max_steps,
        "graders": [{"kind": "return", "threshold": 5}],
        **more,
    }
    return load_pipeline_text(json.dumps(text), source=path)


def _ask(policy: Policy, value: float) -> float:
    """The one action ``policy`` gives for a one-row batch of state ``[value, value]``."""
    batch = PolicyBatch(observation={"state": np.full((1, 2), value, np.float32)}, prompts=[""])
    return float(policy.infer(batch)[0, 0, 0])


def _until_closed(remote: RemotePolicy) -> None:
    """Until ``remote`` has seen its server close its connection (its reading thread takes the close frame)."""
    from websockets.protocol import State

    connection = remote._ws  # pyright: ignore[reportPrivateUsage]
    deadline = time.monotonic() + 5
    while connection is not None and connection.protocol.state is State.OPEN and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_policy_server_restarted_on_its_address_is_waited_for_briefly_and_one_that_stays_down_is_not() -> None:
    """A served sim restarted at its address within its grace takes the later instances; a policy server got none:
    every forward after it went away failed at once with "Connection refused", so a restart cost the whole run.
    The connection its server closed between two forwards was even used again: the next forward failed on it."""
    from hud_pipelines.errors import PolicyLinkError
    from hud_pipelines.sim.fleet import RETURN_GRACE_S

    first = PolicyServer(_echo(slow_on=-1, seconds=0))
    port = int(first.url.rsplit(":", 1)[1])
    remote = RemotePolicy(first.url, countdown_contract(), timeout_s=10)
    restarted: list[PolicyServer] = []
    try:
        assert _ask(remote, 2) == 2
        first.close()
        _until_closed(remote)
        threading.Timer(1.0, lambda: restarted.append(PolicyServer(_echo(slow_on=-1, seconds=0), port=port))).start()
        assert _ask(remote, 4) == 4, "the next forward connects anew, and waits for the restart"
        assert restarted
        restarted[0].close()
        _until_closed(remote)
        started = time.monotonic()
        with pytest.raises(PolicyLinkError, match="cannot connect to the policy server"):
            _ask(remote, 6)
        assert time.monotonic() - started >= RETURN_GRACE_S, "refused within the grace: tried again"
        started = time.monotonic()
        with pytest.raises(PolicyLinkError, match="cannot connect to the policy server"):
            _ask(remote, 7)
        assert time.monotonic() - started < RETURN_GRACE_S / 2, "down past its grace: the next forward fails at once"
    finally:
        remote.close()
        for server in restarted:
            server.close()


def test_a_servers_error_is_headed_by_the_exception_its_traceback_ends_with() -> None:
    """The last line of a traceback whose exception message has several lines was the message's tail alone."""
    from hud_pipelines.agent.remote import _headline  # pyright: ignore[reportPrivateUsage]

    traceback = (
        "Traceback (most recent call last):\n"
        '  File "server.py", line 3, in infer\n'
        "    model.load_state_dict(state)\n"
        "RuntimeError: Error(s) in loading state_dict for Net:\n"
        '\tMissing key(s) in state_dict: "head.weight".\n'
    )
    assert _headline(traceback) == "RuntimeError: Error(s) in loading state_dict for Net:"
    assert _headline("the model is not loaded") == "the model is not loaded"
    assert _headline("first\nlast line\n") == "last line"


def test_a_policy_held_to_its_runs_server_refuses_a_server_of_another_policy_restarted_on_its_address() -> None:
    """A server restarted mid-run with other weights answered the rest of the run's episodes: one rate of two
    policies. A policy held to what its run's server said of its policy refuses a connection to another, as a
    lost server's forward fails (``policy_link``); the same policy restarted is served on."""
    from hud_pipelines.errors import PolicyLinkError

    push = _echo(slow_on=-1, seconds=0)
    weights = np.arange(4, dtype=np.float32)
    first = PolicyServer(push, metadata={"policy": "pi0", "stats": weights, b"step": np.int64(1000)})
    url, port = first.url, int(first.url.rsplit(":", 1)[1])
    model = RemotePolicy(url, countdown_contract(), timeout_s=5)
    try:
        identity = model.identity()
        assert identity["step"] == 1000, "JSON: its keys as text"
        assert identity["stats"]["shape"] == [4], "an array as its dtype, shape and digest"
        model.hold_to(identity)
        assert _ask(model, 1) == 1
        first.close()
        same = PolicyServer(push, port=port, metadata={"policy": "pi0", "stats": weights.copy(), "step": 1000})
        try:
            assert _ask(model, 2) == 2, "the same policy restarted on its address is served on"
        finally:
            same.close()
        other = PolicyServer(push, port=port, metadata={"policy": "pi0", "stats": weights + 1, "step": 2000})
        try:
            with pytest.raises(PolicyLinkError, match="serves another policy than this run's") as refused:
                _ask(model, 3)
            assert '"step": 2000' in str(refused.value)
            assert '"step": 1000' in str(refused.value)
        finally:
            other.close()
    finally:
        model.close()


def test_results_of_another_policy_served_at_the_same_address_are_not_pooled_with_the_first(tmp_path: Path) -> None:
    """Two policies served in turn at one URL had one configuration: a run of one instance with the second
    kept the first's results of the others as current, and the rate pooled both. What the server says of its
    policy is now in the results' provenance: the first's show as not run, naming what changed; the same
    policy served again keeps them."""

    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.steps import evaluate

    def push(observation: dict[str, Any]) -> np.ndarray:
        return np.ones((2, 1), dtype=np.float32)

    def served(metadata: dict[str, Any], port: int = 0) -> PolicyServer:
        return PolicyServer(push, port=port, metadata=metadata)

    def run(url: str, instance: int | None = None) -> Any:
        spec = _remote_pipeline(tmp_path / "remote_identity.yaml", url, num_envs=1, max_steps=5)
        chosen = None if instance is None else [spec.partition_for_key(f"task0-i{instance}")]
        return evaluate(spec, outputs_dir=tmp_path / "out", partitions=chosen)

    first = served({"policy": "a"})
    url, port = first.url, int(first.url.rsplit(":", 1)[1])
    try:
        run(url)
    finally:
        first.close()
    again = served({"policy": "a"}, port)
    try:
        same = run(url, instance=1)
    finally:
        again.close()
    assert all(row.fault is None for row in same.rows), "the same policy: the other instance's result is current"
    other = served({"policy": "b"}, port)
    try:
        second = run(url, instance=1)
    finally:
        other.close()
    stale = [row for row in second.rows if row.instance == 0]
    assert stale
    assert {row.fault for row in stale} == {Fault.NOT_RUN}, "the first policy's results are not pooled"
    assert all(
        """the policy server's metadata `{"policy": "a"}` -> `{"policy": "b"}`""" in (row.error or "") for row in stale
    )
    assert all(row.fault is None for row in second.rows if row.instance == 1)
    report = (tmp_path / "out" / "remote_identity" / "report.md").read_text()
    assert """- the policy server's metadata: `{"policy": "b"}`""" in report


def test_a_unit_whose_server_serves_another_policy_than_its_runs_first_claim_is_refused(tmp_path: Path) -> None:
    """Units of one run on several workers may reach several servers behind one URL: the first claim of the run
    holds, and a unit that meets another policy is refused before any episode, naming both."""
    from hud_pipelines.errors import PolicyLinkError
    from hud_pipelines.eval.configuration import hold_served_policy, read_served_policy
    from hud_pipelines.eval.outputs import EvalOutputs

    outputs = EvalOutputs(tmp_path, "claimed")
    first, second = (PolicyServer(_echo(slow_on=-1, seconds=0), metadata={"policy": name}) for name in "ab")
    try:
        one, other = (RemotePolicy(server.url, countdown_contract(), timeout_s=5) for server in (first, second))
        hold_served_policy(one, outputs, "run-1")
        assert read_served_policy(outputs, "run-1") == {"metadata": {"policy": "a"}}
        with pytest.raises(PolicyLinkError, match=r'of its policy `\{"policy": "a"\}` -> `\{"policy": "b"\}`'):
            hold_served_policy(other, outputs, "run-1")
        hold_served_policy(other, outputs, "run-2")  # another run claims its own
        assert _ask(other, 4) == 4
        one.close()
        other.close()
    finally:
        first.close()
        second.close()


def test_a_policy_server_down_at_the_start_of_a_run_leaves_the_earlier_results_in_place(tmp_path: Path) -> None:
    """A run that could not reach its policy server claimed no identity, so its attempts were judged another
    environment than the earlier results (which carry one) and wiped them. The latest claim stands for it."""
    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.steps import evaluate

    server = PolicyServer(lambda observation: np.ones((1, 1), np.float32), metadata={"policy": "a"})
    url = server.url
    spec = _remote_pipeline(tmp_path / "remote_down.yaml", url, num_envs=1, max_steps=3)
    try:
        first = evaluate(spec, outputs_dir=tmp_path / "out")
    finally:
        server.close()
    assert {row.fault for row in first.rows} == {None}
    down = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {r.fault for r in down.results} == {Fault.POLICY_LINK}
    assert down.rows == first.rows, "the earlier complete results stand"


def test_a_policy_identity_is_strict_json_that_tells_apart_what_the_server_said() -> None:
    from hud_pipelines.agent.policy_identity import LONG_LIST, canonical, metadata_identity

    said = metadata_identity(
        {
            b"\xff": 1,  # no UTF-8: kept, not a crash of every instance
            b"a": 1,
            "a": 2,  # two keys, not one
            "nan": float("nan"),
            "scalar": np.float32(0.5),
            "zero_d": np.array(3.0),
            "stats": list(range(LONG_LIST + 1)),
        }
    )
    text = canonical(said)
    __import__("json").loads(text, parse_constant=lambda name: pytest.fail(f"{name} is no strict JSON"))
    assert said["\\xff"] == 1
    assert {said["a"], said["'a'"]} == {1, 2}
    assert said["zero_d"]["shape"] == [], "a 0-d array keeps its shape"
    assert said["stats"]["list"] == LONG_LIST + 1, "a long list is its length and digest"
    assert said["scalar"] == 0.5
    assert metadata_identity({"stats": list(range(LONG_LIST + 1))}) != metadata_identity(
        {"stats": list(range(1, LONG_LIST + 2))}
    )


def test_metadata_that_differs_past_what_a_message_quotes_is_said_by_the_keys_that_differ() -> None:
    """Two long metadata frames differing after their first 300 characters read as the same quoted text twice."""
    from hud_pipelines.agent.policy_identity import changed

    long = {"a_norm": "q" * 400, "step": 1}
    assert changed(long, long | {"step": 2}) == (
        f'changed in step (past the first 300 characters of `{{"a_norm": "{"q" * 285}...`)'
    )
    assert changed({"policy": "a"}, {"policy": "b"}) == '`{"policy": "a"}` -> `{"policy": "b"}`'
