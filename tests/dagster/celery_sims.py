"""A sim for the scale-out tests: the tests' CartPole, held mid-episode on cue so a test can kill its worker.

Loaded by path (``tests/dagster/celery_sims.py:held_cartpole``) from the pipeline files the tests write.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from tests.dagster.sims import cartpole

HOLD_LIMIT_S = 600.0


class _Held(gym.Wrapper[Any, Any, Any, Any]):
    def __init__(self, env: gym.Env[Any, Any], *, hold_file: str, hold_seeds: list[int], at_step: int) -> None:
        super().__init__(env)
        self.hold_file = Path(hold_file)
        self.hold_seeds = set(hold_seeds)
        self.at_step = at_step
        self.seed: int | None = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.seed, self.steps = seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.at_step and self.seed in self.hold_seeds and self.hold_file.exists():
            # The sim's parent is the process running the instance: a test kills that one.
            held = self.hold_file.with_name(self.hold_file.name + ".held")
            held.write_text(f"{os.getppid()}\n")
            deadline = time.monotonic() + HOLD_LIMIT_S
            while self.hold_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.env.step(action)


def held_cartpole(
    hold_file: str, hold_seeds: list[int], at_step: int = 5, label: str = "", **kwargs: Any
) -> gym.Env[Any, Any]:
    """The tests' CartPole that, while ``hold_file`` exists, stops at ``at_step`` of an episode whose seed is
    listed: it writes its parent's process id to ``<hold_file>.held`` and waits until the file is gone."""
    return _Held(cartpole(label=label, **kwargs), hold_file=hold_file, hold_seeds=hold_seeds, at_step=at_step)
