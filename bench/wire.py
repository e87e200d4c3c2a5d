"""Served vs in-process stepping, side by side in one run; and spawn-to-first-observation.

For each sim and batch size the same env code runs twice with the same vectorization:

- in-process: a ``SyncVectorEnv`` stepped in a plain loop (the baseline);
- served: the same sim in a child process (``SimProcess.spawn``), stepped over the wire with
  batched framing through ``SimClient`` (registry ids get ``vectorization_mode="sync"``, the camera
  sim's factory builds a ``SyncVectorEnv`` itself).

Each repeat times the in-process loop and then the served loop back to back and records their ratio
(served throughput / in-process throughput), so both see the same machine load; the table reports
medians over repeats, the median round trip of one served frame, and the CPU time per env-step of
the in-process loop and of both served processes together (the served overhead in CPU, which is
what counts on a machine whose cores are busy with other work). ``own us/tick`` is the Python work
the process shape adds per tick without its transport: the same loop through the real client and
server sessions, codec and bridge in this process (``SimClient.in_process``) minus the plain loop.
``TCP trip ms`` is the served loop's round trip through the same child by its URL (loopback TCP)
rather than its local socket (what a spawned sim's clients use on Linux), in the same repeat.

CartPole is driven by a balancing rule computed from the observation on both sides (so episodes do
not end at once); Pendulum and the camera sim get the same random torques.

Usage: ``python bench/wire.py [--repeats 5] [--quick]``. The last line printed is one JSON object.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envs.camera_pendulum import camera_pendulum  # noqa: E402
from hud_pipelines.sim.bridge import GymBridge  # noqa: E402
from hud_pipelines.sim.client import SimClient  # noqa: E402
from hud_pipelines.sim.process import SimProcess  # noqa: E402
from hud_pipelines.wire.messages import Framing  # noqa: E402

CAMERA = f"{REPO / 'envs' / 'camera_pendulum.py'}:camera_pendulum"
LONG_EPISODES = 10**6
Array = npt.NDArray[Any]


@dataclass(frozen=True)
class Config:
    name: str
    factory: str
    num_envs: int
    steps: int
    camera: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}_n{self.num_envs}"

    def build_args(self) -> dict[str, Any]:
        if self.camera:
            return {"max_episode_steps": LONG_EPISODES}
        return {"vectorization_mode": "sync", "max_episode_steps": LONG_EPISODES}

    def in_process(self) -> Any:
        if self.camera:
            return camera_pendulum(num_envs=self.num_envs, max_episode_steps=LONG_EPISODES)
        return gym.make_vec(
            self.factory, num_envs=self.num_envs, vectorization_mode="sync", max_episode_steps=LONG_EPISODES
        )


def configs(quick: bool) -> list[Config]:
    scale = 0.25 if quick else 1.0

    def steps(count: int) -> int:
        return max(20, int(count * scale))

    return [
        Config("cartpole", "CartPole-v1", 1, steps(2000)),
        Config("cartpole", "CartPole-v1", 8, steps(1500)),
        Config("cartpole", "CartPole-v1", 64, steps(400)),
        Config("pendulum", "Pendulum-v1", 1, steps(2000)),
        Config("pendulum", "Pendulum-v1", 8, steps(1500)),
        Config("pendulum", "Pendulum-v1", 64, steps(400)),
        Config("camera", CAMERA, 8, steps(300), camera=True),
        Config("camera", CAMERA, 64, steps(60), camera=True),
    ]


def policy_for(config: Config, space: gym.Space[Any]) -> Callable[[int, Array], Array]:
    """The same action rule for both sides: CartPole balances, the others replay random torques."""
    if config.name == "cartpole":

        def balance(step: int, state: Array) -> Array:
            push = 10 * state[:, 2] + 2 * state[:, 3] + 0.5 * state[:, 0] + state[:, 1]
            return (push > 0).astype(np.int64).reshape(-1, 1)

        return balance
    assert isinstance(space, gym.spaces.Box)
    rng = np.random.default_rng(0)
    low = float(np.asarray(space.low, dtype=np.float64).min())
    high = float(np.asarray(space.high, dtype=np.float64).max())
    table = rng.uniform(low, high, (config.steps, config.num_envs, 1)).astype(np.float32)
    return lambda step, state: table[step % config.steps]


def state_of(observation: Any) -> Array:
    return cast(Array, observation["state"] if isinstance(observation, dict) else observation)


def time_in_process(env: Any, config: Config, policy: Callable[[int, Array], Array]) -> tuple[float, float]:
    """Env-steps per second of a plain loop over a ``SyncVectorEnv``, and CPU microseconds per env-step."""
    observation, _ = env.reset(seed=0)
    for step in range(10):
        observation, *_ = env.step(policy(step, state_of(observation)).reshape(config.num_envs, *_action_shape(env)))
    cpu = time.process_time()
    started = time.perf_counter()
    for step in range(config.steps):
        action = policy(step, state_of(observation)).reshape(config.num_envs, *_action_shape(env))
        observation, *_ = env.step(action)
    env_steps = config.steps * config.num_envs
    return env_steps / (time.perf_counter() - started), (time.process_time() - cpu) / env_steps * 1e6


def _action_shape(env: Any) -> tuple[int, ...]:
    return tuple(env.single_action_space.shape)


def child_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_served(
    sim: SimProcess, config: Config, policy: Callable[[int, Array], Array], *, tcp: bool = False
) -> tuple[float, float, float]:
    """Env-steps per second through the wire, the median round trip of one frame (ms), and the CPU
    microseconds per env-step of both processes together; ``tcp``: by the sim's URL, not its local socket."""
    tasks = [{"seed": slot} for slot in range(config.num_envs)]
    by = SimProcess.attach(sim.url, sim.token) if tcp else sim
    with by.connect(framing=Framing.BATCHED) as client:
        reply = client.reset(tasks)
        for step in range(10):
            reply = client.step(policy(step, reply.observation["state"]))
        trips: list[float] = []
        cpu = time.process_time() + child_cpu_s(sim.pid)
        started = time.perf_counter()
        for step in range(config.steps):
            if "running" not in reply.status:
                reply = client.reset(tasks)
            sent = time.perf_counter()
            reply = client.step(policy(step, reply.observation["state"]))
            trips.append(time.perf_counter() - sent)
        elapsed = time.perf_counter() - started
        used = time.process_time() + child_cpu_s(sim.pid) - cpu
    env_steps = config.steps * config.num_envs
    return env_steps / elapsed, statistics.median(trips) * 1000, used / env_steps * 1e6


def time_own_work(config: Config, policy: Callable[[int, Array], Array]) -> float:
    """Microseconds per tick of the same loop through the wire in this process: the real client and
    server sessions, codec and bridge over ``SimClient.in_process`` (no socket, no second process).
    Minus the in-process loop's time per tick, it is the Python work the process shape adds, without
    the transport and the wake-ups."""
    bridge = GymBridge(config.factory, config.num_envs, build_args=config.build_args())
    bridge.start()
    tasks = [{"seed": slot} for slot in range(config.num_envs)]
    try:
        client = SimClient.in_process(bridge)
        reply = client.reset(tasks)
        for step in range(10):
            reply = client.step(policy(step, reply.observation["state"]))
        started = time.perf_counter()
        for step in range(config.steps):
            if "running" not in reply.status:
                reply = client.reset(tasks)
            reply = client.step(policy(step, reply.observation["state"]))
        return (time.perf_counter() - started) / config.steps * 1e6
    finally:
        bridge.close()


@dataclass
class Row:
    config: Config
    in_process: float
    served: float
    ratio: float
    trip_ms: float
    cpu_in_process_us: float
    cpu_served_us: float
    own_work_us: float
    """Per tick: the in-process wire loop minus the plain loop (see :func:`time_own_work`)."""
    trip_tcp_ms: float
    """The served round trip by the sim's URL (loopback TCP) instead of its local socket."""


def measure(config: Config, repeats: int) -> Row:
    env = config.in_process()
    policy = policy_for(config, env.single_action_space)
    sim = SimProcess.spawn(config.factory, num_envs=config.num_envs, build_args=config.build_args())
    try:
        local: list[float] = []
        served: list[float] = []
        ratios: list[float] = []
        trips: list[float] = []
        cpu_local: list[float] = []
        cpu_served: list[float] = []
        own: list[float] = []
        trips_tcp: list[float] = []
        for _ in range(repeats):
            rate, cpu = time_in_process(env, config, policy)
            local.append(rate)
            cpu_local.append(cpu)
            own.append(time_own_work(config, policy) - config.num_envs / rate * 1e6)
            rate, trip, cpu = time_served(sim, config, policy)
            served.append(rate)
            trips.append(trip)
            cpu_served.append(cpu)
            ratios.append(served[-1] / local[-1])
            trips_tcp.append(time_served(sim, config, policy, tcp=True)[1])
    finally:
        sim.close()
        env.close()
    median = statistics.median
    return Row(
        config,
        median(local),
        median(served),
        median(ratios),
        median(trips),
        median(cpu_local),
        median(cpu_served),
        median(own),
        median(trips_tcp),
    )


def spawn_to_first_observation(repeats: int) -> list[float]:
    """Seconds from ``SimProcess.spawn`` to the first observation of a reset, for CartPole-v1."""
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        sim = SimProcess.spawn("CartPole-v1")
        try:
            with sim.connect() as client:
                client.reset({"seed": 0})
                times.append(time.perf_counter() - started)
        finally:
            sim.close()
    return times


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, "
        f"gymnasium {gym.__version__}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a quarter of the steps (a smoke run)")
    parser.add_argument("--only", default=None, help="run only configs whose key contains this text")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    rows: list[Row] = []
    header = (
        f"{'sim':<10}{'N':>4}{'camera':>8}{'in-process/s':>15}{'served/s':>12}{'ratio':>8}{'round trip ms':>15}"
        f"{'CPU us/step':>13}{'served CPU':>12}{'own us/tick':>13}{'TCP trip ms':>13}"
    )
    print(header)
    print("-" * len(header))
    for config in configs(args.quick):
        if args.only and args.only not in config.key:
            continue
        row = measure(config, args.repeats)
        rows.append(row)
        camera = "96x96x3" if config.camera else "-"
        print(
            f"{config.name:<10}{config.num_envs:>4}{camera:>8}{row.in_process:>15,.0f}{row.served:>12,.0f}"
            f"{row.ratio:>8.2f}{row.trip_ms:>15.2f}{row.cpu_in_process_us:>13.1f}{row.cpu_served_us:>12.1f}"
            f"{row.own_work_us:>13.1f}{row.trip_tcp_ms:>13.2f}",
            flush=True,
        )
    spawn_times = [] if args.only else spawn_to_first_observation(args.repeats)
    if spawn_times:
        print(
            f"spawn to first observation (CartPole-v1): median {statistics.median(spawn_times):.2f} s "
            f"(runs: {', '.join(f'{t:.2f}' for t in spawn_times)})"
        )
    summary: dict[str, Any] = {f"ratio_{row.config.key}": round(row.ratio, 3) for row in rows}
    summary |= {f"own_work_us_{row.config.key}": round(row.own_work_us, 1) for row in rows}
    summary |= {f"trip_ms_{row.config.key}": round(row.trip_ms, 3) for row in rows}
    summary |= {f"trip_tcp_ms_{row.config.key}": round(row.trip_tcp_ms, 3) for row in rows}
    if spawn_times:
        summary["spawn_to_first_observation_s"] = round(statistics.median(spawn_times), 3)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
