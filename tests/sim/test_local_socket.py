"""The local socket: a spawned sim's clients reach it through an abstract Unix socket, its URL still serves, the
token guards both, and a local socket that cannot be opened (or is not wanted) leaves the URL serving alone."""

from __future__ import annotations

import contextlib
import errno
import logging
import secrets
import socket
import sys
from collections.abc import Callable

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from hud_pipelines.sim import local_socket
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.main_thread import MainThreadExecutor
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.sim.server import SimServer
from tests.sim.test_sim_executor import driven_from_a_thread

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the abstract socket namespace is Linux's")
Spawn = Callable[..., SimProcess]


def family_of(client: SimClient) -> int:
    return client._link._sock.family  # type: ignore[attr-defined]


def test_a_spawned_sims_clients_go_through_its_local_socket_which_asks_the_token_and_goes_with_it(
    spawn: Spawn,
) -> None:
    sim = spawn("CartPole-v1")
    assert sim.local_socket is not None
    assert sim.local_socket.startswith("@hud-pipelines-sim-")
    address = local_socket.address(sim.local_socket)
    with sim.connect() as client:
        assert family_of(client) == socket.AF_UNIX
        assert client.reset({"seed": 3}).status == ["running"]
    with SimProcess.attach(sim.url, sim.token).connect() as client:  # its URL serves as before
        assert family_of(client) == socket.AF_INET
        assert client.reset({"seed": 3}).status == ["running"]
    with socket.socket(socket.AF_UNIX) as raw:  # no token, no sim: the same admission as its URL's
        raw.connect(address)
        with pytest.raises(InvalidStatus) as refused:
            connect(sim.url, sock=raw, compression=None, open_timeout=10)
    assert refused.value.response.status_code == 401
    sim.close()
    with socket.socket(socket.AF_UNIX) as raw, pytest.raises(ConnectionRefusedError):
        raw.connect(address)  # the name went with the process: no file left behind to clean up


def test_a_spawned_sim_told_to_open_no_local_socket_is_served_by_its_url(spawn: Spawn) -> None:
    sim = spawn("CartPole-v1", env={local_socket.ENV: "0"})
    assert sim.local_socket is None
    with sim.connect() as client:
        assert family_of(client) == socket.AF_INET
        assert client.reset({"seed": 3}).status == ["running"]


def test_a_local_socket_that_cannot_be_opened_leaves_the_url_serving_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"@hud-pipelines-test-{secrets.token_hex(6)}"
    executor = MainThreadExecutor()
    with socket.socket(socket.AF_UNIX) as taken, GymBridge("CartPole-v1") as bridge:
        taken.bind(local_socket.address(name))
        server = SimServer(bridge, executor, token="secret", local_socket=name)
        with caplog.at_level(logging.WARNING):
            port = server.start()
        assert server.local_socket is None  # what the ready line names: nothing, so clients use the URL
        assert f"serving by URL only: cannot listen on {name} (Address already in use)" in caplog.text
        statuses: list[list[str]] = []
        driven_from_a_thread(executor, port, lambda client: statuses.append(client.reset({"seed": 0}).status))
        server.stop()
        assert statuses == [["running"]]


def test_a_server_that_fails_to_start_leaves_its_port_and_name_free(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"@hud-pipelines-test-{secrets.token_hex(6)}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def no_descriptors() -> tuple[socket.socket, socket.socket]:
        raise OSError(errno.EMFILE, "Too many open files")

    with GymBridge("CartPole-v1") as bridge:
        server = SimServer(bridge, MainThreadExecutor(), token="secret", port=port, local_socket=name)
        with monkeypatch.context() as patched:
            patched.setattr(socket, "socketpair", no_descriptors)
            with pytest.raises(OSError, match="Too many open files"):
                server.start()
    with socket.socket(socket.AF_UNIX) as again, contextlib.closing(socket.socket()) as tcp:
        again.bind(local_socket.address(name))
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", port))
        tcp.listen(1)


def test_a_local_socket_is_an_abstract_name_never_a_path() -> None:
    assert local_socket.address("@sim-1") == "\0sim-1"
    for name in ("/tmp/sim.sock", "@", ""):
        with pytest.raises(ValueError, match="named @name"):
            local_socket.address(name)
