"""The client's WebSocket link: what it tells of a connection that sat idle between instances."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
from websockets.sync.server import ServerConnection, serve

from hud_pipelines.sim.link import WebSocketLink


@contextlib.contextmanager
def _linked(after_reply: Callable[[ServerConnection], None]) -> Generator[WebSocketLink]:
    """A link to a server that answers one request, then does ``after_reply`` while the link sits idle."""
    done = threading.Event()

    def handler(connection: ServerConnection) -> None:
        connection.send(connection.recv())
        after_reply(connection)
        done.wait(10)

    server = serve(handler, "127.0.0.1", 0, ping_interval=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    link = WebSocketLink(f"ws://127.0.0.1:{server.socket.getsockname()[1]}", headers={}, max_size=None, timeout_s=5)
    try:
        link.send(b"request", 5)
        assert link.recv(5) == b"request"
        time.sleep(0.3)  # what the server does meanwhile reaches the link
        yield link
    finally:
        done.set()
        link.abort()
        server.shutdown()
        thread.join(timeout=5)


def _closes(connection: ServerConnection) -> None:
    time.sleep(0.1)  # after the reply was read: the link learns of the close only by reading again
    connection.close()


def test_an_idle_link_is_quiet_until_its_peer_closes_it_and_a_ping_is_no_message() -> None:
    """A keepalive ping (a proxy's, a server's) made a healthy pooled connection look closed: thrown away, and a
    spawned sim with it."""
    with _linked(lambda connection: None) as link:
        assert link.quiet()
    pongs: list[threading.Event] = []
    with _linked(lambda connection: pongs.append(connection.ping(b"keepalive"))) as link:
        assert link.quiet(), "a ping is answered, not a message waiting"
        assert pongs[0].wait(5), "and its pong sent"
        assert link.quiet()
    with _linked(_closes) as link:
        assert not link.quiet()


def test_a_link_on_a_descriptor_past_1024_still_tells_a_closed_connection() -> None:
    """``select()`` refuses descriptors of 1024 and more: its error was taken for a quiet connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} files, too few to reach descriptor 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY else hard, hard))
    held: list[Any] = []
    try:
        while (fd := os.open(os.devnull, os.O_RDONLY)) < 1030:
            held.append(fd)
        held.append(fd)
        with _linked(_closes) as link:
            assert not link.quiet()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
