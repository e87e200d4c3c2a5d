"""The ``hud-pipelines`` command line: one module per command group, wired together in :mod:`.main`."""

from hud_pipelines.cli.main import main

__all__ = ["main"]
