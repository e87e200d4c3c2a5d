"""Fault injection: every fault is a clear error naming the culprit, no wedged server, no orphan.

Each test that ends a child asserts its process group is gone (``os.killpg(pgid, 0)`` raising
``ProcessLookupError``); tests that only send bad input prove the server keeps serving, on the same
connection or the next one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import msgpack
import numpy as np
import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import Server, ServerConnection, serve
from websockets.uri import parse_uri

from hud_pipelines.errors import (
    RemoteError,
    SimCrashedError,
    SimError,
    SimRefusedError,
    SimStartError,
    SimTimeoutError,
    WireError,
)
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.wire.codec import NDARRAY_KEY, packb, unpackb
from hud_pipelines.wire.messages import PROTOCOL_VERSION
from tests.conftest import FAULTY, REPO, wait_group_gone

Spawn = Callable[..., SimProcess]
MAX_FRAME_BYTES = 100_000


# ---------------------------------------------------------------------------------------------
# the child dies or hangs


def test_a_sigkilled_child_is_detected_within_a_second_mid_step(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "slow_step", "at_step": 2, "delay_s": 2.0})
    client = sim.connect(step_timeout_s=30)
    client.reset({"seed": 0})
    client.step([[0.0]])
    assert sim.pid is not None
    killer = threading.Timer(0.2, os.killpg, (sim.pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(SimCrashedError) as caught:
        client.step([[0.0]])  # the env sleeps in this step when the kill lands
    detected = time.monotonic() - started - 0.2
    killer.join()
    assert detected < 1.0, f"the crash took {detected:.2f} s to notice"
    message = str(caught.value)
    assert "went away during step" in message
    assert "was killed by SIGKILL" in message
    with pytest.raises(SimError, match="unusable: connection lost during step"):
        client.step([[0.0]])  # a broken link never serves a late reply
    client.close()
    wait_group_gone(sim.pid)


def test_a_child_that_kills_itself_in_step_is_a_crash_with_its_exit_status(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "crash_step", "at_step": 1})
    with sim.connect(step_timeout_s=30) as client:
        client.reset({"seed": 0})
        with pytest.raises(SimCrashedError, match="killed by SIGKILL"):
            client.step([[0.0]])
    assert sim.pid is not None
    wait_group_gone(sim.pid)


def test_steps_a_child_answered_before_it_died_are_read_though_later_sends_fail(spawn: Spawn) -> None:
    """Steps sent ahead to a dead sim fail to send; the replies it wrote before dying are still read."""
    sim = spawn(FAULTY, build_args={"fault": "crash_step", "at_step": 4})
    assert sim.pid is not None
    with sim.connect(step_timeout_s=30) as client:
        client.reset({"seed": 0})
        answered = [client.send_step([[0.0]]) for _ in range(3)]
        fatal = client.send_step([[0.0]])  # the sim kills itself in this step
        deadline = time.monotonic() + 30
        while sim.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sim.alive()
        lost = [client.send_step([[0.0]]) for _ in range(3)]  # to a dead peer: the socket refuses them
        assert [client.receive_step(seq).seq for seq in answered] == answered
        with pytest.raises(SimCrashedError, match="killed by SIGKILL"):
            client.receive_step(fatal)
        assert not client.usable
        assert lost, "sent ahead before the crash was known"
    wait_group_gone(sim.pid)


@pytest.mark.parametrize("where", ["step", "reset"])
def test_a_hung_child_misses_its_deadline_and_its_group_is_killed(spawn: Spawn, where: str) -> None:
    sim = spawn(FAULTY, build_args={"fault": f"hang_{where}", "at_step": 1})
    client = sim.connect(step_timeout_s=1.0, reset_timeout_s=1.0)
    started = time.monotonic()
    if where == "step":
        client.reset({"seed": 0})
    with pytest.raises(SimTimeoutError) as caught:
        client.reset({"seed": 0}) if where == "reset" else client.step([[0.0]])
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"did not answer {where} within 1 s; it is presumed hung" in message, message
    assert "killed by SIGKILL" in message, message
    client.close()
    assert sim.pid is not None
    wait_group_gone(sim.pid)  # the client's deadline killed the group, not the teardown


DAEMON_ENV = """
import os, subprocess, sys
import gymnasium as gym

DOUBLE_FORK = (
    "import os, sys, time\\n"
    "middle = os.fork()\\n"
    "if middle:\\n"
    "    os.waitpid(middle, 0)\\n"
    "else:\\n"
    "    os.setsid()\\n"
    "    daemon = os.fork()\\n"
    "    if daemon == 0:\\n"
    "        time.sleep(1000)\\n"
    "    with open(sys.argv[1], 'a') as log:\\n"
    "        log.write(f'{daemon}\\\\n')\\n"
    "    os._exit(0)\\n"
)

def make(pids: str):
    env = gym.make("CartPole-v1")
    reset = env.reset

    def reset_starting_a_daemon(**kwargs):
        daemon = subprocess.Popen(["sleep", "1000"], start_new_session=True)  # a group and session of its own
        with open(pids, "a") as log:
            log.write(f"{daemon.pid}\\n")
        # a daemon by a double fork (a render server's way): its parent is gone when the sim is stopped
        subprocess.run([sys.executable, "-c", DOUBLE_FORK, pids], check=True)
        return reset(**kwargs)

    env.reset = reset_starting_a_daemon
    env.step = lambda action: os._exit(4)  # a sim that dies on its own
    return env
"""


@pytest.mark.parametrize("stop", ["close", "kill", "died"])
def test_a_process_the_sim_started_in_a_session_of_its_own_is_stopped_with_it(
    spawn: Spawn, tmp_path: Any, stop: str
) -> None:
    """Before, the process group's signal never reached it, and it outlived the run; and before, when the sim
    died on its own, it outlived the sim: only a living sim was asked for what it started."""
    (tmp_path / "daemon_env.py").write_text(DAEMON_ENV)
    pids = tmp_path / "pids"
    sim = spawn(f"{tmp_path / 'daemon_env.py'}:make", build_args={"pids": str(pids)})
    with sim.connect() as client:
        client.reset({"seed": 0})
        if stop == "died":
            with pytest.raises(SimCrashedError):
                client.step([0])
            assert sim.returncode == 4
    daemons = [int(line) for line in pids.read_text().split()]  # one per reset (the sim's start resets too)
    assert daemons
    assert all(os.getpgid(daemon) != sim.pid for daemon in daemons), "outside the sim's process group"
    sim.kill() if stop == "kill" else sim.close(grace_s=2.0)
    deadline = time.monotonic() + 5
    while any(map(_alive, daemons)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [d for d in daemons if _alive(d)], "started by the sim, they outlived it"


def test_a_sim_dropped_without_close_stops_the_processes_it_started_in_sessions_of_their_own(tmp_path: Any) -> None:
    """Its finalizer killed the sim's group at once: the daemons the sim had started outlived it."""
    import gc

    (tmp_path / "dropped_daemon_env.py").write_text(DAEMON_ENV)
    pids = tmp_path / "pids"
    sim = SimProcess.spawn(f"{tmp_path / 'dropped_daemon_env.py'}:make", build_args={"pids": str(pids)})
    daemons = [int(line) for line in pids.read_text().split()]  # the sim's start resets, and starts them
    assert daemons
    del sim
    gc.collect()
    deadline = time.monotonic() + 5
    while any(map(_alive, daemons)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [d for d in daemons if _alive(d)], "started by the sim, they outlived it"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for init to reap it, has stopped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().split(b") ")[1][:1] != b"Z"
    except OSError:
        return False


def test_a_served_sim_stuck_in_a_gone_clients_request_tells_the_next_client_so(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "hang_step", "at_step": 1})
    client = SimClient(sim.url, sim.token, step_timeout_s=1.0)  # a served sim: no deadline kills it
    client.reset({"seed": 0})
    with pytest.raises(SimTimeoutError):
        client.step([[0.0]])
    client.close()
    with pytest.raises(
        SimRefusedError, match="HTTP 409 the sim is still running a request of a connection that has gone"
    ):
        SimClient(sim.url, sim.token)


def test_a_stopped_child_sigstop_is_caught_by_the_deadline(spawn: Spawn) -> None:
    sim = spawn(FAULTY)
    client = sim.connect(step_timeout_s=1.0)
    client.reset({"seed": 0})
    assert sim.pid is not None
    os.killpg(sim.pid, signal.SIGSTOP)
    with pytest.raises(SimTimeoutError, match="did not answer step within 1 s"):
        client.step([[0.0]])
    client.close()
    wait_group_gone(sim.pid)


def test_a_hang_during_start_up_hits_the_start_up_deadline(spawn: Spawn) -> None:
    started = time.monotonic()
    with pytest.raises(SimStartError, match="did not become ready within 3 s") as caught:
        spawn(FAULTY, build_args={"fault": "hang_build"}, startup_timeout_s=3.0)
    assert time.monotonic() - started < 10
    assert "was killed by SIG" in str(caught.value)


def test_start_up_failures_fail_fast_with_the_childs_stderr(spawn: Spawn) -> None:
    started = time.monotonic()
    with pytest.raises(SimStartError) as caught:
        spawn(f"{REPO / 'envs' / 'faulty.py'}:broken_import")
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "exited with code 1 before it was ready" in message
    assert "No module named 'hud_pipelines_missing_simulator'" in message  # from the child's stderr
    with pytest.raises(SimStartError, match="RuntimeError: FaultyEnv refused to build"):
        spawn(FAULTY, build_args={"fault": "raise_build"})
    with pytest.raises(SimStartError, match="unknown gymnasium registry id 'CartPol-v1'; did you mean CartPole-v1"):
        spawn("CartPol-v1")


def test_a_port_in_use_fails_start_up_with_the_reason(spawn: Spawn) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SimStartError, match=f"cannot listen on 127.0.0.1:{port}: address already in use") as caught:
            spawn(FAULTY, port=port)
    assert "Traceback" not in str(caught.value), "a setting to change is said in a line"


def test_a_server_that_accepts_but_never_answers_is_named_with_how_long_it_was_waited_for() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts the connection; nothing ever answers the handshake
        url = f"ws://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(SimCrashedError, match=r"waited 0\.3 s for the connection and its handshake"):
            SimClient(url, "token", connect_timeout_s=0.3)


def test_two_sims_on_one_host_use_their_own_ports_and_tokens(spawn: Spawn) -> None:
    first, second = spawn(FAULTY), spawn(FAULTY)
    assert first.url != second.url
    assert first.token != second.token
    with pytest.raises(SimRefusedError, match="HTTP 401"):
        SimClient(second.url, first.token)
    with first.connect() as a, second.connect() as b:
        assert a.reset({"seed": 1}).observation["state"][0, 2] == 1.0
        assert b.reset({"seed": 2}).observation["state"][0, 2] == 2.0


# ---------------------------------------------------------------------------------------------
# the parent dies: the child follows


def _set_child_subreaper(on: bool) -> None:
    """Adopt orphaned descendants, so this test can reap (and so prove dead) a sim whose parent died."""
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")


@pytest.mark.skipif(sys.platform != "linux", reason="uses prctl")
def test_the_child_dies_when_its_parent_is_sigkilled() -> None:
    parent_code = (
        "import json, time\n"
        "from hud_pipelines.sim.process import SimProcess\n"
        f"sim = SimProcess.spawn({FAULTY!r})\n"
        "print(json.dumps({'pid': sim.pid}), flush=True)\n"
        "time.sleep(600)\n"
    )
    _set_child_subreaper(True)
    try:
        with subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, cwd=REPO) as parent:
            assert parent.stdout is not None
            sim_pid = json.loads(parent.stdout.readline())["pid"]
            os.kill(parent.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.waitpid(sim_pid, os.WNOHANG) == (0, 0):  # the orphan is ours to reap now
            assert time.monotonic() < deadline, "the sim outlived its parent by 10 s"
            time.sleep(0.05)
        wait_group_gone(sim_pid)
    finally:
        _set_child_subreaper(False)


@pytest.mark.skipif(sys.platform != "linux", reason="uses prctl")
def test_what_the_sim_started_outside_its_group_dies_with_it_when_its_parent_is_sigkilled(tmp_path: Any) -> None:
    """Its parent stops those by their ids when it closes the sim; a parent killed outright never does, so the sim
    does it itself once it sees its parent gone (before, a session of its own and a daemon outlived the run)."""
    (tmp_path / "daemon_env.py").write_text(DAEMON_ENV)
    pids = tmp_path / "pids"
    parent_code = (
        "import json, time\n"
        "from hud_pipelines.sim.process import SimProcess\n"
        f"sim = SimProcess.spawn({str(tmp_path / 'daemon_env.py') + ':make'!r}, build_args={{'pids': {str(pids)!r}}})\n"
        "print(json.dumps({'pid': sim.pid}), flush=True)\n"
        "time.sleep(600)\n"
    )
    daemons: list[int] = []
    _set_child_subreaper(True)
    try:
        with subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, cwd=REPO) as parent:
            assert parent.stdout is not None
            sim_pid = json.loads(parent.stdout.readline())["pid"]
            daemons += [int(line) for line in pids.read_text().split()]  # the sim's start resets once
            assert daemons
            assert all(_alive(daemon) for daemon in daemons)
            os.kill(parent.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.waitpid(sim_pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the sim outlived its parent by 10 s"
            time.sleep(0.05)
        while any(map(_alive, daemons)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [d for d in daemons if _alive(d)], "started by the sim, they outlived it and its parent"
    finally:
        _set_child_subreaper(False)
        for daemon in daemons:  # adopted by this test: reaped here
            with contextlib.suppress(ChildProcessError):
                os.waitpid(daemon, os.WNOHANG)


# ---------------------------------------------------------------------------------------------
# signals


def test_sigterm_waits_for_the_current_step_a_second_signal_interrupts_it(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "hang_step", "at_step": 1})
    client = sim.connect(step_timeout_s=60)
    client.reset({"seed": 0})
    outcome: list[str] = []

    def step() -> None:
        try:
            client.step([[0.0]])
        except SimCrashedError as exc:  # the sim went: its episodes end as crashed, whichever of the two came first
            outcome.append(str(exc).split("\n")[0])

    stepping = threading.Thread(target=step, daemon=True)
    stepping.start()
    time.sleep(0.5)
    assert sim.pid is not None
    os.kill(sim.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert sim.alive()  # graceful: the step in flight is not torn apart
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.diagnose(wait_s=5).startswith(f"sim process {sim.pid} exited with code 0")
    stepping.join(timeout=5)
    assert len(outcome) == 1, "the interrupted step was answered, not left hanging"
    assert outcome[0].endswith("shut down during step: the sim is shutting down") or "(close code 1001)" in outcome[0]
    client.close()


# ---------------------------------------------------------------------------------------------
# bad input: clear errors, and the server keeps serving


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    served = SimProcess.spawn(FAULTY, options=["--max-frame-bytes", str(MAX_FRAME_BYTES)])
    yield served
    served.close()
    assert served.pgid is not None
    wait_group_gone(served.pgid)


@contextlib.contextmanager
def raw(sim: SimProcess, *, hello: bool = True) -> Generator[ClientConnection]:
    """A plain WebSocket connection to the sim (another client than ours), after the hello exchange."""
    headers = {"Authorization": f"Bearer {sim.token}"}
    with connect(sim.url, additional_headers=headers, compression=None, max_size=None) as ws:
        if hello:
            ws.send(packb({"type": "hello", "protocol": PROTOCOL_VERSION, "framing": "batched"}))
            assert unpackb(ws.recv(timeout=10))["type"] == "hello"
        yield ws


def call(ws: ClientConnection, frame: bytes | str) -> dict[str, Any]:
    ws.send(frame)
    reply = unpackb(ws.recv(timeout=10))
    assert isinstance(reply, dict)
    return cast(dict[str, Any], reply)


def assert_serving(sim: SimProcess) -> None:
    """A fresh connection can reset and step: the server is neither crashed nor wedged."""
    with sim.connect(step_timeout_s=10) as client:
        assert client.reset({"seed": 5}).status == ["running"]
        assert client.step([[0.25]]).observation["state"][0].tolist() == [1.0, 0.25, 5.0]


def stderr_says(sim: SimProcess, text: str, timeout_s: float = 5.0) -> bool:
    """Whether the sim's stderr shows ``text`` within ``timeout_s`` (its log lines reach us through a pipe)."""
    deadline = time.monotonic() + timeout_s
    while text not in sim.diagnose(wait_s=0):
        if time.monotonic() > deadline:
            return False
    return True


def pack(message: object) -> bytes:
    """Plain msgpack, bypassing the codec's checks."""
    return cast(bytes, msgpack.packb(message, use_bin_type=True))


def array_field(data: bytes, dtype: str, shape: list[int]) -> dict[str, Any]:
    return {NDARRAY_KEY: True, "data": data, "dtype": dtype, "shape": shape}


def test_an_env_exception_errors_its_slot_in_the_frame_with_the_traceback(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "raise_step", "at_step": 2})
    with sim.connect() as client:
        client.reset({"seed": 3})
        client.step([[0.0]])
        reply = client.step([[0.0]])
        assert reply.status == ["errored"]
        [error] = reply.errors
        assert (error.slot, error.cause) == (0, "env")
        assert error.message == "ZeroDivisionError: FaultyEnv step 2 failed on purpose (seed 3) (seed 3, step 2)"
        assert 'faulty.py", line' in (error.traceback or "")
        assert client.result().slots[0]["status"] == "errored"
        assert client.reset({"seed": 4}).status == ["running"]  # the same connection goes on


def test_wrong_action_shape_dtype_or_nan_names_the_expected_spec(sim: SimProcess) -> None:
    with sim.connect() as client:
        client.reset({"seed": 0})
        expected = r"expected float32\[N=1, A=1\] \(names \['action_0'\]\)"
        with pytest.raises(RemoteError, match=rf"action has shape \[1, 3\], {expected}") as caught:
            client.step([[0.0, 1.0, 2.0]])
        assert caught.value.phase == "step"
        with pytest.raises(RemoteError, match=rf"action has dtype bool, {expected}"):
            client.step(np.array([[True]]))
        assert client.step([[0.5]]).observation["state"][0, 0] == 1.0  # nothing was applied before
        for bad, step in ((np.nan, 2), (np.inf, 1)):  # a bad row errors its slot, the only one
            reply = client.step([[bad]])
            assert reply.status == ["errored"]
            assert reply.errors[0].message.startswith(f"action [{bad}] is not finite (seed 0, step {step}); expected")
            client.reset({"seed": 0})
    assert_serving(sim)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (packb({"type": "step", "seq": 1, "action": np.zeros((1, 1))})[:-3], "malformed msgpack frame"),
        (b"\xc1\xc1\xc1", "malformed msgpack frame"),
        (bytes(range(200)), "malformed msgpack frame"),
        (pack({"type": "step", "seq": 1, "action": array_field(b"\0" * 8, "|O", [1])}), "dtype '|O'"),
        (pack({"type": "step", "seq": 1, "action": array_field(b"\0" * 8, "<c8", [1])}), "kind 'c'"),
        (pack({"type": "step", "seq": 1, "action": array_field(b"\0" * 8, "pickle", [1])}), "unknown dtype"),
        (
            pack({"type": "step", "seq": 1, "action": array_field(b"\0" * 12, "<f4", [1, 2])}),
            "needs 8 bytes, the frame carries 12",
        ),
        (
            pack({"type": "step", "seq": 1, "action": array_field(b"\0" * 4, "<f4", [10**6, 10**6])}),
            "needs 4000000000000 bytes",
        ),
        ('{"type": "step"}', "expected a binary msgpack frame, got a text frame"),
        (packb({"type": "teleport", "seq": 1}), "unknown message type 'teleport'"),
        (packb({"type": "observation", "seq": 1}), "a client may not send 'observation'"),
        (packb({"type": "step", "seq": 1}), "'step' frame is missing 'action'"),
        (packb([1, 2, 3]), "msgpack map with a 'type' key"),
    ],
    ids=[
        "truncated",
        "garbage-bytes",
        "random-bytes",
        "object-dtype",
        "complex-dtype",
        "unknown-dtype",
        "bytes-vs-shape",
        "huge-shape",
        "text-frame",
        "unknown-type",
        "server-type",
        "missing-field",
        "not-a-map",
    ],
)
def test_malformed_frames_get_a_decode_error_and_the_connection_goes_on(
    sim: SimProcess, frame: bytes | str, message: str
) -> None:
    with raw(sim) as ws:
        assert call(ws, packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))["type"] == "observation"
        reply = call(ws, frame)
        assert (reply["type"], reply["phase"]) == ("error", "decode")
        assert message in reply["message"]
        step = call(ws, packb({"type": "step", "seq": 2, "action": np.array([[0.5]], np.float32)}))
        assert step["type"] == "observation"
        assert step["seq"] == 2


def test_a_wrong_protocol_version_is_refused_in_the_handshake(sim: SimProcess) -> None:
    with raw(sim, hello=False) as ws:
        reply = call(ws, packb({"type": "hello", "protocol": PROTOCOL_VERSION + 41}))
        assert (reply["type"], reply["phase"]) == ("error", "handshake")
        assert (
            f"protocol version {PROTOCOL_VERSION + 41} is not supported; this sim speaks {PROTOCOL_VERSION}"
            in reply["message"]
        )
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=10)
        assert caught.value.rcvd is not None
        assert caught.value.rcvd.code == 1002
    with raw(sim, hello=False) as ws:
        reply = call(ws, packb({"type": "step", "seq": 1, "action": np.zeros((1, 1))}))
        assert reply["phase"] == "handshake"
        assert "the first frame must be 'hello'" in reply["message"]
    assert_serving(sim)


def test_a_client_that_says_goodbye_mid_episode_is_not_reported_as_one_that_vanished(sim: SimProcess) -> None:
    """An agent stops at its own ``max_steps`` with slots running and closes: no fault to warn about."""
    with sim.connect() as client:
        client.reset({"seed": 0})
        client.step([[0.0]])
    said = "client said goodbye with slots [0] running: it ended their episodes"
    assert stderr_says(sim, said), sim.diagnose(wait_s=0)
    assert_serving(sim)


def test_a_frame_over_the_size_limit_closes_the_connection_cleanly(sim: SimProcess) -> None:
    with raw(sim) as ws:
        call(ws, packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))
        ws.send(packb({"type": "step", "seq": 2, "action": np.zeros((1, MAX_FRAME_BYTES // 4 + 10), np.float32)}))
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=10)
        assert caught.value.rcvd is not None
        assert caught.value.rcvd.code == 1009
    with sim.connect() as client:
        assert client.result().slots[0]["status"] == "idle"  # a new connection sees none of the last one's episodes
    assert stderr_says(sim, "client left with slots [0] running")  # that episode ended with its connection
    assert_serving(sim)


def _sans_io_client(sim: SimProcess, sock: socket.socket) -> tuple[ClientProtocol, Callable[[], None]]:
    """A client that has said hello on ``sock``, and what sends its pending bytes: it closes only when told."""
    protocol = ClientProtocol(parse_uri(sim.url), max_size=None)
    request = protocol.connect()
    request.headers["Authorization"] = f"Bearer {sim.token}"
    protocol.send_request(request)

    def flush() -> None:
        for chunk in protocol.data_to_send():
            sock.sendall(chunk)

    def exchange() -> None:
        flush()
        protocol.receive_data(sock.recv(1 << 20))
        protocol.events_received()

    exchange()  # the handshake's response
    protocol.send_binary(packb({"type": "hello", "protocol": PROTOCOL_VERSION, "framing": "batched"}))
    exchange()
    return protocol, flush


def _sim_socket(sim: SimProcess) -> socket.socket:
    where = urlsplit(sim.url)
    return socket.create_connection((where.hostname, where.port), timeout=10)


def test_a_client_that_reconnects_the_moment_its_oversized_frame_is_refused_is_admitted(sim: SimProcess) -> None:
    """The server closes with 1009 by itself; the connection is leaving from then on, not once the
    client's close echo arrives, so a new connection waits for the old one instead of a 409."""
    with _sim_socket(sim) as sock:
        protocol, flush = _sans_io_client(sim, sock)
        protocol.send_binary(packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))
        flush()
        protocol.receive_data(sock.recv(1 << 20))
        protocol.send_binary(packb({"type": "step", "seq": 2, "action": np.zeros((1, MAX_FRAME_BYTES // 4 + 10))}))
        flush()
        while protocol.close_rcvd is None:  # the server's 1009; this client never sends its close back
            protocol.receive_data(sock.recv(1 << 20))
        assert isinstance(protocol.close_rcvd, Close)
        assert protocol.close_rcvd.code == 1009
        with sim.connect() as client:  # at once, while the old connection still waits for the echo
            assert client.reset({"seed": 3}).status == ["running"]


def test_a_client_that_closes_and_reconnects_at_once_is_admitted_every_time(sim: SimProcess) -> None:
    """Its close frame and its next connection reach the server together: the new connection waits for the
    reader of the old one to read that close (``CLOSE_NOTICE_S``) rather than getting a 409 for itself."""
    for attempt in range(10):
        with _sim_socket(sim) as sock:
            protocol, flush = _sans_io_client(sim, sock)
            protocol.send_close()
            flush()
            with sim.connect() as client:  # the old socket still open, its close not yet answered
                assert client.reset({"seed": attempt}).status == ["running"]


def test_a_replayed_or_out_of_order_request_is_refused_and_never_applied(sim: SimProcess) -> None:
    with raw(sim) as ws:
        call(ws, packb({"type": "reset", "seq": 5, "task": [{"seed": 0}]}))
        step = packb({"type": "step", "seq": 6, "action": np.array([[0.5]], np.float32)})
        assert call(ws, step)["observation"]["state"][0, 0] == 1.0
        replay = call(ws, step)
        assert (replay["type"], replay["phase"], replay["seq"]) == ("error", "sequence", 6)
        assert "not above the last one (6)" in replay["message"]
        older = call(ws, packb({"type": "step", "seq": 3, "action": np.array([[0.5]], np.float32)}))
        assert older["phase"] == "sequence"
        result = call(ws, packb({"type": "result", "seq": 7}))
        assert result["slots"][0]["steps"] == 1  # applied once


def test_a_client_that_vanishes_mid_episode_leaks_nothing_into_the_next(sim: SimProcess) -> None:
    with raw(sim) as ws:
        call(ws, packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))
        call(ws, packb({"type": "step", "seq": 2, "action": np.array([[0.1]], np.float32)}))
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame: the peer just vanishes
    deadline = time.monotonic() + 10
    while True:  # the server notices and frees the sim for the next connection
        try:
            client = sim.connect()
            break
        except SimRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert stderr_says(sim, "client left with slots [0] running")  # the abort was recorded
    with client:
        slot = client.result().slots[0]  # the next connection starts with records of its own
        assert (slot["status"], slot["error"], slot["steps"], slot["episode"]) == ("idle", None, 0, -1)
        with pytest.raises(RemoteError, match="no slot is running \\(slot states: idle\\); reset first"):
            client.step([[0.0]])
        assert client.reset({"seed": 1}).status == ["running"]
        assert client.result().slots[0]["steps"] == 0


def test_a_connection_without_the_token_never_reaches_the_sim(sim: SimProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        with pytest.raises(Exception, match="HTTP 401"), connect(sim.url, additional_headers=headers):
            pass
    with pytest.raises(
        SimRefusedError, match="refused the connection: HTTP 401 missing or wrong capability token"
    ) as caught:
        SimClient(sim.url, "not-the-token")
    assert caught.value.status == 401
    assert_serving(sim)


def test_a_second_connection_is_refused_while_the_first_is_open(sim: SimProcess) -> None:
    with raw(sim, hello=False) as ws:  # connected, not even said hello yet: the sim is taken
        with pytest.raises(SimRefusedError, match="HTTP 409"):
            sim.connect()
        ws.close()
    assert_serving(sim)


# ---------------------------------------------------------------------------------------------
# a misbehaving server: the client never takes a late reply for the current one


@contextlib.contextmanager
def fake_server(reply: Callable[[dict[str, Any]], Any]) -> Generator[str]:
    """A WebSocket server that answers hello properly and then every request with ``reply(request)``."""

    def handler(ws: ServerConnection) -> None:
        ws.recv()
        ws.send(
            packb(
                {
                    "type": "hello",
                    "protocol": PROTOCOL_VERSION,
                    "framing": "batched",
                    "num_envs": 1,
                    "contract": {
                        "control_rate": 10.0,
                        "features": {"action": {"role": "action", "dtype": "float32", "shape": [1]}},
                    },
                    "server": "fake",
                    "hold": "last",
                    "max_frame_bytes": 1 << 20,
                }
            )
        )
        with contextlib.suppress(ConnectionClosed):
            for frame in ws:
                answer = reply(unpackb(frame))
                if answer is not None:
                    ws.send(answer)

    server: Server = serve(handler, "127.0.0.1", 0, compression=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def observation_frame(seq: int) -> bytes:
    return packb(
        {
            "type": "observation",
            "seq": seq,
            "observation": {},
            "reward": np.zeros(1),
            "terminated": np.zeros(1, bool),
            "truncated": np.zeros(1, bool),
            "success": np.zeros(1, bool),
            "success_reported": np.zeros(1, bool),
            "success_now": np.zeros(1, bool),
            "status": ["running"],
        }
    )


def test_a_late_or_out_of_order_reply_breaks_the_client_instead_of_being_taken() -> None:
    with fake_server(lambda request: observation_frame(request["seq"] + 1)) as url:
        client = SimClient(url, "any")
        with pytest.raises(WireError, match="reply numbered 2 to request 1: late or out-of-order reply"):
            client.reset()
        with pytest.raises(SimError, match="unusable: reply numbered 2 to request 1"):
            client.step([[0.0]])
        client.close()


def test_a_garbled_reply_or_a_silent_server_are_clear_client_errors() -> None:
    with fake_server(lambda request: b"\xc1 not msgpack") as url:
        client = SimClient(url, "any")
        with pytest.raises(WireError, match="malformed msgpack frame"):
            client.reset()
        assert not client.usable
        client.close()
    with fake_server(lambda request: None) as url:
        timeouts: list[str] = []
        client = SimClient(url, "any", step_timeout_s=0.5, on_timeout=lambda: timeouts.append("killed"))
        with pytest.raises(SimTimeoutError, match=r"did not answer reset within 0\.5 s"):
            client.reset()
        assert timeouts == ["killed"]
        client.close()


def test_connecting_to_nothing_is_a_clear_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(SimCrashedError, match=f"cannot connect to the sim at ws://127.0.0.1:{port}"):
        SimClient(f"ws://127.0.0.1:{port}", "token", connect_timeout_s=2)


def test_non_finite_observations_reach_the_client_flagged(spawn: Spawn) -> None:
    sim = spawn(FAULTY, num_envs=2, build_args={"fault": "nan_step", "at_step": 1, "fault_seed": 8})
    with sim.connect() as client:
        client.reset([{"seed": 7}, {"seed": 8}])
        reply = client.step(np.zeros((2, 1)))
        assert reply.nonfinite == [1]
        assert np.isnan(reply.observation["state"][1]).all()
        assert np.isfinite(reply.observation["state"][0]).all()
        assert [s["nonfinite_steps"] for s in client.result().slots] == [0, 1]


def test_teardown_escalates_to_sigkill_when_sigterm_is_not_enough(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "hang_step", "at_step": 1})
    sim_pid = sim.pid
    assert sim_pid is not None
    with raw(sim) as ws:
        call(ws, packb({"type": "reset", "seq": 1, "task": [{"seed": 0}]}))
        ws.send(packb({"type": "step", "seq": 2, "action": np.zeros((1, 1), np.float32)}))  # hangs in env.step
        time.sleep(0.3)
        started = time.monotonic()
        sim.close(grace_s=0.5)  # SIGTERM only queues a stop behind the hung step: SIGKILL must follow
        assert time.monotonic() - started < 5
    assert "killed by SIGKILL" in sim.diagnose()
    wait_group_gone(sim_pid)


def test_one_slot_raising_is_listed_in_the_frame_and_the_others_go_on(spawn: Spawn) -> None:
    sim = spawn(FAULTY, num_envs=3, build_args={"fault": "raise_step", "at_step": 2, "fault_seed": 21})
    with sim.connect() as client:
        client.reset([{"seed": 20}, {"seed": 21}, {"seed": 22}])
        client.step(np.zeros((3, 1)))
        reply = client.step(np.zeros((3, 1)))
        assert reply.status == ["running", "errored", "running"]
        assert [(e.slot, "ZeroDivisionError" in e.message) for e in reply.errors] == [(1, True)]
        assert reply.errors[0].traceback is not None
        assert "Traceback" in reply.errors[0].traceback
        assert client.step(np.zeros((3, 1))).status == ["running", "errored", "running"]
        assert [s["steps"] for s in client.result().slots] == [3, 1, 3]
