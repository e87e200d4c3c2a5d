"""Sims for the Dagster tests: CartPole that records which processes built it, crashes or stalls on cue.

Loaded by path (``tests/dagster/sims.py:cartpole``) from pipeline files the tests write.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym


class _Scripted(gym.Wrapper[Any, Any, Any, Any]):
    def __init__(
        self,
        env: gym.Env[Any, Any],
        *,
        crash_seeds: list[int],
        crash_file: str | None,
        stall_seeds: list[int],
        short_seeds: list[int],
        at_step: int,
        signal_seeds: list[int],
    ) -> None:
        super().__init__(env)
        self.signal_seeds = set(signal_seeds)
        self.crash_seeds = set(crash_seeds)
        self.stall_seeds = set(stall_seeds)
        self.short_seeds = set(short_seeds)
        self.crash_file = crash_file
        self.at_step = at_step
        self.seed: int | None = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.seed = seed
        self.steps = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.at_step and self.seed is not None:
            armed = self.crash_file is None or Path(self.crash_file).exists()
            if self.seed in self.crash_seeds and armed:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.seed in self.stall_seeds:
                time.sleep(3600)
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self.seed in self.signal_seeds:
            info = {**info, "is_success": False}
        return observation, reward, terminated or self.seed in self.short_seeds, truncated, info


def cartpole(
    pid_log: str | None = None,
    crash_seeds: list[int] | None = None,
    crash_file: str | None = None,
    stall_seeds: list[int] | None = None,
    short_seeds: list[int] | None = None,
    at_step: int = 5,
    signal_seeds: list[int] | None = None,
    label: str = "",
) -> gym.Env[Any, Any]:
    """CartPole-v1 that appends its process id to ``pid_log`` and kills (or stalls) its own process
    at ``at_step`` of an episode whose seed is listed (crashes only while ``crash_file`` exists, if given);
    an episode of a seed in ``short_seeds`` ends (terminated) after its first step; an episode of a seed in
    ``signal_seeds`` reports a success signal (never a success).

    ``label`` does nothing: it lands on the sim's command line, where a test finds its processes."""
    if pid_log is not None:
        with open(pid_log, "a") as log:
            log.write(f"{os.getpid()}\n")
    env = gym.make("CartPole-v1")
    return _Scripted(
        env,
        crash_seeds=crash_seeds or [],
        crash_file=crash_file,
        stall_seeds=stall_seeds or [],
        short_seeds=short_seeds or [],
        at_step=at_step,
        signal_seeds=signal_seeds or [],
    )


def faulty(label: str = "", **fault: Any) -> gym.Env[Any, Any]:
    """``envs.faulty:faulty`` with the test's ``label`` (so leftover sim processes can be found)."""
    from envs.faulty import faulty as make

    return make(**fault)
