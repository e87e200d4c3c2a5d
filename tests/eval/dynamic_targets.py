"""Targets whose names only running this module tells (a module-level ``__getattr__``): the checks that read a
pipeline's files before a run leave them to the run, which meets their failure as a ``setup`` fault."""

from __future__ import annotations


def __getattr__(name: str) -> object:
    raise AttributeError(f"{__name__} makes its names when asked, and has no {name!r}")
