"""Dagster's local capture of a step's stdout and stderr, with helper processes a terminal's Ctrl-C leaves alone.

Dagster mirrors each captured stream to a file through two helper processes (``tail -F`` and a Python
watcher that stops it if the run dies), started in the run's process group. A Ctrl-C at the terminal
signals that whole group: each watcher, being Python, printed a ``KeyboardInterrupt`` traceback under the
run's own account of the interrupt. :class:`InterruptSafeComputeLogManager` starts them with SIGINT blocked
(a blocked signal stays blocked across ``exec``, so the watchers never see it) and unblocks it at once in
the run's thread, which then gets a Ctrl-C that came meanwhile. The run stops the helpers when the step
ends, as before. A new local instance (``hud-pipelines run``'s ``dagster.yaml``) names this class; its ``base_dir``
defaults to Dagster's own, under ``$DAGSTER_HOME``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from dagster import Field, StringSource
from dagster._core.instance.ref import compute_logs_directory
from dagster._core.storage.compute_log_manager import CapturedLogContext
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._serdes import ConfigurableClassData

from hud_pipelines.errors import HudPipelinesError


class InterruptSafeComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute logs, whose helper processes ignore the SIGINT a terminal sends the run's group."""

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            "base_dir": Field(StringSource, is_required=False),
            "polling_timeout": Field(float, is_required=False),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> InterruptSafeComputeLogManager:
        settings = dict(config_value)
        base_dir = settings.pop("base_dir", None)
        if base_dir is None:
            home = os.environ.get("DAGSTER_HOME")
            if not home:
                raise HudPipelinesError(
                    f"{cls.__name__} keeps step logs under $DAGSTER_HOME/storage, and DAGSTER_HOME is not set "
                    "here: set it, or give compute_logs.config.base_dir in dagster.yaml"
                )
            base_dir = compute_logs_directory(home)
        return cls(base_dir, inst_data=inst_data, **settings)

    @contextlib.contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext]:
        with contextlib.ExitStack() as stack:
            with _sigint_blocked():
                captured = stack.enter_context(super().capture_logs(log_key))
            yield captured


@contextlib.contextmanager
def _sigint_blocked() -> Generator[None]:
    """SIGINT blocked in this thread while it lasts (and in the processes it starts, for good); nothing where
    threads have no signal mask (Windows).

    The mask is read before it is changed, so that a Ctrl-C that Python raises as the block begins (one that came
    just before) still finds the mask restored on its way out.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
