"""A part written by a child process, so lerobot's Python-heavy writing never holds the caller's GIL.

Writer *threads* share the GIL with the agent loop and with each other; under load they convoy
(``bench/dataset.md``). A child process per part writes with its own interpreter, in parallel on
another core. The parent sends one whole episode at a time over a pipe and waits for the child's
acknowledgement, so at most one episode per child is in flight (memory stays bounded).

The child ignores SIGINT and SIGTERM: its parent decides when it finalizes (a terminated parent
closes its sinks, which tells every child to finalize). If the parent dies without a word, the pipe
breaks and the child finalizes on its own; it never outlives its work.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hud_pipelines.dataset.features import DatasetLayout
from hud_pipelines.dataset.options import DatasetOptions
from hud_pipelines.dataset.part import FinishedEpisode, PartWriter
from hud_pipelines.errors import ChildPartError

_START_TIMEOUT_S = 300.0
_POLL_S = 0.25
"""Spawning a child and importing lerobot takes ~11 s on an idle machine, far longer on a busy one."""


def _child_main(connection: Connection, path: Path, options: DatasetOptions, repo_id: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    writer = PartWriter(path, options, repo_id)
    try:
        writer.start()
        connection.send(("ready",))
        while True:
            try:
                message = connection.recv()
            except EOFError:  # the parent is gone: finalize what was written and stop
                break
            if message[0] == "finalize":
                break
            episode, layout = message[1], message[2]
            connection.send(("written", writer.write(episode, layout)))
    except BaseException:
        _send(connection, ("error", traceback.format_exc()))
    finally:
        try:
            writer.finalize()
            _send(connection, ("finalized",))
        except BaseException:
            _send(connection, ("error", traceback.format_exc()))
        connection.close()


def _send(connection: Connection, message: tuple[Any, ...]) -> None:
    with contextlib.suppress(OSError, ValueError):  # the parent is gone
        connection.send(message)


class ProcessPart:
    """Parent side of a part written by a child process (spawned, never forked: torch holds threads)."""

    def __init__(self, path: Path, options: DatasetOptions, repo_id: str) -> None:
        self.path = path
        self._options = options
        self._repo_id = repo_id
        self._connection: Connection | None = None
        self._process: Any = None

    def start(self, cancel: threading.Event) -> bool:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_child_main,
            args=(child, self.path, self._options, self._repo_id),
            name=f"dataset-{self.path.parent.name}-{self.path.name}",
            daemon=False,
        )
        self._process.start()
        child.close()
        self._connection = parent
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not parent.poll(_POLL_S):
            if cancel.is_set():
                return False
            if time.monotonic() > deadline:
                raise ChildPartError(f"{self.path}: the writer process did not start within {_START_TIMEOUT_S:.0f}s")
        self._expect("ready")
        return True

    def write(self, episode: FinishedEpisode, layout: DatasetLayout) -> int:
        connection = self._require()
        try:
            connection.send(("episode", episode, layout))
        except (OSError, ValueError) as exc:
            raise ChildPartError(f"{self.path}: the writer process is gone ({self._exit()})") from exc
        return int(self._expect("written")[1])

    def finalize(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            with contextlib.suppress(OSError, ValueError):
                connection.send(("finalize",))
            while True:  # skip a "ready" not waited for; stop at "finalized", an error or a broken pipe
                try:
                    message = connection.recv()
                except EOFError:
                    break
                if message[0] == "error":
                    raise ChildPartError(f"{self.path}: the writer process failed:\n{message[1]}")
                if message[0] == "finalized":
                    break
        finally:
            connection.close()
            self._process.join(timeout=60)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()

    def _require(self) -> Connection:
        if self._connection is None:
            raise ChildPartError(f"{self.path}: the writer process was not started or is finalized")
        return self._connection

    def _expect(self, kind: str) -> tuple[Any, ...]:
        connection = self._require()
        try:
            message = connection.recv()
        except EOFError as exc:
            raise ChildPartError(f"{self.path}: the writer process died ({self._exit()})") from exc
        if message[0] == "error":
            raise ChildPartError(f"{self.path}: the writer process failed:\n{message[1]}")
        if message[0] != kind:
            raise ChildPartError(f"{self.path}: expected {kind!r} from the writer process, got {message[0]!r}")
        return message

    def _exit(self) -> str:
        self._process.join(timeout=5)
        return f"exit code {self._process.exitcode}"
