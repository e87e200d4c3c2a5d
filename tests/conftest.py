"""Shared fixtures of the sim and wire tests: spawned sims that are always torn down and checked.

Every sim a test spawns through :func:`spawn` is closed at the end of the test and its process group
is asserted gone (``os.killpg(pgid, 0)`` raising ``ProcessLookupError``): a test cannot pass while
leaving an orphan behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.contract import flatten_observation
from hud_pipelines.sim.process import SimProcess

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
FAULTY = f"{REPO / 'envs' / 'faulty.py'}:faulty"
PROBE = f"{REPO / 'envs' / 'faulty.py'}:probe"
POINT_MASS = f"{REPO / 'envs' / 'vectorized.py'}:point_mass"
GROUP_GONE_TIMEOUT_S = 10.0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a recycled id owned by someone else: ours is gone
        return False
    return True


def wait_group_gone(pgid: int, timeout_s: float = GROUP_GONE_TIMEOUT_S) -> None:
    """Wait until no process of group ``pgid`` exists; fail the test naming the group otherwise."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            pytest.fail(f"process group {pgid} still exists {timeout_s:g} s after teardown: an orphan")
        time.sleep(0.02)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def signal_state(pid: int) -> str:
    """A live process's signal masks and state from ``/proc``: why it may not have died of a signal."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"no /proc entry for {pid} ({exc})"
    wanted = ("State:", "SigBlk:", "SigIgn:", "SigCgt:", "Threads:")
    return "; ".join(line.replace("\t", " ") for line in lines if line.startswith(wanted))


@pytest.fixture(name="wait_group_gone")
def wait_group_gone_fixture() -> Callable[..., None]:
    return wait_group_gone


@pytest.fixture
def spawn() -> Iterator[Callable[..., SimProcess]]:
    """``spawn(factory, **kwargs)``: a spawned sim that is closed and checked for orphans after the test."""
    spawned: list[SimProcess] = []

    def start(factory: str, **kwargs: Any) -> SimProcess:
        kwargs.setdefault("startup_timeout_s", 60.0)
        sim = SimProcess.spawn(factory, **kwargs)
        spawned.append(sim)
        return sim

    yield start
    for sim in spawned:
        sim.close(grace_s=2.0)
        assert sim.pgid is not None
        wait_group_gone(sim.pgid)


# ---------------------------------------------------------------------------------------------
# trajectories: the same seeds and actions through a plain gymnasium loop and through the bridge

Array = npt.NDArray[Any]
Row = tuple[dict[str, bytes], float, bool, bool]
"""One slot after one step: observation bytes per feature, reward, terminated, truncated."""
Trajectory = dict[tuple[int, int], Row]
"""``(slot, step)`` -> row; step ``-1`` is the reset observation. Only steps a slot was running for."""


def action_frames(space: gym.Space[Any], num_slots: int, steps: int, seed: int = 0) -> list[Array]:
    """``steps`` random ``[N, A]`` frames inside ``space`` (a single-env action space)."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        start, count = int(space.start), int(space.n)
        return [rng.integers(start, start + count, (num_slots, 1)) for _ in range(steps)]
    assert isinstance(space, gym.spaces.Box)
    low = np.asarray(space.low, dtype=np.float64).reshape(-1)
    high = np.asarray(space.high, dtype=np.float64).reshape(-1)
    dtype = cast("np.dtype[Any]", space.dtype)
    return [rng.uniform(low, high, (num_slots, low.size)).astype(dtype) for _ in range(steps)]


def env_action(space: Any, row: Array) -> Any:
    """What the bridge hands a single env for one ``[A]`` row."""
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(row[0])
    return row.astype(space.dtype).reshape(space.shape)


def _row(flat: dict[str, Array], reward: Any, terminated: Any, truncated: Any) -> Row:
    # a bare observation is flattened under "" and served as "state" or "image": compare the data
    observation = {key or "<bare>": np.ascontiguousarray(value).tobytes() for key, value in flat.items()}
    if len(observation) == 1:
        observation = {"<bare>": next(iter(observation.values()))}
    return (observation, float(reward), bool(terminated), bool(truncated))


def plain_single_envs(envs: list[Any], seeds: list[int], frames: list[Array]) -> Trajectory:
    """N independent envs, each stepped until its own episode ends."""
    trajectory: Trajectory = {}
    done = [False] * len(envs)
    for slot, env in enumerate(envs):
        observation, _ = env.reset(seed=seeds[slot])
        trajectory[(slot, -1)] = _row(flatten_observation(observation), 0.0, False, False)
    for step, frame in enumerate(frames):
        for slot, env in enumerate(envs):
            if done[slot]:
                continue
            observation, reward, terminated, truncated, _ = env.step(env_action(env.action_space, frame[slot]))
            trajectory[(slot, step)] = _row(flatten_observation(observation), reward, terminated, truncated)
            done[slot] = bool(terminated or truncated)
        if all(done):
            break
    return trajectory


def plain_vector_env(env: Any, seed: Any, frames: list[Array], options: Any = None) -> Trajectory:
    """One vector env; finished slots get their last action (the bridge's default hold) and are not recorded."""
    num_slots = int(env.num_envs)
    space = env.single_action_space
    trajectory: Trajectory = {}
    observation, _ = env.reset(seed=seed, options=options)
    flat = flatten_observation(observation)
    for slot in range(num_slots):
        trajectory[(slot, -1)] = _row({k: v[slot] for k, v in flat.items()}, 0.0, False, False)
    running: Array = np.ones(num_slots, dtype=np.bool_)
    last: Array = frames[0]
    for step, frame in enumerate(frames):
        applied = np.where(running[:, None], frame, last)
        last = applied
        batch = np.stack([env_action(space, row) for row in applied])
        observation, reward, terminated, truncated, _ = env.step(batch)
        flat = flatten_observation(observation)
        for slot in np.flatnonzero(running):
            trajectory[(slot, step)] = _row(
                {k: v[slot] for k, v in flat.items()}, reward[slot], terminated[slot], truncated[slot]
            )
        running = running & ~(np.asarray(terminated, dtype=np.bool_) | np.asarray(truncated, dtype=np.bool_))
        if not running.any():
            break
    return trajectory


def driven(
    reset: Callable[[list[dict[str, Any]]], Any],
    step: Callable[[Any], Any],
    tasks: list[dict[str, Any]],
    frames: list[Array],
) -> Trajectory:
    """The trajectory a bridge or a client produces (its finished slots' frozen rows are not recorded)."""
    trajectory: Trajectory = {}
    reply = reset(tasks)
    for slot in range(len(tasks)):
        trajectory[(slot, -1)] = _row({k: v[slot] for k, v in reply.observation.items()}, 0.0, False, False)
    for index, frame in enumerate(frames):
        running = [status == "running" for status in reply.status]
        if not any(running):
            break
        reply = step(frame)
        for slot in np.flatnonzero(running):
            trajectory[(slot, index)] = _row(
                {k: v[slot] for k, v in reply.observation.items()},
                reply.reward[slot],
                reply.terminated[slot],
                reply.truncated[slot],
            )
    return trajectory


def assert_same_trajectory(actual: Trajectory, expected: Trajectory) -> None:
    """Bit-identical observations and identical rewards and done flags, step by step."""
    assert actual.keys() == expected.keys(), f"steps differ: {sorted(set(actual) ^ set(expected))[:10]}"
    for key in sorted(expected):
        assert actual[key] == expected[key], f"slot {key[0]} differs at step {key[1]}"
