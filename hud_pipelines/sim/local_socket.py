"""The local socket: a spawned sim's shortcut for the clients of its own host.

Beside its URL (loopback TCP), a sim started with ``--local-socket`` (every sim :class:`SimProcess` spawns, on
Linux) listens on a Unix socket of Linux's abstract namespace and names it in its ready line as ``@name``. Its
clients connect there and speak the same protocol with the same token; each message skips TCP's loopback path
(the device, its soft interrupt, the acknowledgements), a third of its kernel cost (``bench/wire.md``). An
abstract name has no file to clean up: the kernel drops it with the last descriptor. It is only a shortcut:
where it cannot be opened, the sim serves its URL alone and says so.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket

log = logging.getLogger(__name__)
ENV = "HUD_PIPELINES_LOCAL_SOCKET"
"""``1``: a child asked for it by its parent (an environment variable, which a child of an older version ignores,
where an unknown flag would stop it)."""


def new_name() -> str:
    """A name of this process's own: its pid and a random part, so no two sims (nor a restart) collide."""
    return f"@hud-pipelines-sim-{os.getpid()}-{secrets.token_hex(8)}"


def address(name: str) -> str:
    """The socket address of ``@name``: its abstract name, which starts with a NUL byte."""
    if not name.startswith("@") or len(name) < 2:
        raise ValueError(f"a local socket is named @name (Linux's abstract namespace), not {name!r}")
    return "\0" + name[1:]


def listen(name: str) -> socket.socket | None:
    """A listening socket at ``name``; ``None`` (logged) where it cannot be opened: a sandbox that forbids it, a
    name already taken."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(name))
        listener.listen(16)
    except OSError as exc:
        listener.close()
        log.warning("serving by URL only: cannot listen on %s (%s)", name, exc.strerror or exc)
        return None
    return listener
