"""A sim across a network: the agent loop with and without pipelined steps, behind added latency.

A served sim on another machine costs one network round trip per step when every step waits for
the previous reply. With open-loop action chunks the next actions are known before the observation
arrives, so the agent sends up to ``send_ahead`` steps ahead (default 8; 0 waits for every reply)
and the sim steps while replies travel. This bench measures that on one machine: the sim child is
reached through a TCP proxy (its own process) that delays every chunk of bytes by half the added
round trip in each direction, like a network link with spare bandwidth.

For each env, added round trip (0 = direct loopback, no proxy) and send-ahead depth, the same
seeded random policy with chunks of ``--chunk`` actions runs the same episodes; the in-process
loop (``GymBridge`` in this process) is the baseline. The table reports env-steps/s, the ratio to
in-process and the measured round trip of a ``result`` request through the link.

    .venv/bin/python bench/remote.py                     # Pendulum N = 8 and PushT N = 4; RTT 0, 2, 10 ms
    .venv/bin/python bench/remote.py --rtt-ms 0 5 --chunk 50 --send-ahead 0 2

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Env:
    name: str
    factory: str
    num_envs: int
    build_args: dict[str, Any]


ENVS = {
    "pendulum": Env("Pendulum-v1 N=8", "Pendulum-v1", 8, {}),
    "pusht": Env("PushT N=4 (96x96 camera)", "gym_pusht/PushT-v0", 4, {"obs_type": "pixels_agent_pos"}),
}


# ---------------------------------------------------------------------------------------------
# the latency proxy (runs as its own process: ``bench/remote.py --proxy``)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Forward bytes, each chunk delivered ``delay_s`` after it was read; order is kept."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    delivering = asyncio.create_task(deliver())
    while data := await reader.read(1 << 20):
        queue.put_nowait((loop.time() + delay_s, data))
    queue.put_nowait((0.0, b""))
    await delivering


async def _proxy(listen_port: int, target_host: str, target_port: int, one_way_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(target_host, target_port)
        await asyncio.gather(
            _pipe(reader, upstream_writer, one_way_s),
            _pipe(upstream_reader, writer, one_way_s),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    async with server:
        await server.serve_forever()


class Link:
    """A proxy process between the agent and the sim, adding ``rtt_ms`` to every round trip."""

    def __init__(self, url: str, rtt_ms: float) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--proxy", parts.hostname, str(parts.port), str(rtt_ms / 2000.0)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        port = json.loads(self.process.stdout.readline())["port"]
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


# ---------------------------------------------------------------------------------------------
# the measurement


def rollouts(sim: Any, contract: Any, *, chunk: int, episodes: int, send_ahead: int, seed: int) -> tuple[int, float]:
    """Env-steps and seconds of ``episodes`` runs of every slot with a seeded chunked random policy."""
    from hud_pipelines.agent.builtin import RandomPolicy
    from hud_pipelines.agent.runner import RobotAgent

    agent = RobotAgent(RandomPolicy(contract, seed=seed, chunk_size=chunk), contract, send_ahead=send_ahead)
    steps = 0
    started = time.perf_counter()
    for episode in range(episodes):
        tasks = [{"seed": seed + episode * sim.num_envs + i} for i in range(sim.num_envs)]
        agent.run(sim, tasks, max_steps=1000, key=("bench", 0, episode))
        steps += agent.last_run.env_steps
    return steps, time.perf_counter() - started


def round_trip_ms(client: Any, samples: int = 20) -> float:
    times: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        client.result()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def measure(
    env: Env, rtts: list[float], depths: list[int], *, chunk: int, episodes: int, seed: int
) -> list[dict[str, Any]]:
    from hud_pipelines.sim.bridge import GymBridge
    from hud_pipelines.sim.process import SimProcess

    rows: list[dict[str, Any]] = []
    with GymBridge(env.factory, env.num_envs, build_args=env.build_args) as bridge:
        steps, seconds = rollouts(bridge, bridge.contract, chunk=chunk, episodes=episodes, send_ahead=0, seed=seed)
    baseline = steps / seconds
    rows.append({"env": env.name, "link": "in-process", "rtt_ms": 0.0, "send_ahead": None, "steps_per_s": baseline})
    with SimProcess.spawn(env.factory, num_envs=env.num_envs, build_args=env.build_args) as process:
        for rtt in rtts:
            link = Link(process.url, rtt) if rtt > 0 else None
            try:
                attached = SimProcess.attach(link.url, process.token) if link else process
                with attached.connect() as client:
                    client.reset([{"seed": seed}] * env.num_envs)
                    measured_rtt = round_trip_ms(client)
                    for send_ahead in depths:
                        steps, seconds = rollouts(
                            client, client.contract, chunk=chunk, episodes=episodes, send_ahead=send_ahead, seed=seed
                        )
                        rows.append(
                            {
                                "env": env.name,
                                "link": f"+{rtt:g} ms" if rtt > 0 else "loopback",
                                "rtt_ms": measured_rtt,
                                "send_ahead": send_ahead,
                                "steps_per_s": steps / seconds,
                            }
                        )
            finally:
                if link is not None:
                    link.close()
    for row in rows:
        row["vs_in_process"] = row["steps_per_s"] / baseline
    return rows


def print_table(rows: list[dict[str, Any]], chunk: int) -> None:
    print(f"chunks of {chunk} actions; round trip = median of a `result` request through the link")
    header = f"{'env':<26} {'link':<11} {'round trip':>10} {'send-ahead':>10} {'env-steps/s':>11} {'vs in-process':>13}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ahead = "-" if r["send_ahead"] is None else str(r["send_ahead"])
        print(
            f"{r['env']:<26} {r['link']:<11} {r['rtt_ms']:>8.2f}ms {ahead:>10} {r['steps_per_s']:>11.0f} "
            f"{r['vs_in_process']:>13.2f}"
        )


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":
        host, port, one_way = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        asyncio.run(_proxy(0, host, port, one_way))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", nargs="+", choices=sorted(ENVS), default=["pendulum", "pusht"])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 2.0, 10.0], help="added round trips")
    parser.add_argument(
        "--send-ahead", type=int, nargs="+", default=[0, 1, 2, 8], help="steps sent ahead (default 0 1 2 8)"
    )
    parser.add_argument("--chunk", type=int, default=20, help="actions per policy call (default 20)")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per slot and row (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows: list[dict[str, Any]] = []
    for name in args.env:
        rows += measure(
            ENVS[name], args.rtt_ms, args.send_ahead, chunk=args.chunk, episodes=args.episodes, seed=args.seed
        )
        print_table(rows, args.chunk)
        print(flush=True)
    gains = {
        f"{r['env']} {r['link']} send-ahead {r['send_ahead']}": r["steps_per_s"] / waiting["steps_per_s"]
        for r in rows
        if r["send_ahead"]
        for waiting in rows
        if waiting["env"] == r["env"] and waiting["link"] == r["link"] and waiting["send_ahead"] == 0
    }
    for label, gain in gains.items():
        print(f"{label}: {gain:.2f}x the env-steps/s of waiting for every reply")
    summary = {"bench": "remote", "chunk": args.chunk, "cpus": os.cpu_count(), "rows": rows, "gain_vs_waiting": gains}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
