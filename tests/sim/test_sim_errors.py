"""Sim faults are typed: a crash, a hung sim and a start-up failure carry what caused them.

The eval layer reads ``returncode`` / ``signal_name``, ``deadline_s`` and ``child_error`` instead of
matching message strings; the messages stay readable and the constructors stay compatible.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hud_pipelines.errors import SimCrashedError, SimError, SimStartError, SimTimeoutError
from hud_pipelines.sim.process import SimProcess
from tests.conftest import FAULTY, REPO

Spawn = Callable[..., SimProcess]


def test_the_errors_keep_their_plain_constructors() -> None:
    for error in (SimCrashedError("gone"), SimTimeoutError("slow"), SimStartError("no")):
        assert isinstance(error, SimError)
        assert str(error) in ("gone", "slow", "no")
    assert SimCrashedError("gone").returncode is None
    assert SimCrashedError("gone").signal_name is None
    assert SimTimeoutError("slow").deadline_s is None
    assert SimStartError("no").child_error is None


@pytest.mark.parametrize(
    ("returncode", "name"),
    [(-9, "SIGKILL"), (-15, "SIGTERM"), (-11, "SIGSEGV"), (1, None), (0, None), (-200, "signal 200")],
)
def test_a_crash_names_the_signal_that_ended_the_child(returncode: int, name: str | None) -> None:
    assert SimCrashedError("gone", returncode=returncode).signal_name == name


def test_a_child_killed_mid_step_is_a_crash_with_its_returncode(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "crash_step", "at_step": 1})
    with sim.connect() as client:
        client.reset({"seed": 0})
        with pytest.raises(SimCrashedError) as caught:
            client.step([[0.0]])
    assert (caught.value.returncode, caught.value.signal_name) == (-9, "SIGKILL")
    assert "went away during step" in str(caught.value)


def test_a_hung_child_is_a_timeout_with_its_deadline(spawn: Spawn) -> None:
    sim = spawn(FAULTY, build_args={"fault": "hang_step", "at_step": 1})
    with sim.connect(step_timeout_s=0.5) as client:
        client.reset({"seed": 0})
        with pytest.raises(SimTimeoutError) as caught:
            client.step([[0.0]])
    assert caught.value.deadline_s == 0.5
    assert "did not answer step within 0.5 s" in str(caught.value)


def _line_of(code: str) -> int:
    """The line of ``envs/faulty.py`` that holds ``code`` (numbered from 1)."""
    lines = (REPO / "envs" / "faulty.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if code in line)


@pytest.mark.parametrize(
    ("factory", "build_args", "child_error", "raised_at"),
    [
        (
            FAULTY,
            {"speed": 3},
            "TaskArgumentError: task argument 'speed' is accepted neither by the factory faulty(",
            None,  # an error of ours, whose message says it all: no frame of the harness is named
        ),
        (
            FAULTY,
            {"fault": "raise_build"},
            "RuntimeError: FaultyEnv refused to build (fault=raise_build)",
            f"{REPO / 'envs' / 'faulty.py'}:{_line_of('raise RuntimeError("FaultyEnv refused')} in __init__",
        ),
        (
            f"{REPO / 'envs' / 'faulty.py'}:broken_import",
            {},
            "ModuleNotFoundError: No module named 'hud_pipelines_missing_simulator'",
            f"{REPO / 'envs' / 'faulty.py'}:{_line_of('import hud_pipelines_missing_simulator')} in broken_import",
        ),
    ],
    ids=["bad-argument", "env-raises", "missing-module"],
)
def test_a_start_up_failure_leads_with_the_childs_own_error_line_and_where_the_users_code_raised_it(
    spawn: Spawn, factory: str, build_args: dict[str, object], child_error: str, raised_at: str | None
) -> None:
    with pytest.raises(SimStartError) as caught:
        spawn(factory, build_args=build_args)
    error = caught.value
    assert error.child_error is not None
    assert error.child_error.startswith(child_error)
    assert error.child_error.endswith(f" (at {raised_at})") if raised_at else " (at " not in error.child_error
    message = str(error)
    assert message.startswith(error.child_error)
    assert message.index(error.child_error) < message.index("stderr tail")
    assert "before it was ready" in message.splitlines()[0]


def test_a_megabyte_line_a_dying_sim_prints_is_cut_in_its_error(spawn: Spawn, tmp_path: Path) -> None:
    """Before, one long stderr line went whole into the error of every row: grades.json grew to megabytes."""
    from hud_pipelines.sim.child_diagnosis import STDERR_LINE_CHARS

    factory = tmp_path / "loud.py"
    factory.write_text(
        "import sys\n\n"
        "def make():\n"
        "    print('x' * 1_000_000, file=sys.stderr)\n"
        "    raise RuntimeError('loud and dead')\n"
    )
    with pytest.raises(SimStartError) as caught:
        spawn(f"{factory}:make")
    message = str(caught.value)
    assert "loud and dead" in message
    assert f"[... {1_000_000 - STDERR_LINE_CHARS} more characters]" in message
    assert len(message) < 10 * STDERR_LINE_CHARS


def test_a_sims_advice_about_its_declared_spaces_is_a_warning_of_the_parent_once_for_all_its_sims(
    spawn: Spawn, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child derives the contract and warns on its stderr, which the parent otherwise logs at INFO only."""
    from hud_pipelines.sim import child_diagnosis

    monkeypatch.setattr(child_diagnosis, "_advice_given", set())
    factory = tmp_path / "liar.py"
    factory.write_text(
        "import gymnasium as gym\nimport numpy as np\n\n"
        "class Liar(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (4,))\n"
        "    action_space = gym.spaces.Box(-1, 1, (1,))\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(5), {}\n\n"
        "    def step(self, action):\n"
        "        return np.zeros(5), 0.0, True, False, {}\n"
    )
    with caplog.at_level(logging.WARNING, logger="hud_pipelines.sim.child"):
        for _ in range(2):
            sim = spawn(f"{factory}:Liar")
            sim.close(grace_s=2.0)
            for pump in [t for t in threading.enumerate() if t.name == f"hud-sim-{sim.pid}-stderr"]:
                pump.join(timeout=10)  # its stderr read to the end
        advice = [r.getMessage() for r in caplog.records if r.name == "hud_pipelines.sim.child"]
    assert advice == [
        "env Liar: its observation_space declares 'state' with shape (4,), but its observation has shape (5,): "
        "the contract follows the observation; correct the space if the observation is right"
    ]


def test_a_reply_over_the_clients_frame_limit_is_said_as_such_and_never_as_a_crash(spawn: Spawn) -> None:
    """The client's WebSocket layer refuses the frame (1009) and the sim lives on: before, the client called it a
    sim that went away "without a close frame", and the eval an errored crash."""
    from hud_pipelines.errors import Fault, fault_of
    from hud_pipelines.sim.client import SimClient

    sim = spawn("CartPole-v1", num_envs=256, options=["--max-frame-bytes", "8000"])
    with pytest.raises(SimError, match="during handshake: a message exceeded the frame limit") as handshake:
        SimClient(sim.url, sim.token, max_frame_bytes=64)
    assert "exceeds limit of 64 bytes" in str(handshake.value)
    client = SimClient(sim.url, sim.token, max_frame_bytes=8000)  # the hello fits, a reset of 256 slots does not
    with pytest.raises(
        SimError, match=r"during reset: .*\(frame with \d+ bytes exceeds limit of 8000 bytes\)"
    ) as reset:
        client.reset({"seed": 0})
    assert not isinstance(reset.value, SimCrashedError)
    assert fault_of(reset.value) is Fault.SIM_LINK
    assert all(way in str(reset.value) for way in ("sim.num_envs", "sim.shards", "--max-frame-bytes"))
    assert sim.alive()


def test_a_client_takes_the_frame_limit_the_server_announces(spawn: Spawn) -> None:
    """``serve --max-frame-bytes`` raises the bound for both sides: a client applies the server's bound to what it
    receives, whatever its own default was before the hello."""
    from hud_pipelines.sim.client import SimClient

    sim = spawn("CartPole-v1", num_envs=256)  # the default bound: 64 MiB
    client = SimClient(sim.url, sim.token, max_frame_bytes=8000)  # the hello fits this side's own bound
    reply = client.reset({"seed": 0})  # about 13 kB
    assert reply.observation["state"].shape == (256, 4)
    client.close()


class _TamperingProxy:
    """A TCP relay between a client and a sim that, once armed, sets a reserved bit on the next chunk one way: a
    WebSocket frame with a reserved bit and no extension breaks the protocol (RFC 6455, section 5.2)."""

    def __init__(self, target_port: int, *, toward_sim: bool) -> None:
        self.armed = threading.Event()
        self._toward_sim = toward_sim
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._target_port = target_port
        self._sockets: list[socket.socket] = [self._listener]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> _TamperingProxy:
        return self

    def __exit__(self, *_: object) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed before a client came
            client, _ = self._listener.accept()
            sim = socket.create_connection(("127.0.0.1", self._target_port))
            self._sockets += [client, sim]
            self._threads.append(threading.Thread(target=self._relay, args=(client, sim, self._toward_sim)))
            self._threads[-1].start()
            self._relay(sim, client, not self._toward_sim)

    def _relay(self, source: socket.socket, sink: socket.socket, tamper: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 16):
                if tamper and self.armed.is_set():
                    chunk, tamper = bytes([chunk[0] | 0x20]) + chunk[1:], False
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize(("toward_sim", "refused"), [(False, "this client refused"), (True, "the sim refused")])
def test_bytes_that_break_the_websocket_protocol_are_a_broken_link_never_a_crash(
    spawn: Spawn, toward_sim: bool, refused: str
) -> None:
    """A frame one side's WebSocket layer refuses (1002) closes the connection while the sim lives on: before, the
    client said the sim "went away" and the eval recorded a crash."""
    from urllib.parse import urlsplit

    from hud_pipelines.errors import Fault, fault_of
    from hud_pipelines.sim.client import SimClient

    sim = spawn("CartPole-v1")
    with _TamperingProxy(urlsplit(sim.url).port or 0, toward_sim=toward_sim) as proxy:
        client = SimClient(f"ws://127.0.0.1:{proxy.port}", sim.token)
        client.reset({"seed": 0})
        proxy.armed.set()
        with pytest.raises(SimError, match=rf"closed during step: {refused} .*\(1002 ") as caught:
            client.step([[0]])
        client.close()
    assert not isinstance(caught.value, SimCrashedError)
    assert fault_of(caught.value) is Fault.SIM_LINK
    assert sim.alive()


def test_an_env_that_calls_sys_exit_in_a_step_errors_its_slot_and_the_sim_serves_on(spawn: Spawn) -> None:
    """``sys.exit()`` in an env's step (a pygame env's window closed) ended the server with no word of why, and the
    client read it as a sim shutting down on purpose."""
    sim = spawn(FAULTY, num_envs=2, build_args={"fault": "exit_step", "at_step": 1, "fault_seed": 0})
    with sim.connect() as client:
        client.reset([{"seed": 0}, {"seed": 1}])
        reply = client.step([[0.0], [0.0]])
        [error] = reply.errors
        assert (error.slot, error.message) == (0, "SystemExit: 4 (seed 0, step 1)"), error
        assert client.step([[0.0], [0.0]]).observation["state"][1, 0] == 2, "the other slot steps on"
    assert sim.alive()
