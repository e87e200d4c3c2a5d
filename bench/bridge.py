"""The sim side of a tick alone: ``GymBridge.step`` against the same envs stepped in a plain loop.

No wire and no second process: what the bridge adds around the envs on the sim's main thread (action
checks, writing each observation into the batch buffers against the contract, reading the reward, the
done flags and the success signal strictly, the slots' bookkeeping, NaN screening). Three sides, each
repeat timing them back to back so that they see the same machine load:

- ``in-process``: gymnasium's ``SyncVectorEnv`` (``gym.make_vec(..., vectorization_mode="sync")``)
  stepped in a plain loop: the baseline;
- ``per-slot``: the bridge over one ``gym.make`` env per slot, what a registry id with several slots
  is by default;
- ``sync``: the bridge over the baseline's ``SyncVectorEnv`` (``sim.args.vectorization_mode: sync``).

Pendulum-v1 (continuous torques) and MountainCar-v0 (a discrete push that never reaches the goal),
``max_episode_steps`` 10^6 on every side, so no episode ends and every tick steps N envs.

Usage: ``python bench/bridge.py [--repeats 5] [--quick]``. The last line printed is one JSON object
of ratios (throughput over the baseline's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hud_pipelines.sim.bridge import GymBridge  # noqa: E402

LONG_EPISODES = 10**6
ENVS = {"Pendulum-v1": (np.float32, 0.5), "MountainCar-v0": (np.int64, 1)}
"""Each env's action dtype and the constant action every slot gets."""


def _ticks_per_s(step: Callable[[], object], ticks: int) -> float:
    step()  # warm
    started = time.perf_counter()
    for _ in range(ticks):
        step()
    return ticks / (time.perf_counter() - started)


def _in_process(env_id: str, n: int, action: Any) -> Callable[[], object]:
    vector = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", max_episode_steps=LONG_EPISODES)
    vector.reset(seed=list(range(n)))
    flat = action.reshape(n) if np.issubdtype(action.dtype, np.integer) else action
    return lambda: vector.step(flat)


def _bridge(env_id: str, n: int, action: Any, *, sync: bool) -> tuple[GymBridge, Callable[[], object]]:
    args: dict[str, Any] = {"max_episode_steps": LONG_EPISODES} | ({"vectorization_mode": "sync"} if sync else {})
    bridge = GymBridge(env_id, n, build_args=args)
    bridge.start()
    bridge.reset([{"seed": slot} for slot in range(n)])
    return bridge, lambda: bridge.step(action, copy=False)


def measure(env_id: str, n: int, ticks: int) -> dict[str, float]:
    """Ticks per second of each side, one after the other."""
    dtype, value = ENVS[env_id]
    action = np.full((n, 1), value, dtype=dtype)
    rates = {"in-process": _ticks_per_s(_in_process(env_id, n, action), ticks)}
    for side, sync in (("per-slot", False), ("sync", True)):
        bridge, step = _bridge(env_id, n, action, sync=sync)
        try:
            rates[side] = _ticks_per_s(step, ticks)
        finally:
            bridge.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tenth of the ticks (a smoke run)")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, gymnasium {gym.__version__}, numpy {np.__version__}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{'env':<16}{'N':>4}{'in-process us':>15}{'per-slot us':>13}{'sync us':>10}"
        f"{'per-slot ratio':>16}{'sync ratio':>12}"
    )
    ratios: dict[str, float] = {}
    for env_id in ENVS:
        for n in (1, 8, 64):
            ticks = max(50, (20_000 // n) // (10 if args.quick else 1))
            runs = [measure(env_id, n, ticks) for _ in range(args.repeats)]
            us = {side: 1e6 / statistics.median(run[side] for run in runs) for side in runs[0]}
            per_slot = statistics.median(run["per-slot"] / run["in-process"] for run in runs)
            sync = statistics.median(run["sync"] / run["in-process"] for run in runs)
            key = env_id.split("-")[0].lower()
            ratios |= {f"per_slot_{key}_n{n}": round(per_slot, 3), f"sync_{key}_n{n}": round(sync, 3)}
            print(
                f"{env_id:<16}{n:>4}{us['in-process']:>15.1f}{us['per-slot']:>13.1f}{us['sync']:>10.1f}"
                f"{per_slot:>16.2f}{sync:>12.2f}"
            )
    print(json.dumps({"bench": "bridge", "ratios": ratios}))


if __name__ == "__main__":
    main()
