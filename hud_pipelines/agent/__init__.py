"""The agent side: policies behind one batched seam, the lockstep agent loop, cross-sim batching.

The names below are imported on first use, so ``hud_pipelines.spec.agent`` (read by the spec
loader) stays cheap. Nothing here pulls in torch or lerobot: the torch-backed kinds live in
:mod:`hud_pipelines.agent.torch_policy` and :mod:`hud_pipelines.agent.lerobot`, imported by
:func:`build_policy` only when a config asks for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hud_pipelines.agent.batching import BatchedModel
    from hud_pipelines.agent.factory import build_policy
    from hud_pipelines.agent.policy import Policy, PolicyBatch
    from hud_pipelines.agent.runner import EpisodeKeys, RobotAgent, Sim
    from hud_pipelines.errors import PolicyError

_EXPORTS = {
    "BatchedModel": "hud_pipelines.agent.batching",
    "Policy": "hud_pipelines.agent.policy",
    "PolicyBatch": "hud_pipelines.agent.policy",
    "PolicyError": "hud_pipelines.errors",
    "build_policy": "hud_pipelines.agent.factory",
    "EpisodeKeys": "hud_pipelines.agent.runner",
    "RobotAgent": "hud_pipelines.agent.runner",
    "Sim": "hud_pipelines.agent.runner",
}
__all__ = [
    "BatchedModel",
    "EpisodeKeys",
    "Policy",
    "PolicyBatch",
    "PolicyError",
    "RobotAgent",
    "Sim",
    "build_policy",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hud_pipelines.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
