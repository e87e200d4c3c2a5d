"""Envs that misbehave on purpose, and an instrumented one, for proving the sim process and wire.

- :class:`FaultyEnv` (factory :func:`faulty`): a tiny deterministic env that raises, hangs, crashes,
  prints to stdout or returns NaN at a chosen step, optionally only in the slot reset with
  ``fault_seed`` (so one slot of a batch misbehaves while the others go on); reset faults fire on
  seeded resets only, so a sim started without a probe seed still starts (a pipeline's sim is probed
  with its first task's seed: a ``fault_seed`` other than that one leaves its start alone);
- :class:`ProbeEnv` (factory :func:`probe`): reports in its observation whether it runs on the
  main thread and how often its ``idle_hook`` ran, and reports success under a chosen ``info`` key;
- :func:`broken_import`: a factory whose import fails, as a sim with a missing dependency would.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from enum import StrEnum
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

HANG_S = 3600.0
EPISODE_STEPS = 10


class Fault(StrEnum):
    NONE = "none"
    RAISE_BUILD = "raise_build"
    HANG_BUILD = "hang_build"
    RAISE_RESET = "raise_reset"
    HANG_RESET = "hang_reset"
    RAISE_STEP = "raise_step"
    HANG_STEP = "hang_step"
    SLOW_STEP = "slow_step"
    """Sleep ``delay_s`` in every step from ``at_step`` on (a slow but healthy sim)."""
    CRASH_STEP = "crash_step"
    """SIGKILL its own process, as an out-of-memory kill or a segfault would."""
    NAN_STEP = "nan_step"
    """Return NaN observations."""
    NAN_REWARD_STEP = "nan_reward_step"
    """Return a NaN reward (the observation stays finite)."""
    PRINT = "print"
    """Print to stdout on build, reset and step (must never corrupt the ready line)."""
    WRONG_SHAPE_STEP = "wrong_shape_step"
    """Return an observation of another shape than the contract's."""
    HANG_CLOSE = "hang_close"
    """Never return from ``close()``: the sim ignores SIGTERM, in effect."""
    EXIT_STEP = "exit_step"
    """Call ``sys.exit(4)`` in a step, as a pygame env does when its window is closed."""


class FaultyEnv(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """Observation ``[t, last action, seed]``; reward 1 per step; terminates after 10 steps."""

    metadata: dict[str, Any] = {"render_fps": 10}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self, fault: str = "none", at_step: int = 2, fault_seed: int | None = None, delay_s: float = 0.0):
        self.fault = Fault(fault)
        self.at_step = at_step
        self.fault_seed = fault_seed
        self.delay_s = delay_s
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.seed_value: int | None = None
        if self.fault is Fault.RAISE_BUILD:
            raise RuntimeError("FaultyEnv refused to build (fault=raise_build)")
        if self.fault is Fault.HANG_BUILD:
            time.sleep(HANG_S)
        self._chatter("building")

    def _armed(self) -> bool:
        return self.fault_seed is None or self.seed_value == self.fault_seed

    def _chatter(self, what: str) -> None:
        if self.fault is Fault.PRINT:
            print(f"FaultyEnv is {what} (this line must not reach the ready line's stdout)")
            sys.stdout.flush()

    def _observation(self, action: float = 0.0) -> npt.NDArray[np.float32]:
        return np.array([self.t, action, self.seed_value or 0], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.seed_value = seed
        self._chatter("resetting")
        seeded = seed is not None  # a start-up probe reset without a seed stays healthy
        if seeded and self._armed() and self.fault is Fault.RAISE_RESET:
            raise ValueError(f"FaultyEnv reset failed on purpose (seed {seed})")
        if seeded and self._armed() and self.fault is Fault.HANG_RESET:
            time.sleep(HANG_S)
        return self._observation(), {}

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.t += 1
        self._chatter("stepping")
        value = float(np.asarray(action).reshape(-1)[0])
        observation = self._observation(value)
        reward = 1.0
        if self._armed() and self.t >= self.at_step:
            match self.fault:
                case Fault.RAISE_STEP:
                    raise ZeroDivisionError(f"FaultyEnv step {self.t} failed on purpose (seed {self.seed_value})")
                case Fault.HANG_STEP:
                    time.sleep(HANG_S)
                case Fault.SLOW_STEP:
                    time.sleep(self.delay_s)
                case Fault.CRASH_STEP:
                    os.kill(os.getpid(), signal.SIGKILL)
                case Fault.NAN_STEP:
                    observation[:] = np.nan
                case Fault.NAN_REWARD_STEP:
                    reward = float("nan")
                case Fault.WRONG_SHAPE_STEP:
                    observation = np.zeros(5, dtype=np.float32)
                case Fault.EXIT_STEP:
                    sys.exit(4)
                case _:
                    pass
        return observation, reward, self.t >= EPISODE_STEPS, False, {}

    def close(self) -> None:
        if self.fault is Fault.HANG_CLOSE:
            time.sleep(HANG_S)


def faulty(fault: str = "none", at_step: int = 2, fault_seed: int | None = None, delay_s: float = 0.0) -> FaultyEnv:
    """A :class:`FaultyEnv` with the given fault."""
    return FaultyEnv(fault=fault, at_step=at_step, fault_seed=fault_seed, delay_s=delay_s)


class ProbeEnv(gym.Env[npt.NDArray[np.float32], np.int64]):
    """Observation ``[t, on_main_thread, idle_calls, built_on_main_thread]``; Discrete(3) actions.

    Success is reported under ``info[success_key]`` once ``t >= success_at`` (``success_key=""``
    reports nothing, so the score is the return).
    """

    metadata: dict[str, Any] = {}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(
        self, success_key: str = "", success_at: int = 3, episode_steps: int = 6, dt: float = 0.05, prompt: str = ""
    ):
        self.task_description = prompt
        self.success_key = success_key
        self.success_at = success_at
        self.episode_steps = episode_steps
        self.dt = dt
        self.observation_space = gym.spaces.Box(0.0, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0
        self.idle_calls = 0
        self.built_on_main = threading.current_thread() is threading.main_thread()

    def idle_hook(self) -> None:
        """Runs on the sim's main thread between requests (where a rendering app would be pumped)."""
        self.idle_calls += 1

    def _observation(self) -> npt.NDArray[np.float32]:
        on_main = threading.current_thread() is threading.main_thread()
        return np.array([self.t, on_main, self.idle_calls, self.built_on_main], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action: np.int64) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"ProbeEnv got action {action!r} of type {type(action).__name__}")
        self.t += 1
        info: dict[str, Any] = {}
        if self.success_key:
            info[self.success_key] = self.t >= self.success_at
        return self._observation(), float(action), False, self.t >= self.episode_steps, info


def probe(
    success_key: str = "", success_at: int = 3, episode_steps: int = 6, dt: float = 0.05, prompt: str = ""
) -> ProbeEnv:
    """A :class:`ProbeEnv`; a non-empty ``prompt`` is offered as the env's task description."""
    return ProbeEnv(success_key=success_key, success_at=success_at, episode_steps=episode_steps, dt=dt, prompt=prompt)


def broken_import() -> gym.Env[Any, Any]:
    """A factory whose sim depends on a package that is not installed."""
    import hud_pipelines_missing_simulator  # type: ignore[import-not-found]  # noqa: F401

    raise AssertionError("unreachable")
