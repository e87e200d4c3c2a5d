"""Sharded served sims (``sim.shards``) vs one served sim vs in-process, side by side in one run.

Two questions, each answered by ratios measured back to back within one repeat (so every side sees
the same machine load):

- cheap sims (CartPole, Pendulum) at N = 64: does splitting the batch over K = 2 children win back
  the served sim's fixed per-frame cost? In-process is a ``SyncVectorEnv`` of the 64 envs stepped in a
  plain loop; served is ``SimProcess.spawn`` (K = 1) or ``ShardedProcess.spawn`` (K = 2) stepped
  through the client, one step in flight (closed loop: CartPole's action is computed from the
  observation), plus Pendulum with two steps sent ahead (open loop, as an action chunk is);
- a costly sim (each step costs ``--cost-ms``, 5 ms by default) at N = 4: how much faster are
  K = 2 and K = 4 children than one, whose slots step one after the other? Twice: a step that
  spins this machine's CPU (physics on the CPU: bounded by free cores), and one that sleeps (a sim
  that waits on a GPU or a renderer: bounded by nothing here, so it shows the parallel structure
  whatever the load).

The table reports medians over repeats; the last line printed is one JSON object of the ratios.

Usage: ``python bench/shards.py [--repeats 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wire import machine  # noqa: E402 - bench/wire.py, beside this one

from hud_pipelines.sim.client import SimClient  # noqa: E402
from hud_pipelines.sim.process import SimProcess  # noqa: E402
from hud_pipelines.sim.sharded_sim import ShardedSim  # noqa: E402
from hud_pipelines.sim.shards import ShardedProcess  # noqa: E402

COSTLY = f"{Path(__file__).resolve()}:costly"
LONG_EPISODES = 10**6
Array = npt.NDArray[Any]
Policy = Callable[[int, Array], Array]


class CostlyEnv(gym.Env[npt.NDArray[np.float32], npt.NDArray[np.float32]]):
    """A costly sim: every step spins the CPU (or sleeps, ``sleep=True``) for ``cost_ms``; never ends."""

    metadata: dict[str, Any] = {}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(self, cost_ms: float = 5.0, sleep: bool = False) -> None:
        self.cost_s = cost_ms / 1000
        self.sleep = sleep
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Array, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, seed or 0], dtype=np.float32), {}

    def step(self, action: Array) -> tuple[Array, float, bool, bool, dict[str, Any]]:
        if self.sleep:
            time.sleep(self.cost_s)
        until = time.perf_counter() + self.cost_s
        while not self.sleep and time.perf_counter() < until:
            pass
        self.t += 1
        return np.array([self.t, float(np.asarray(action).reshape(-1)[0])], dtype=np.float32), 1.0, False, False, {}


def costly(cost_ms: float = 5.0, sleep: bool = False) -> CostlyEnv:
    """The factory the sim children load by path (``bench/shards.py:costly``)."""
    return CostlyEnv(cost_ms, sleep)


@dataclass(frozen=True)
class Cheap:
    name: str
    factory: str
    steps: int
    ahead: int = 0
    num_envs: int = 64

    @property
    def key(self) -> str:
        return f"{self.name}_n{self.num_envs}" + (f"_ahead{self.ahead}" if self.ahead else "")


def policy_for(name: str, num_envs: int, steps: int) -> Policy:
    """CartPole balances by a linear rule on the observation; the others replay random torques."""
    if name == "cartpole":

        def balance(step: int, state: Array) -> Array:
            push = 10 * state[:, 2] + 2 * state[:, 3] + 0.5 * state[:, 0] + state[:, 1]
            return (push > 0).astype(np.int64).reshape(-1, 1)

        return balance
    table = np.random.default_rng(0).uniform(-1.0, 1.0, (steps, num_envs, 1)).astype(np.float32)
    return lambda step, state: table[step % steps]


def time_in_process(config: Cheap, policy: Policy) -> float:
    """Env-steps per second of a plain loop over a ``SyncVectorEnv`` of the same envs."""
    env = gym.make_vec(
        config.factory, num_envs=config.num_envs, vectorization_mode="sync", max_episode_steps=LONG_EPISODES
    )
    try:
        observation, _ = env.reset(seed=0)
        shape = (config.num_envs, *(env.single_action_space.shape or ()))
        for step in range(10):
            observation, *_ = env.step(policy(step, observation).reshape(shape))
        started = time.perf_counter()
        for step in range(config.steps):
            observation, *_ = env.step(policy(step, observation).reshape(shape))
        return config.steps * config.num_envs / (time.perf_counter() - started)
    finally:
        env.close()


def time_served(sim: SimClient | ShardedSim, steps: int, policy: Policy, ahead: int) -> float:
    """Env-steps per second through the client; ``ahead`` steps are sent before their turn (open loop)."""
    tasks = [{"seed": slot} for slot in range(sim.num_envs)]
    reply = sim.reset(tasks)
    for step in range(10):
        reply = sim.step(policy(step, reply.observation["state"]))
    state = reply.observation["state"]
    started = time.perf_counter()
    if ahead:
        pending = collections.deque(sim.send_step(policy(step, state)) for step in range(ahead))
        for step in range(steps):
            if step + ahead < steps:
                pending.append(sim.send_step(policy(step + ahead, state)))
            sim.receive_step(pending.popleft())
    else:
        for step in range(steps):
            reply = sim.step(policy(step, reply.observation["state"]))
    return steps * sim.num_envs / (time.perf_counter() - started)


def spawn(factory: str, num_envs: int, shards: int, build_args: dict[str, Any]) -> SimProcess | ShardedProcess:
    if shards == 1:
        return SimProcess.spawn(factory, num_envs=num_envs, build_args=build_args)
    return ShardedProcess.spawn(factory, num_envs=num_envs, shards=shards, build_args=build_args)


@dataclass
class CheapRow:
    config: Cheap
    in_process: float
    served: dict[int, float]
    ratios: dict[int, float]
    """Served (K children) / in-process, median over repeats."""


def measure_cheap(config: Cheap, repeats: int) -> CheapRow:
    policy = policy_for(config.name, config.num_envs, config.steps)
    args = {"vectorization_mode": "sync", "max_episode_steps": LONG_EPISODES}
    processes = {k: spawn(config.factory, config.num_envs, k, args) for k in (1, 2)}
    try:
        clients = {k: p.connect() for k, p in processes.items()}
        local: list[float] = []
        served: dict[int, list[float]] = {1: [], 2: []}
        ratios: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeats):
            local.append(time_in_process(config, policy))
            for k, client in clients.items():
                served[k].append(time_served(client, config.steps, policy, config.ahead))
                ratios[k].append(served[k][-1] / local[-1])
        for client in clients.values():
            client.close()
    finally:
        for process in processes.values():
            process.close()
    median = statistics.median
    return CheapRow(
        config, median(local), {k: median(v) for k, v in served.items()}, {k: median(v) for k, v in ratios.items()}
    )


@dataclass
class CostlyRow:
    shards: int
    rate: float
    ratio: float
    """Env-steps/s of K children / of one, median over repeats."""


def measure_costly(cost_ms: float, sleep: bool, steps: int, repeats: int) -> list[CostlyRow]:
    num_envs = 4
    policy = policy_for("costly", num_envs, steps)
    counts = (1, 2, 4)
    processes = {k: spawn(COSTLY, num_envs, k, {"cost_ms": cost_ms, "sleep": sleep}) for k in counts}
    try:
        clients = {k: p.connect() for k, p in processes.items()}
        rates: dict[int, list[float]] = {k: [] for k in counts}
        ratios: dict[int, list[float]] = {k: [] for k in counts}
        for _ in range(repeats):
            for k, client in clients.items():
                rates[k].append(time_served(client, steps, policy, 0))
            for k in counts:
                ratios[k].append(rates[k][-1] / rates[1][-1])
        for client in clients.values():
            client.close()
    finally:
        for process in processes.values():
            process.close()
    median = statistics.median
    return [CostlyRow(k, median(rates[k]), median(ratios[k])) for k in counts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of the steps (a smoke run)")
    parser.add_argument("--cost-ms", type=float, default=5.0, help="CPU time of one step of the costly sim")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    cheap_steps = max(50, int(1200 * scale))
    cheap = [
        Cheap("cartpole", "CartPole-v1", cheap_steps),
        Cheap("pendulum", "Pendulum-v1", cheap_steps),
        Cheap("pendulum", "Pendulum-v1", cheap_steps, ahead=2),
    ]
    print(f"machine: {machine()}")
    header = (
        f"{'sim':<22} {'in-process/s':>13} {'K=1 served/s':>13} {'K=2 served/s':>13} {'K=1 ratio':>10} "
        f"{'K=2 ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    summary: dict[str, Any] = {"machine": machine()}
    for config in cheap:
        row = measure_cheap(config, args.repeats)
        print(
            f"{config.key:<22} {row.in_process:>13,.0f} {row.served[1]:>13,.0f} {row.served[2]:>13,.0f} "
            f"{row.ratios[1]:>10.2f} {row.ratios[2]:>10.2f}"
        )
        summary[f"{config.key}_k1_vs_in_process"] = round(row.ratios[1], 3)
        summary[f"{config.key}_k2_vs_in_process"] = round(row.ratios[2], 3)
    costly_steps = max(40, int(400 * scale))
    for sleep, kind in ((False, "spin"), (True, "sleep")):
        print(f"\ncostly sim ({kind}): {args.cost_ms:g} ms per slot-step, N = 4, {costly_steps} steps")
        print(f"{'shards':>6} {'env-steps/s':>12} {'vs K=1':>8}")
        for row in measure_costly(args.cost_ms, sleep, costly_steps, args.repeats):
            print(f"{row.shards:>6} {row.rate:>12,.1f} {row.ratio:>8.2f}")
            summary[f"costly_{kind}_n4_k{row.shards}_vs_k1"] = round(row.ratio, 3)
    summary["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
