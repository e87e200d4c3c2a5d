"""``build_policy``: a ``kind``-discriminated policy config -> the policy it names.

A closed match over :mod:`hud_pipelines.spec.agent`'s kinds, not a registry: each implementation
is imported only when its kind is asked for, so torch and lerobot stay out of processes that never
use them, and the implementations import :mod:`hud_pipelines.agent.policy` without a cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hud_pipelines.agent.policy import BasePolicy, as_base_policy
from hud_pipelines.contract import Contract

if TYPE_CHECKING:
    from hud_pipelines.agent.torch_runtime import LockstepForwards, LockstepThreads
    from hud_pipelines.spec.agent import PolicyConfig


def build_policy(
    config: PolicyConfig,
    contract: Contract,
    *,
    base_dir: Path,
    torch_threads: int | None = 1,
    lockstep_threads: LockstepThreads = "auto",
) -> BasePolicy:
    """Build the policy a ``kind``-discriminated config names.

    ``base_dir`` resolves relative paths (checkpoints, pretrained folders, ``file.py:callable``
    targets) against the directory of the YAML that declared them. ``torch_threads`` applies to the
    torch-backed kinds (1 keeps latency stable while sims share the cores; ``None`` keeps torch's
    default); ``lockstep_threads`` to their forwards that every sim waits on.
    """
    from hud_pipelines.spec import agent as cfg

    on_torch = functools.partial(_on_torch, torch_threads=torch_threads, lockstep_threads=lockstep_threads)
    match config:
        case cfg.RandomPolicyConfig():
            from hud_pipelines.agent.builtin import RandomPolicy

            return RandomPolicy(contract, seed=config.seed, chunk_size=config.chunk_size)
        case cfg.ConstantPolicyConfig():
            from hud_pipelines.agent.builtin import ConstantPolicy

            return ConstantPolicy(contract, config.value)
        case cfg.ScriptedPolicyConfig():
            from hud_pipelines.agent.builtin import scripted_policy

            return as_base_policy(scripted_policy(config.target, contract, args=config.args, base_dir=base_dir))
        case cfg.TorchPolicyConfig():
            from hud_pipelines.agent.torch_policy import TorchModulePolicy

            return on_torch(functools.partial(TorchModulePolicy.from_config, config, contract, base_dir=base_dir))
        case cfg.LeRobotPolicyConfig():
            from hud_pipelines.agent.lerobot import LeRobotPolicy

            return on_torch(functools.partial(LeRobotPolicy.from_config, config, contract, base_dir=base_dir))
        case cfg.RemotePolicyConfig():
            from hud_pipelines.agent.remote import RemotePolicy

            return RemotePolicy.from_config(config, contract)


def _on_torch(
    build: Callable[[], LockstepForwards], torch_threads: int | None, lockstep_threads: LockstepThreads
) -> BasePolicy:
    """A torch-backed policy built once torch's threads are set, told the threads of its lockstep forwards."""
    from hud_pipelines.agent.torch_runtime import configure_threads

    configure_threads(torch_threads)  # before the first tensor: torch fixes its inter-op pool then
    policy = build()
    policy.lockstep_threads = lockstep_threads
    return policy
