"""Sims for the ``sim.python`` tests: CartPole that reports which interpreter serves it.

Loaded by path (``tests/sim/sims.py:reporting_cartpole``) in a sim child, which may run under
another Python than the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym


class _Reporting(gym.Wrapper[Any, Any, Any, Any]):
    """Writes ``{"executable", "prefix", "modules"}`` of the serving process to ``report`` at every reset,
    after the child has started serving (so every module the serving path imports is loaded by then)."""

    def __init__(self, env: gym.Env[Any, Any], report: Path) -> None:
        super().__init__(env)
        self.report = report

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        facts = {"executable": sys.executable, "prefix": sys.prefix, "modules": sorted(sys.modules)}
        self.report.write_text(json.dumps(facts))
        return self.env.reset(seed=seed, options=options)


def reporting_cartpole(report: str) -> gym.Env[Any, Any]:
    """CartPole-v1 that reports its interpreter and loaded modules to the file ``report``."""
    return _Reporting(gym.make("CartPole-v1"), Path(report))
