"""The parent-side handle of a sim: spawn a child that serves it, or attach to one served elsewhere.

A spawned child:

- runs ``python -m hud_pipelines.sim`` in a new session, so it leads its own process group and
  teardown can kill everything it started (SIGTERM, a grace period, then SIGKILL of the group);
- must print its ready line within ``startup_timeout_s``, else it is killed and the error carries the
  tail of its stderr (which is also forwarded to the ``hud_pipelines.sim.child`` logger), led by
  the child's own error line (:attr:`SimStartError.child_error`; reading a child's stderr for why it
  failed is :mod:`hud_pipelines.sim.child_diagnosis`'s);
- holds the read end of a pipe on stdin whose write end only this process has: when this process
  dies for any reason the child sees EOF and kills its own group, so no sim outlives its parent;
- runs under this process's interpreter, or under another one (``python``: a sim whose simulator
  needs its own environment, e.g. MetaWorld on MuJoCo 3.3 while the agent has MuJoCo 4). That
  interpreter needs only the sim side of this package (numpy, gymnasium, pydantic, msgpack,
  websockets, never torch); this checkout goes first on its ``PYTHONPATH``. A missing interpreter,
  or one that lacks a module, is a :class:`SimStartError` naming it and how to install what is missing.

Attaching takes a URL and a token; :meth:`SimProcess.connect` returns the same :class:`SimClient`
either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hud_pipelines.closing import Closeable
from hud_pipelines.errors import SimStartError
from hud_pipelines.sim.child_diagnosis import ChildDiagnosis
from hud_pipelines.sim.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, SimClient
from hud_pipelines.sim.local_socket import ENV as LOCAL_SOCKET_ENV
from hud_pipelines.sim.proc import MARK_ENV, descendants
from hud_pipelines.sim.serve import TOKEN_ENV
from hud_pipelines.wire.codec import is_map
from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES, Framing

log = logging.getLogger(__name__)
DEFAULT_STARTUP_TIMEOUT_S = 120.0
DEFAULT_GRACE_S = 5.0
PROJECT_INTERPRETER = Path(".venv/bin/python")
"""The interpreter of a uv project directory given as ``python`` (what ``uv sync --project DIR`` creates)."""
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding this ``hud_pipelines`` package: what another interpreter's ``PYTHONPATH`` starts with."""


class SimProcess(Closeable):
    """A served sim: a child process we own (``spawn``) or a URL we were given (``attach``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        diagnosis: ChildDiagnosis | None = None,
        mark: str | None = None,
    ) -> None:
        self.url = url
        self.token = token
        self.local_socket: str | None = None
        """The local socket a spawned child listens on as well (its ready line's ``local_socket``,
        :mod:`hud_pipelines.sim.local_socket`), which its clients use. ``None``: attached, not Linux, or a child that
        could not open one or was told not to (``HUD_PIPELINES_LOCAL_SOCKET=0`` in ``env``): the URL serves."""
        self._popen = popen
        self._terminated_at: float | None = None
        """When it was asked to stop (SIGTERM): a close that comes later waits what is left of its grace period."""
        self._diagnosis = diagnosis
        self._mark = mark
        """The value of :data:`MARK_ENV` in the child's environment, which every process it starts inherits."""
        self._strays: set[int] = set()
        """The child's descendants seen before it was stopped: any that left its process group are stopped too."""
        self._left = None if popen is None else weakref.finalize(self, _stop_if_left, popen, os.getpid(), mark)
        """Stops the child of a sim dropped unclosed (or left at the interpreter's exit): killed and reaped, no zombie;
        a closed sim's is let go (its close stopped it all)."""

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def attach(cls, url: str, token: str) -> SimProcess:
        """A sim that something else serves (``hud-pipelines serve`` on another host)."""
        return cls(url, token)

    @classmethod
    def spawn(
        cls,
        factory: str,
        *,
        num_envs: int = 1,
        build_args: Mapping[str, Any] | None = None,
        contract_path: Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        options: Sequence[str] = (),
        idle_timeout_s: float = 0.0,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        python: str | Path | None = None,
    ) -> SimProcess:
        """Start a child serving ``factory``; returns once it printed its ready line.

        ``idle_timeout_s`` is the child's ``--idle-timeout-s``: 0 (never) by default, since a
        spawned child serves only its parent, which may keep a pooled connection idle between
        instances (and the child dies with its parent anyway). ``options`` come after it and win.
        ``python`` is the child's interpreter (see :func:`sim_interpreter`); ``None``: this one.
        """
        interpreter = sim_interpreter(python)
        token = secrets.token_urlsafe(24)
        command = [
            interpreter,
            "-m",
            "hud_pipelines.sim",
            factory,
            "--num-envs",
            str(num_envs),
            "--host",
            host,
            "--port",
            str(port),
            "--parent-watch",
            "--idle-timeout-s",
            f"{idle_timeout_s:g}",
            *options,
        ]
        if contract_path is not None:
            command += ["--contract", str(contract_path)]
        for key, value in (build_args or {}).items():
            command += ["--arg", f"{key}={json.dumps(value)}"]
        mark = secrets.token_hex(8)
        child_env = {**os.environ, LOCAL_SOCKET_ENV: "1", **(env or {}), TOKEN_ENV: token, MARK_ENV: mark}
        if python is not None:
            child_env["PYTHONPATH"] = _with_package_root(child_env.get("PYTHONPATH", ""))
        try:
            pipe = subprocess.PIPE  # stdin: EOF tells the child its parent died; stdout: the ready line
            popen = subprocess.Popen(
                command, stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True, env=child_env, cwd=cwd
            )
        except OSError as exc:  # checked just before, so a race or an unusual file (a broken ELF)
            raise SimStartError(f"cannot run the sim interpreter {interpreter}: {exc} (sim {factory!r})") from exc
        assert popen.stdout is not None
        diagnosis = ChildDiagnosis(popen)
        handle = cls("", token, popen=popen, diagnosis=diagnosis, mark=mark)
        try:
            ready = _read_ready_line(popen, startup_timeout_s)
        except SimStartError as exc:
            hung = handle.dump_stacks()  # a child that is still starting after the deadline: where it is stuck
            handle.close(grace_s=1.0)
            raise diagnosis.start_error(
                exc, factory, hung=hung, interpreter=interpreter, python=python, env=child_env
            ) from None
        except BaseException:
            handle.close(grace_s=1.0)
            raise
        handle.url = str(ready["url"])
        local_socket = ready.get("local_socket")
        handle.local_socket = local_socket if isinstance(local_socket, str) else None
        log.info("sim %s (pid %d) ready at %s", factory, popen.pid, handle.url)
        return handle

    # -- use -----------------------------------------------------------------------------------------

    def connect(
        self,
        *,
        framing: Framing | None = Framing.BATCHED,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        reset_timeout_s: float | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> SimClient:
        """A client of this sim; a spawned child's process group is killed when a request times out.

        ``framing=None`` lets the sim choose (``scalar`` for one slot). The client always hands out
        batched arrays. ``max_frame_bytes``: the largest message it takes before the sim's hello announces its own.
        """
        return SimClient(
            self.url,
            self.token,
            framing=framing,
            max_frame_bytes=max_frame_bytes,
            step_timeout_s=step_timeout_s,
            reset_timeout_s=reset_timeout_s,
            connect_timeout_s=connect_timeout_s,
            diagnose=self.diagnose,
            on_timeout=self._hung if self._popen is not None else None,
            exit_status=lambda: self.returncode,
            local_socket=self.local_socket,
        )

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def pgid(self) -> int | None:
        """The child's process group (the child leads it), which teardown kills as a whole."""
        return self.pid

    @property
    def owned(self) -> bool:
        return self._popen is not None

    def alive(self) -> bool:
        return self._popen is None or self._popen.poll() is None

    def diagnose(self, wait_s: float = 1.0) -> str:
        """Exit status and stderr tail of a spawned child (waits briefly for a dying child); empty when attached."""
        return "" if self._diagnosis is None else self._diagnosis.diagnose(wait_s)

    def child_error(self) -> str | None:
        """The child's own last error line (see :meth:`ChildDiagnosis.child_error`); ``None`` when attached."""
        return None if self._diagnosis is None else self._diagnosis.child_error()

    def dump_stacks(self) -> bool:
        """Ask a running child for the stack of every thread, into its stderr tail; whether it wrote them."""
        return self._diagnosis is not None and self._diagnosis.dump_stacks()

    def stuck_hint(self, env: Mapping[str, str]) -> str | None:
        """What to install when the dumped stacks show a child stuck rendering; ``None`` when attached."""
        return None if self._diagnosis is None else self._diagnosis.stuck_hint(env)

    def _hung(self) -> None:
        """A request timed out: record where the child is stuck, then kill it."""
        self.dump_stacks()
        self.kill()

    def kill(self) -> None:
        """SIGKILL the child's whole process group now (a hung sim gets no grace)."""
        if self._popen is not None:  # a child reaped already is no root to walk from (its id may be reused)
            self._strays.update(descendants(None if self._popen.poll() is not None else self._popen.pid, self._mark))
            _stop_group(self._popen, self._mark, self._strays)

    @property
    def returncode(self) -> int | None:
        """A spawned child's exit status once it has exited (negative: the signal that ended it)."""
        return None if self._popen is None else self._popen.poll()

    def terminate(self) -> None:
        """Ask a spawned child to stop (SIGTERM to its group) without waiting; :meth:`close` waits.

        Closing several sims is then one grace period, not one per sim: terminate them all, then
        close each.
        """
        if self._popen is not None and self._popen.poll() is None and self._terminated_at is None:
            self._terminated_at = time.monotonic()  # once: a second SIGTERM interrupts the child's orderly exit
            self._strays.update(descendants(self._popen.pid, self._mark))  # now: once it is gone, so is their link
            _signal_group(self._popen.pid, signal.SIGTERM)

    def close(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Stop a spawned child: SIGTERM to its group, then SIGKILL ``grace_s`` after the SIGTERM (one sent earlier by
        :meth:`terminate` counts, so closing several sims told at once is one grace period); no-op when attached."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            self.terminate()
            told = self._terminated_at or time.monotonic()
            try:
                popen.wait(timeout=max(0.0, told + grace_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                waited = time.monotonic() - told
                log.warning("sim process %d ignored SIGTERM for %.1f s; killing its group", popen.pid, waited)
        _stop_group(popen, self._mark, self._strays)
        if self._left is not None:
            self._left.detach()


def sim_interpreter(python: str | Path | None) -> str:
    """The interpreter a sim child runs under: ``python`` itself when it is a file, ``DIR/.venv/bin/python``
    when it is a (uv project) directory, this process's interpreter when ``None``.

    Checked here so that a wrong path fails at once with what to do, not as a child that never starts.
    """
    if python is None:
        return sys.executable
    path = Path(python).expanduser()
    if path.is_dir():
        project = path
        path = project / PROJECT_INTERPRETER
        if not path.exists():
            raise SimStartError(
                f"sim interpreter {path} does not exist: {project} is a directory, which is taken as a uv project "
                f"whose environment is not set up; create it with `uv sync --project {project}`"
            )
    if not path.exists():
        raise SimStartError(
            f"sim interpreter {path} does not exist (sim.python names a Python executable, or a uv project "
            "directory whose .venv/bin/python is used)"
        )
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SimStartError(f"sim interpreter {path} is not an executable file")
    return str(path.absolute())


def _with_package_root(pythonpath: str) -> str:
    """``PYTHONPATH`` for another interpreter: this checkout's ``hud_pipelines`` first, then what was there.

    When this package was installed into site-packages rather than run from a checkout, that directory
    is not added (it would hand the child every package of this environment, torch included): the
    sim's environment then needs hud-pipelines installed itself.
    """
    if PACKAGE_ROOT.name in ("site-packages", "dist-packages"):
        return pythonpath
    return os.pathsep.join(p for p in (str(PACKAGE_ROOT), pythonpath) if p)


def _stop_if_left(popen: subprocess.Popen[bytes], owner: int, mark: str | None) -> None:
    """Stop a child nobody closed as :meth:`SimProcess.close` would, its descendants that left its group included,
    reap it and close our ends of its pipes; only in the process that spawned it (a worker forked from that process
    must not stop its parent's sims as it exits)."""
    if os.getpid() == owner:
        _stop_group(popen, mark, set(descendants(popen.pid, mark)) if popen.poll() is None else set())


def _stop_group(popen: subprocess.Popen[bytes], mark: str | None, strays: set[int]) -> None:
    """SIGKILL the child's process group (also what is left of it after the child), reap the child, then SIGKILL the
    descendants that started sessions of their own (``start_new_session``, a daemon: the group's signal never
    reaches them): ``strays`` seen before, and those its ``mark`` finds now. Last, close our ends of its stdin (the
    parent-watch pipe) and stdout (the ready line). ``strays`` is emptied."""
    _signal_group(popen.pid, signal.SIGKILL)
    popen.wait()
    strays.update(descendants(None, mark))  # it is gone (perhaps on its own): its mark finds the rest
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    strays.clear()
    for stream in (popen.stdin, popen.stdout):
        if stream is not None:
            stream.close()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _exited_early(returncode: int) -> SimStartError:
    return SimStartError(f"the sim exited with code {returncode} before it was ready", signalled=returncode < 0)


def _read_ready_line(popen: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout_s
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(popen.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SimStartError(f"the sim did not become ready within {timeout_s:g} s")
            if not selector.select(timeout=min(remaining, 0.5)):
                if popen.poll() is not None:
                    raise _exited_early(popen.returncode)
                continue
            chunk = os.read(popen.stdout.fileno(), 65536)
            if not chunk:
                popen.wait(timeout=5)
                raise _exited_early(popen.returncode)
            buffer += chunk
    line = buffer.split(b"\n", 1)[0]
    try:
        ready = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SimStartError(f"the sim's ready line is not JSON: {line[:200]!r}") from exc
    if not is_map(ready) or "url" not in ready:
        raise SimStartError(f"the sim's ready line has no url: {line[:200]!r}")
    return ready
