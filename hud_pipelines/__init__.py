"""hud-pipelines: declarative evaluation of robot policies in simulation.

The package root stays import-light (the sim child imports it); the public entry points are
loaded on first use::

    from hud_pipelines import wrap          # record a loop you own
    from hud_pipelines import SimProcess    # serve a sim in a child process, or attach to one
    from hud_pipelines import RobotAgent    # drive every slot of a sim with a policy
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hud_pipelines.agent.runner import RobotAgent
    from hud_pipelines.contract import Contract
    from hud_pipelines.recording.wrap import wrap
    from hud_pipelines.sim.bridge import GymBridge
    from hud_pipelines.sim.client import SimClient
    from hud_pipelines.sim.process import SimProcess

_EXPORTS = {
    "wrap": "hud_pipelines.recording.wrap",
    "SimProcess": "hud_pipelines.sim.process",
    "SimClient": "hud_pipelines.sim.client",
    "GymBridge": "hud_pipelines.sim.bridge",
    "RobotAgent": "hud_pipelines.agent.runner",
    "Contract": "hud_pipelines.contract",
}

__all__ = ["Contract", "GymBridge", "RobotAgent", "SimClient", "SimProcess", "wrap"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hud_pipelines' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
