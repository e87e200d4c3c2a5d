"""Diagnosing a spawned sim child: its stderr tail, its own error line, its stacks, and what to install.

A child that fails to start, crashes or hangs leaves one trace of why: what it wrote on stderr.
:class:`ChildDiagnosis` pumps that stream into a bounded tail (and the ``hud_pipelines.sim.child``
logger) from the moment the child starts, and reads it back: the exit status with the tail for an
error message, the child's own fatal line (:attr:`~hud_pipelines.errors.SimStartError.child_error`),
the stack of every thread of a hung child (asked for just before it is killed), and hints for the
known causes (a renderer without its driver, a module missing from another interpreter).

It is apart from :mod:`hud_pipelines.sim.process`, which starts and stops the child, because reading
a child's stderr for causes is a concern of its own, which the lifecycle only calls on when
something went wrong.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from hud_pipelines.errors import SimStartError, is_user_file
from hud_pipelines.sim.serve import CHILD_ERROR_PREFIX

child_log = logging.getLogger("hud_pipelines.sim.child")
STDERR_TAIL_LINES = 100
STDERR_LINE_CHARS = 2000
"""The longest a line of the tail is kept: a sim that prints megabytes on one line before it dies would
otherwise copy them into every row of the grades, the report and the result files."""
STACKS_SIGNAL = signal.SIGUSR1
"""On this signal a sim child writes the stack of every thread to stderr (faulthandler, set up first thing)."""
STACKS_WAIT_S = 5.0
"""How long a hung child gets to write its stacks before it is killed (spent only on a hung sim)."""
STACKS_SETTLE_S = 0.3
"""Without the main thread's last frame seen, the stacks are taken as complete once unchanged this long."""
STACK_HEADER = "(most recent call first)"
MAIN_THREAD_END = "in _run_module_as_main"
"""The main thread's outermost frame (``python -m``); faulthandler writes the main thread last."""
RENDERER_FRAME = re.compile(r"render|egl|osmesa|glfw|opengl|\bgl\b|mujoco.*context", re.IGNORECASE)
RENDERER_HINT = (
    "the sim seems stuck in its renderer ({frame}): offscreen rendering needs a working EGL (`apt-get install "
    "libegl1 libegl-mesa0 libgl1-mesa-dri`, MUJOCO_GL=egl) or OSMesa (`apt-get install libosmesa6`, "
    "MUJOCO_GL=osmesa PYOPENGL_PLATFORM=osmesa); now: {now}"
)
STDERR_DRAIN_S = 1.0
"""How long to wait for the last stderr lines of a child that exited."""
TRACEBACK_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)$')
STACK_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)$')
"""A frame of the stacks a hung child writes (faulthandler's: no comma before ``in``, innermost first)."""
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: .*)?$")
"""The last line of a Python traceback (``ModuleNotFoundError: No module named 'x'``)."""
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
ADVICE_LINE = re.compile(r"^\S+ \S+ WARNING \[sim \d+\] hud_pipelines\.contract[\w.]*: (?P<message>.*)$")
"""A warning of the child's contract derivation (its log format is ``serve``'s): advice about the sim itself
(its declared spaces) that the user should read, so it is logged here as a warning, once per message."""
_advice_given: set[str] = set()
_advice_lock = threading.Lock()


class ChildDiagnosis:
    """What a spawned child's stderr says about it, pumped into a tail of its last lines from its start."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stderr is not None
        self._popen = popen
        self.tail = collections.deque[str](maxlen=STDERR_TAIL_LINES)
        self._pump = threading.Thread(
            target=_pump_stderr,
            args=(popen.stderr, self.tail, popen.pid),
            name=f"hud-sim-{popen.pid}-stderr",
            daemon=True,
        )
        self._pump.start()

    def diagnose(self, wait_s: float = 1.0) -> str:
        """Exit status and stderr tail of a spawned child (waits briefly for a dying child)."""
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
        lines = "\n".join(f"  | {line}" for line in self.tail)
        return f"{status}; stderr tail:\n{lines}" if lines else status

    def child_error(self) -> str | None:
        """The child's own last error line: what it reported as fatal, else the last exception line of its stderr."""
        lines = list(self.tail)
        for line in reversed(lines):
            if CHILD_ERROR_PREFIX in line:
                return line.split(CHILD_ERROR_PREFIX, 1)[1].strip() or None
        for line in reversed(lines):
            if EXCEPTION_LINE.match(line.strip()):
                return line.strip()
        return None

    def raised_at(self) -> str | None:
        """Where in the user's code the child's last traceback was raised (``/p/envs/reach.py:89 in make``).

        A factory's own error names no file or line, and its traceback is in the stderr tail only. The
        innermost frame of code that is neither this package's, the standard library's nor an installed
        package's is the line to look at; ``None`` when every frame is such code (an error of ours says
        what it needs in its message).
        """
        for line in reversed(self.tail):
            frame = TRACEBACK_FRAME.match(line.strip())
            if frame is not None and is_user_file(frame["file"]):
                return f"{frame['file']}:{frame['line']} in {frame['function']}"
        return None

    def stuck_at(self) -> str | None:
        """Where the dumped stacks show the main thread (faulthandler writes it last): its innermost frame in the
        user's code, else its innermost frame; ``None`` without its whole stack (the tail may have cut it)."""
        lines = [line.strip() for line in self.tail]
        header = max((i for i, line in enumerate(lines) if STACK_HEADER in line), default=None)
        if header is None or not any(MAIN_THREAD_END in line for line in lines[header:]):
            return None
        frames = [frame for line in lines[header + 1 :] if (frame := STACK_FRAME.match(line)) is not None]
        frame = next((f for f in frames if is_user_file(f["file"])), frames[0] if frames else None)
        return None if frame is None else f"{frame['file']}:{frame['line']} in {frame['function']}"

    def _drain_stderr(self, *, exited: bool) -> None:
        """Let the stderr pump catch the last lines (all of them, up to a bound, once the child exited)."""
        if exited:
            self._pump.join(timeout=STDERR_DRAIN_S)
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
        if popen.poll() is not None:
            return False
        try:
            os.kill(popen.pid, STACKS_SIGNAL)
        except ProcessLookupError:
            return False
        started = time.monotonic()
        seen: list[str] = []
        changed = started
        while (now := time.monotonic()) < started + STACKS_WAIT_S:
            time.sleep(0.05)
            if popen.poll() is not None:  # it died (a signal it could not take): what it wrote is all there is
                self._drain_stderr(exited=True)
                return any(STACK_HEADER in line for line in self.tail)
            lines = list(self.tail)
            header = next((i for i, line in enumerate(lines) if STACK_HEADER in line), None)
            if header is not None and any(MAIN_THREAD_END in line for line in lines[header:]):
                return True  # the main thread, written last, is complete
            if lines != seen:
                seen, changed = lines, now
            elif header is not None and now - changed >= STACKS_SETTLE_S:
                return True  # the stacks arrived and nothing more is coming
        return any(STACK_HEADER in line for line in seen)

    def stuck_hint(self, env: Mapping[str, str]) -> str | None:
        """What to install when the dumped stacks show a child stuck rendering (a known silent hang)."""
        frames = [line.strip() for line in self.tail if line.strip().startswith("File ")]
        frame = next((f for f in frames if RENDERER_FRAME.search(f)), None)
        if frame is None:
            return None
        now = ", ".join(f"{k}={env[k]}" for k in ("MUJOCO_GL", "PYOPENGL_PLATFORM") if k in env) or "neither set"
        return RENDERER_HINT.format(frame=frame, now=now)

    def start_error(
        self,
        exc: SimStartError,
        factory: str,
        *,
        hung: bool,
        interpreter: str,
        python: str | Path | None,
        env: Mapping[str, str],
    ) -> SimStartError:
        """The error of a child that did not become ready: its own error line (or where it was stuck) and a hint on
        the first line, the headline that rows and reports keep, then its stderr tail (with the stacks).

        ``hung``: its stacks were dumped (it was still starting at the deadline), so its last error
        line, if any, is not why it failed.
        """
        diagnosis = self.diagnose()
        child_error = None if hung else self.child_error()
        where = None if child_error is None else self.raised_at()
        child_error = f"{child_error} (at {where})" if where else child_error
        stuck = self.stuck_at() if hung else None
        lead = f"{child_error} ({exc}; sim {factory!r})" if child_error else f"{exc} (sim {factory!r})"
        lead = f"{exc}, stuck at {stuck} (sim {factory!r})" if stuck else lead
        hint = _missing_module_hint(child_error, interpreter, python) if python is not None else None
        hint = hint or (self.stuck_hint(env) if hung else None)
        lead = f"{lead}; {hint}" if hint else lead  # on the headline, which every row and report keeps
        return SimStartError(
            f"{lead}\n{diagnosis}", child_error=child_error, signalled=exc.signalled and child_error is None
        )


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


def _pump_stderr(stream: IO[bytes], tail: collections.deque[str], pid: int) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        if len(line) > STDERR_LINE_CHARS:
            line = f"{line[:STDERR_LINE_CHARS]} [... {len(line) - STDERR_LINE_CHARS} more characters]"
        tail.append(line)
        child_log.info("[%d] %s", pid, line)
        advice = ADVICE_LINE.match(line)
        if advice is not None:
            _advise(advice["message"])
    stream.close()


def _advise(message: str) -> None:
    """Warn with a child's advice once: every sim of a run (one per instance, one per shard) derives the same."""
    with _advice_lock:
        if message in _advice_given:
            return
        _advice_given.add(message)
    child_log.warning("%s", message)
