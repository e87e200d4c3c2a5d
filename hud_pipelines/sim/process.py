"""The parent-side handle of a sim: spawn a child that serves it, or attach to one served elsewhere.

A spawned child:

- runs ``python -m hud_pipelines.sim`` in a new session, so it leads its own process group and
  teardown can kill everything it started (SIGTERM, a grace period, then SIGKILL of the group);
- must print its ready line within ``startup_timeout_s``, else it is killed and the error carries the
  tail of its stderr (which is also forwarded to the ``hud_pipelines.sim.child`` logger), led by
  the child's own error line (:attr:`SimStartError.child_error`);
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

import collections
import contextlib
import json
import logging
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hud_pipelines.errors import SimStartError
from hud_pipelines.sim.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, SimClient
from hud_pipelines.sim.serve import CHILD_ERROR_PREFIX, TOKEN_ENV
from hud_pipelines.wire.codec import is_map
from hud_pipelines.wire.messages import Framing

log = logging.getLogger(__name__)
child_log = logging.getLogger("hud_pipelines.sim.child")
DEFAULT_STARTUP_TIMEOUT_S = 120.0
DEFAULT_GRACE_S = 5.0
STDERR_TAIL_LINES = 100
STACKS_SIGNAL = signal.SIGUSR1
"""On this signal a sim child writes the stack of every thread to stderr (faulthandler, set up first thing)."""
STACKS_WAIT_S = 1.5
"""How long a hung child gets to write its stacks before it is killed."""
STACK_HEADER = "(most recent call first)"
RENDERER_FRAME = re.compile(r"render|egl|osmesa|glfw|opengl|\bgl\b|mujoco.*context", re.IGNORECASE)
RENDERER_HINT = (
    "the sim seems stuck in its renderer ({frame}): offscreen rendering needs a working EGL (`apt-get install "
    "libegl1 libegl-mesa0 libgl1-mesa-dri`, MUJOCO_GL=egl) or OSMesa (`apt-get install libosmesa6`, "
    "MUJOCO_GL=osmesa PYOPENGL_PLATFORM=osmesa); now: {now}"
)
STDERR_DRAIN_S = 1.0
"""How long to wait for the last stderr lines of a child that exited."""
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: .*)?$")
"""The last line of a Python traceback (``ModuleNotFoundError: No module named 'x'``)."""
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
PROJECT_INTERPRETER = Path(".venv/bin/python")
"""The interpreter of a uv project directory given as ``python`` (what ``uv sync --project DIR`` creates)."""
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding this ``hud_pipelines`` package: what another interpreter's ``PYTHONPATH`` starts with."""


class SimProcess:
    """A served sim: a child process we own (``spawn``) or a URL we were given (``attach``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        stderr_tail: collections.deque[str] | None = None,
        stderr_pump: threading.Thread | None = None,
    ) -> None:
        self.url = url
        self.token = token
        self._popen = popen
        self._terminated = False
        self._stderr_tail = stderr_tail if stderr_tail is not None else collections.deque[str](maxlen=STDERR_TAIL_LINES)
        self._stderr_pump = stderr_pump

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
        child_env = {**os.environ, **(env or {}), TOKEN_ENV: token}
        if python is not None:
            child_env["PYTHONPATH"] = _with_package_root(child_env.get("PYTHONPATH", ""))
        try:
            pipe = subprocess.PIPE  # stdin: EOF tells the child its parent died; stdout: the ready line
            popen = subprocess.Popen(
                command, stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True, env=child_env, cwd=cwd
            )
        except OSError as exc:  # checked just before, so a race or an unusual file (a broken ELF)
            raise SimStartError(f"cannot run the sim interpreter {interpreter}: {exc} (sim {factory!r})") from exc
        tail = collections.deque[str](maxlen=STDERR_TAIL_LINES)
        assert popen.stderr is not None
        assert popen.stdout is not None
        pump = threading.Thread(
            target=_pump_stderr, args=(popen.stderr, tail, popen.pid), name=f"hud-sim-{popen.pid}-stderr", daemon=True
        )
        pump.start()
        handle = cls("", token, popen=popen, stderr_tail=tail, stderr_pump=pump)
        try:
            ready = _read_ready_line(popen, startup_timeout_s)
        except SimStartError as exc:
            hung = handle.dump_stacks()  # a child that is still starting after the deadline: where it is stuck
            handle.close(grace_s=1.0)
            diagnosis = handle.diagnose()
            child_error = None if hung else handle.child_error()
            lead = f"{child_error} ({exc}; sim {factory!r})" if child_error else f"{exc} (sim {factory!r})"
            hint = _missing_module_hint(child_error, interpreter, python) if python is not None else None
            hint = hint or (handle.stuck_hint(child_env) if hung else None)
            lead = f"{lead}\n{hint}" if hint else lead
            raise SimStartError(f"{lead}\n{diagnosis}", child_error=child_error) from None
        except BaseException:
            handle.close(grace_s=1.0)
            raise
        handle.url = str(ready["url"])
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
    ) -> SimClient:
        """A client of this sim; a spawned child's process group is killed when a request times out.

        ``framing=None`` lets the sim choose (``scalar`` for one slot). The client always hands out
        batched arrays.
        """
        return SimClient(
            self.url,
            self.token,
            framing=framing,
            step_timeout_s=step_timeout_s,
            reset_timeout_s=reset_timeout_s,
            connect_timeout_s=connect_timeout_s,
            diagnose=self.diagnose,
            on_timeout=self._hung if self._popen is not None else None,
            exit_status=lambda: self.returncode,
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
        """Exit status and stderr tail of a spawned child (waits briefly for a dying child)."""
        if self._popen is None:
            return ""
        try:
            code = self._popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            status = f"sim process {self._popen.pid} is still running"
        elif code < 0:
            status = f"sim process {self._popen.pid} was killed by {signal.Signals(-code).name}"
        else:
            status = f"sim process {self._popen.pid} exited with code {code}"
        self._drain_stderr(exited=code is not None)
        lines = "\n".join(f"  | {line}" for line in self._stderr_tail)
        return f"{status}; stderr tail:\n{lines}" if lines else status

    def child_error(self) -> str | None:
        """The child's own last error line: what it reported as fatal, else the last exception line of its stderr."""
        lines = list(self._stderr_tail)
        for line in reversed(lines):
            if CHILD_ERROR_PREFIX in line:
                return line.split(CHILD_ERROR_PREFIX, 1)[1].strip() or None
        for line in reversed(lines):
            if EXCEPTION_LINE.match(line.strip()):
                return line.strip()
        return None

    def _drain_stderr(self, *, exited: bool) -> None:
        """Let the stderr pump catch the last lines (all of them, up to a bound, once the child exited)."""
        if exited and self._stderr_pump is not None:
            self._stderr_pump.join(timeout=STDERR_DRAIN_S)
        else:
            time.sleep(0.05)

    def dump_stacks(self) -> bool:
        """Ask a running child for the stack of every thread, into its stderr tail; whether it wrote them.

        A hung sim is about to be killed; where its threads are (a renderer that never returns, a
        lock, a network call of the env) is the one thing that says why, and it is gone with the
        process. Python's faulthandler writes the stacks from a C signal handler, so a main thread
        blocked in C code still answers.
        """
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return False
        try:
            os.kill(popen.pid, STACKS_SIGNAL)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + STACKS_WAIT_S
        seen: list[str] = []
        while time.monotonic() < deadline:
            time.sleep(0.1)
            lines = list(self._stderr_tail)
            if lines == seen and any(STACK_HEADER in line for line in lines):
                return True  # the stacks arrived and nothing more is coming
            seen = lines
        return any(STACK_HEADER in line for line in seen)

    def stuck_hint(self, env: Mapping[str, str]) -> str | None:
        """What to install when the dumped stacks show a child stuck rendering (a known silent hang)."""
        frames = [line.strip() for line in self._stderr_tail if line.strip().startswith("File ")]
        frame = next((f for f in frames if RENDERER_FRAME.search(f)), None)
        if frame is None:
            return None
        now = ", ".join(f"{k}={env[k]}" for k in ("MUJOCO_GL", "PYOPENGL_PLATFORM") if k in env) or "neither set"
        return RENDERER_HINT.format(frame=frame, now=now)

    def _hung(self) -> None:
        """A request timed out: record where the child is stuck, then kill it."""
        self.dump_stacks()
        self.kill()

    def kill(self) -> None:
        """SIGKILL the child's whole process group now (a hung sim gets no grace)."""
        if self._popen is not None:
            _signal_group(self._popen.pid, signal.SIGKILL)
            self._popen.wait()
            self._release_pipes()

    @property
    def returncode(self) -> int | None:
        """A spawned child's exit status once it has exited (negative: the signal that ended it)."""
        return None if self._popen is None else self._popen.poll()

    def terminate(self) -> None:
        """Ask a spawned child to stop (SIGTERM to its group) without waiting; :meth:`close` waits.

        Closing several sims is then one grace period, not one per sim: terminate them all, then
        close each.
        """
        if self._popen is not None and self._popen.poll() is None and not self._terminated:
            self._terminated = True  # once: a second SIGTERM interrupts the child's orderly exit
            _signal_group(self._popen.pid, signal.SIGTERM)

    def close(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Stop a spawned child: SIGTERM to its group, then SIGKILL after ``grace_s``; no-op when attached."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            self.terminate()
            try:
                popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("sim process %d ignored SIGTERM for %.1f s; killing its group", popen.pid, grace_s)
        _signal_group(popen.pid, signal.SIGKILL)  # also reaps grandchildren left in the group
        popen.wait()
        self._release_pipes()

    def _release_pipes(self) -> None:
        """Close our ends of the child's stdin (the parent-watch pipe) and stdout (the ready line)."""
        if self._popen is not None:
            for stream in (self._popen.stdin, self._popen.stdout):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _missing_module_hint(child_error: str | None, interpreter: str, python: str | Path) -> str | None:
    """What to install where, when a child under another interpreter could not import a module."""
    match = MISSING_MODULE.search(child_error or "")
    if match is None:
        return None
    module = match.group(1).split(".")[0]
    hint = (
        f"the sim interpreter {interpreter} has no module {module!r}: install the package that provides it into "
        f"that environment (`uv pip install --python {interpreter} {module}`)"
    )
    project = Path(python).expanduser()
    if project.is_dir():
        hint += f", or add it to {project / 'pyproject.toml'} and run `uv sync --project {project}`"
    return hint


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _pump_stderr(stream: IO[bytes], tail: collections.deque[str], pid: int) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        child_log.info("[%d] %s", pid, line)
    stream.close()


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
                    raise SimStartError(f"the sim exited with code {popen.returncode} before it was ready")
                continue
            chunk = os.read(popen.stdout.fileno(), 65536)
            if not chunk:
                popen.wait(timeout=5)
                raise SimStartError(f"the sim exited with code {popen.returncode} before it was ready")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0]
    try:
        ready = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SimStartError(f"the sim's ready line is not JSON: {line[:200]!r}") from exc
    if not is_map(ready) or "url" not in ready:
        raise SimStartError(f"the sim's ready line has no url: {line[:200]!r}")
    return ready
