"""``hud-pipelines serve`` / ``python -m hud_pipelines.sim``: the one way a sim is served.

The pipeline spawns this entry point as a child process; on another host or in a container you run
it yourself and the pipeline attaches by URL and token. Either way the process:

1. moves ``stdout`` aside (anything the env prints goes to ``stderr``), so that
2. exactly one JSON line reaches ``stdout`` once the sim is built and listening::

       {"url": "ws://127.0.0.1:40123", "token": "...", "protocol": 3, "num_envs": 4, "pid": 1234}

3. then runs the sim on the main thread until SIGTERM/SIGINT (or, with ``--parent-watch``, until
   its stdin closes because the parent died; it then kills its own process group).

An env that has an ``idle_hook()`` method gets it called on the main thread between requests (and
every 10 ms while no request arrives): the place to pump an app that must keep rendering.

This module imports neither torch, lerobot nor dagster.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from hud_pipelines.errors import EnvFault, HudPipelinesError
from hud_pipelines.sim import local_socket
from hud_pipelines.sim.actions import BoundsMode, HoldMode
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.envs import ProbeReset
from hud_pipelines.sim.main_thread import MainThreadExecutor
from hud_pipelines.sim.proc import MARK_ENV, descendants
from hud_pipelines.sim.server import DEFAULT_IDLE_TIMEOUT_S, SimServer
from hud_pipelines.sim.tasks import is_options
from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION

log = logging.getLogger("hud_pipelines.sim")
TOKEN_ENV = "HUD_PIPELINES_TOKEN"
CHILD_ERROR_PREFIX = "hud-pipelines sim error: "
"""Leads the one stderr line a failed start ends with (``<prefix>ContractError: ...``), which a parent reads."""
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
PARENT_GONE_GRACE_S = 3.0


def parse_value(text: str) -> Any:
    """``--arg`` values are JSON where they parse as JSON (numbers, booleans, lists), else strings."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_build_args(pairs: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise HudPipelinesError(f"--arg expects key=value, got {pair!r}")
        args[key] = parse_value(value)
    return args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("factory", help="module:callable, path/to/file.py:callable, or a gymnasium registry id")
    parser.add_argument("--num-envs", type=int, default=1, help="slots served in lockstep (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: any free port, reported)")
    parser.add_argument(
        "--contract",
        type=Path,
        default=None,
        help="contract.json to write on first use and merge afterwards (default: in memory only)",
    )
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a build argument for the factory (repeatable; JSON values)",
    )
    parser.add_argument(
        "--probe-seed",
        type=int,
        action="append",
        default=[],
        help="seed of the reset that samples one observation at start-up, for the contract (default: none); "
        "repeated with --probe-options, the resets are tried in turn until one works (a pipeline gives its first "
        "tasks')",
    )
    parser.add_argument(
        "--probe-options",
        type=_probe_options,
        action="append",
        default=[],
        metavar="JSON",
        help="reset options of that reset, a JSON object, for an env whose reset needs them (the n-th goes with "
        "the n-th --probe-seed)",
    )
    parser.add_argument(
        "--token", default=None, help=f"capability token clients must present (default ${TOKEN_ENV}, else random)"
    )
    parser.add_argument(
        "--hold",
        choices=[m.value for m in HoldMode],
        default=HoldMode.LAST.value,
        help="action a finished slot receives while others step (default: its last action)",
    )
    parser.add_argument(
        "--bounds",
        choices=[m.value for m in BoundsMode],
        default=BoundsMode.CLIP.value,
        help="out-of-bounds continuous actions: clip (default) or error",
    )
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=DEFAULT_MAX_FRAME_BYTES,
        help="the largest message either side may send, in bytes; a larger one closes the connection with 1009 "
        "(default: %(default)s, 64 MiB)",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help=f"close a client that sends nothing for this long after its hello (default {DEFAULT_IDLE_TIMEOUT_S:g}; "
        "0: never), so a silent client cannot hold the sim",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="of the server's log on stderr: DEBUG, INFO, WARNING, ERROR (default: INFO)"
    )
    parser.add_argument(
        "--local-socket",
        action="store_true",
        default=os.environ.get(local_socket.ENV) == "1",
        help="also listen on a Unix socket of Linux's abstract namespace, named in the ready line as local_socket, "
        "for clients of this host: a third of loopback TCP's kernel cost per message, a few percent of a served "
        f"step (default: ${local_socket.ENV} is 1, as a spawning parent sets it; elsewhere than Linux: not opened)",
    )
    parser.add_argument("--parent-watch", action="store_true", help=argparse.SUPPRESS)


def probes_of(seeds: list[int], options: list[dict[str, Any]]) -> list[ProbeReset]:
    """The start-up probe resets ``--probe-seed`` and ``--probe-options`` give, paired in order."""
    return [ProbeReset(seed, option) for seed, option in itertools.zip_longest(seeds, options)]


def _probe_options(text: str) -> dict[str, Any]:
    """``--probe-options``: a JSON object (reset options are a map the env reads keys of)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not is_options(value):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _token(given: str | None) -> str:
    """``--token``, else ``$HUD_PIPELINES_TOKEN``, else a random one; an empty one is refused, never replaced
    (a client holding the empty token it was told of would be refused with no word why)."""
    chosen = given if given is not None else os.environ.get(TOKEN_ENV)
    if chosen is None:
        return secrets.token_urlsafe(24)
    if not chosen.strip():
        where = "--token" if given is not None else f"${TOKEN_ENV}"
        raise HudPipelinesError(f"{where} is empty: give a token, or leave it out for a random one")
    return chosen


def run(args: argparse.Namespace) -> int:
    """Serve until told to stop; returns the process exit code."""
    ready_out = _claim_stdout()
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s [sim %(process)d] %(name)s: %(message)s",
    )
    executor = MainThreadExecutor()
    _install_signal_handlers(executor, announce=not args.parent_watch)
    if args.parent_watch:
        threading.Thread(target=_watch_parent, name="hud-parent-watch", daemon=True).start()
    bridge: GymBridge | None = None
    server: SimServer | None = None
    try:
        token = _token(args.token)
        bridge = GymBridge(
            args.factory,
            args.num_envs,
            build_args=parse_build_args(args.arg),
            contract_path=args.contract,
            hold=HoldMode(args.hold),
            bounds=BoundsMode(args.bounds),
            probes=probes_of(args.probe_seed, args.probe_options),
        )
        bridge.start()
        executor.idle_hook = bridge.run_idle_hook if bridge.idle_hook() is not None else None
        server = SimServer(
            bridge,
            executor,
            token=token,
            host=args.host,
            port=args.port,
            max_frame_bytes=args.max_frame_bytes,
            idle_timeout_s=args.idle_timeout_s,
            local_socket=local_socket.new_name() if args.local_socket and sys.platform == "linux" else None,
        )
        port = server.start()
        host = socket.gethostname() if args.host in ("0.0.0.0", "::", "") else args.host
        ready: dict[str, object] = {
            "url": f"ws://{host}:{port}",
            "token": token,
            "protocol": PROTOCOL_VERSION,
            "num_envs": args.num_envs,
            "pid": os.getpid(),
        }
        if server.local_socket is not None:
            ready["local_socket"] = server.local_socket
        ready_out.write(json.dumps(ready) + "\n")
        ready_out.flush()
        ready_out.close()
        log.info("serving %s with %d slot(s) at ws://%s:%d", args.factory, args.num_envs, host, port)
        executor.run_forever()
        log.info("shutting down")
        return 0
    except KeyboardInterrupt:
        log.info("interrupted")
        return 0
    except EnvFault as exc:  # the env's own code raised (its probe reset): the traceback says where
        log.error("%s\n%s", exc, exc.formatted)
        _report_fatal(exc)
        return EXIT_FAILED
    except HudPipelinesError as exc:
        log.error("%s", exc)
        _report_fatal(exc)
        return EXIT_BAD_INPUT
    except Exception as exc:
        log.exception("the sim failed")
        _report_fatal(exc)
        return EXIT_FAILED
    finally:
        _shut_down(executor, server, bridge)


def _report_fatal(exc: BaseException) -> None:
    """End stderr with one line naming the error, for whoever reads the tail (the spawning parent)."""
    text = " ".join(str(exc).split("\n")[0].split()) or "(no message)"
    sys.stderr.write(f"{CHILD_ERROR_PREFIX}{type(exc).__name__}: {text}\n")
    sys.stderr.flush()


def _shut_down(executor: MainThreadExecutor, server: SimServer | None, bridge: GymBridge | None) -> None:
    """Refuse new work, close the connections, close the env; a further signal cuts this short."""
    try:
        executor.close()
        if server is not None:
            server.stop()
        if bridge is not None:
            bridge.close()
    except KeyboardInterrupt:
        log.warning("interrupted again while shutting down; exiting without closing the env")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hud_pipelines.sim", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _claim_stdout() -> Any:
    """Keep the real stdout for the ready line; everything else printed goes to stderr."""
    ready_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(ready_fd, "w")


STOPPING_NOTICE = (
    b"stopping once the sim's current call returns (a step that hangs never does): send the signal again to "
    b"interrupt it\n"
)
"""What a server run by hand says on its first SIGTERM/SIGINT, which may seem to do nothing while a step runs."""


def _install_signal_handlers(executor: MainThreadExecutor, *, announce: bool) -> None:
    """The first SIGTERM/SIGINT stops serving after the current sim touch (``announce``: says so on stderr, for a
    server run by hand); a second one interrupts it."""
    stopping = False

    def shutdown(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        stopping = True
        if announce:
            os.write(2, STOPPING_NOTICE)  # not logging: a handler may run inside a log call of this thread
        executor.stop()  # SimpleQueue.put is reentrant: safe inside a signal handler

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)


def _watch_parent() -> None:
    """Exit with the whole process group once stdin closes (the parent that spawned us is gone), and with what the
    sim started outside it (a session of its own, a daemon): the parent that would have stopped those is gone."""
    try:
        while os.read(0, 4096):  # the raw fd: a buffered reader would hold a lock at interpreter exit
            pass
    except OSError:
        pass
    log.warning("parent process went away; stopping the sim")
    for pid in descendants(os.getpid(), os.environ.get(MARK_ENV), group=os.getpgrp()):  # the group's signals miss
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(PARENT_GONE_GRACE_S)
    os.killpg(os.getpgrp(), signal.SIGKILL)
