"""A process-wide listener for instance results, so a front end (the CLI's progress bar) can follow a
run that Dagster executes in this process without knowing about Dagster's event stream."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hud_pipelines.eval.results import InstanceResult

Listener = Callable[["InstanceResult"], None]
_listeners: list[Listener] = []


def notify(result: InstanceResult) -> None:
    for listener in list(_listeners):
        listener(result)


@contextlib.contextmanager
def listening(listener: Listener) -> Generator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
