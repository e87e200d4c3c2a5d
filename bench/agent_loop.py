"""The agent side of a tick alone: ``RobotAgent.run`` against the same rule driving the same bridge in a plain loop.

No wire and no second process: both sides step one in-process ``GymBridge`` (Pendulum-v1, one env per slot, as
a registry id is served) under the same scripted rule (``envs.controllers:PendulumSwingUp``) for the same episodes.
What ``RobotAgent`` adds around the rule and the sim is the difference: the policy batch and its random
streams, the action queues, the slots' counters, the episode ends, the sinks (none here). That work runs in the
agent's process on every tick whatever the transport, so it adds to a served round trip one for one at one step
in flight.

- ``plain``: ``bridge.reset`` then ``bridge.step(rule(observation))`` for 200 steps: the baseline;
- ``agent``: ``RobotAgent(scripted_policy(rule)).run(bridge, tasks, max_steps=200)``.

The sides alternate batch by batch over the same seeds; each side's figure is its fastest batch (another job
only ever slows a batch down), the median of that over the repeats, and ``own us`` is agent minus plain per tick.
The returns of both sides are checked equal (the same episodes).

Usage: ``python bench/agent_loop.py [--repeats 5] [--quick]``. The last line printed is one JSON object.
An older tree side by side: ``git worktree add /tmp/old <commit>``, copy this file (and ``bench/wire.py``) into its
``bench/`` and run that copy: it imports the tree it lies in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wire import machine  # noqa: E402 - bench/wire.py, beside this one

from hud_pipelines.agent.builtin import scripted_policy  # noqa: E402
from hud_pipelines.agent.runner import RobotAgent  # noqa: E402
from hud_pipelines.sim.bridge import GymBridge  # noqa: E402

ENV_ID = "Pendulum-v1"
RULE = "envs.controllers:PendulumSwingUp"
STEPS = 200


def _plain(bridge: GymBridge, rule: Any, seeds: list[int]) -> list[float]:
    observation = bridge.reset([{"seed": seed} for seed in seeds])
    total = np.zeros(len(seeds))
    for _ in range(STEPS):
        observation = bridge.step(rule(observation.observation))
        total += observation.reward
    return total.tolist()


def measure(n: int, batches: int, first_seed: int) -> dict[str, float]:
    """The fastest batch's seconds per tick of each side, over ``batches`` batches of ``n`` episodes, the sides
    alternating batch by batch (so both see the same load; a slower batch is another job's doing)."""
    bridge = GymBridge(ENV_ID, n)
    bridge.start()
    try:
        policy = scripted_policy(RULE, bridge.contract)
        rule = policy.fn  # the same callable object the agent calls
        agent = RobotAgent(policy, bridge.contract)
        seeds = [[first_seed + b * n + slot for slot in range(n)] for b in range(batches)]

        def agent_batch(index: int) -> list[float]:
            tasks = [{"seed": seed} for seed in seeds[index]]
            outcomes = agent.run(bridge, tasks, max_steps=STEPS, key=("bench", index, 0))
            return [o.total_reward for o in outcomes]

        sides = {"plain": lambda b: _plain(bridge, rule, seeds[b]), "agent": agent_batch}
        for run in sides.values():  # warm both
            run(0)
        seconds = {side: float("inf") for side in sides}
        for b in range(batches):
            returns: dict[str, list[float]] = {}
            for side, run in sides.items():
                started = time.perf_counter()
                returns[side] = run(b)
                seconds[side] = min(seconds[side], (time.perf_counter() - started) / STEPS)
            if returns["plain"] != returns["agent"]:
                raise SystemExit(f"N = {n}: the two sides ran different episodes")
        return seconds
    finally:
        bridge.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a quarter of the batches (a smoke run)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"{'N':>4}{'plain us/tick':>15}{'agent us/tick':>15}{'own us/tick':>13}{'plain/agent':>13}")
    figures: dict[str, float] = {}
    for n in (1, 8, 32):
        batches = max(2, max(6, 64 // n) // (4 if args.quick else 1))
        runs = [measure(n, batches, 1000) for _ in range(args.repeats)]
        plain = statistics.median(run["plain"] for run in runs) * 1e6
        agent = statistics.median(run["agent"] for run in runs) * 1e6
        own = statistics.median(run["agent"] - run["plain"] for run in runs) * 1e6
        ratio = statistics.median(run["plain"] / run["agent"] for run in runs)
        figures |= {f"own_us_n{n}": round(own, 1), f"plain_vs_agent_n{n}": round(ratio, 3)}
        print(f"{n:>4}{plain:>15.1f}{agent:>15.1f}{own:>13.1f}{ratio:>13.2f}")
    print(json.dumps({"bench": "agent_loop", "figures": figures}))


if __name__ == "__main__":
    main()
