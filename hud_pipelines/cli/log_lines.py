"""The package's log lines as ``hud-pipelines run`` prints them: plain, however the process's logging is set up.

A run writes a line as each instance fails (its fault and reason) and the first error of a policy, beside its
progress bar and before its summary. Python's last-resort handler prints them as they are only while nothing
configured the root logger; a library's module-level ``logging.info`` call (Dagster's event log storage makes
one when two threads create a run's database at once) installs a handler that prefixes every later line with
``ERROR:hud_pipelines.eval.runner:``, so one run's lines read one way and the next run's another. The run's
own handler keeps them the same.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Generator
from typing import TextIO

PACKAGE_LOGGER = "hud_pipelines"


class _StderrNow(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is when a record comes: a progress bar (rich's) puts a proxy there that
    prints the line above the bar; the stream of the moment the run began would write into the bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


@contextlib.contextmanager
def plain_package_log(level: int = logging.WARNING) -> Generator[None]:
    """While it lasts, the package's records of ``level`` and above go to stderr as their message alone (with
    a traceback where one was logged), and nowhere else; the logger is as it was afterwards."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler = _StderrNow(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level_before, propagated = logger.level, logger.propagate
    logger.setLevel(level)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level_before)
        logger.propagate = propagated
