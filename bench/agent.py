"""Agent-side benchmark: random ACT on PushT, hud-pipelines' agent loop beside ``lerobot-eval``.

Both sides evaluate the same pretrained folder (random ACT weights, saved once with lerobot's own
``save_pretrained``) on ``gym_pusht/PushT-v0`` (96x96 pixels + agent position, 300-step limit), with
the same episode count, the same seeds (``seed + batch * N + i``, lerobot-eval's scheme), the same
number of envs stepped together (N) and no video on either side. Each side runs as its own
subprocess so that both pay their own start-up (imports, policy load, env build):

- ``ours``: the N slots served by K sim child processes (``SimProcess``, K = ``--sims``, default
  one per core, at most N), one ``RobotAgent`` thread per child, all sharing one ``BatchedModel``
  (the shape of an eval with ``group = K``), so env stepping runs on every core while the agent
  waits and every refill tick is still one forward over all N rows; the ACT folder is loaded with
  ``LeRobotPolicy.from_pretrained``; one trace per episode (``--no-traces`` to skip).
  ``--single-sim`` adds a row ``ours/1`` with all N slots in one child.
- ``lerobot-eval``: ``.venv/bin/lerobot-eval`` with ``--eval.batch_size=N``. lerobot 0.6.1 renders
  preview videos unless it records datasets, and no flag turns that off, so a ``sitecustomize``
  on its ``PYTHONPATH`` passes ``max_episodes_rendered=0`` to its ``eval_policy_all``; the same
  shim counts ACT forwards and vector-env steps. ``--stock`` adds a run of the untouched CLI.

Figures: policy forwards per env-step, env-steps/s during the rollouts (``eval``), episodes/s end
to end (subprocess wall time) and CPU seconds of each side's whole process tree (steadier than wall
time on a shared machine). Prints a table and, last, one JSON line.

    .venv/bin/python bench/agent.py                      # N = 1, 8, 32
    .venv/bin/python bench/agent.py --n 8 --repeat 2     # the target comparison, best of two runs
    .venv/bin/python bench/agent.py --n 8 --single-sim   # also all N slots in one sim child
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from hud_pipelines.spec.agent import DEFAULT_SEND_AHEAD

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
LEROBOT_EVAL = ROOT / ".venv" / "bin" / "lerobot-eval"
PUSHT = "gym_pusht/PushT-v0"
PUSHT_ARGS = {"obs_type": "pixels_agent_pos"}
MAX_STEPS = 300
TARGET_N = 8
TARGET_RATIO = 2.0
"""End-to-end episodes/s ours / lerobot-eval at N = 8 that the work aims at (the env alone caps it: ``--floor``)."""

SITECUSTOMIZE = textwrap.dedent(
    '''
    """Benchmark shim for lerobot-eval: no preview videos, count ACT forwards and env steps."""
    import atexit, json, os

    import gymnasium as gym
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.scripts import lerobot_eval

    _counts = {"forwards": 0, "forward_rows": 0, "env_steps": 0}
    _predict = ACTPolicy.predict_action_chunk
    _step = gym.vector.SyncVectorEnv.step
    _eval_all = lerobot_eval.eval_policy_all

    def _counted_predict(self, batch):
        _counts["forwards"] += 1
        _counts["forward_rows"] += int(batch["observation.state"].shape[0])
        return _predict(self, batch)

    def _counted_step(self, actions):
        _counts["env_steps"] += self.num_envs
        return _step(self, actions)

    def _no_video(*args, **kwargs):
        if os.environ.get("BENCH_NO_VIDEO") == "1":
            kwargs["max_episodes_rendered"] = 0
            kwargs["videos_dir"] = None
        return _eval_all(*args, **kwargs)

    ACTPolicy.predict_action_chunk = _counted_predict
    gym.vector.SyncVectorEnv.step = _counted_step
    lerobot_eval.eval_policy_all = _no_video

    @atexit.register
    def _write():
        with open(os.environ["BENCH_COUNTS"], "w") as f:
            json.dump(_counts, f)
    '''
)


# ---------------------------------------------------------------------------------------------
# the shared policy folder


def make_policy_folder(path: Path) -> Path:
    """Random ACT shaped by the PushT contract, saved in lerobot's layout.

    The camera is declared as ``observation.image`` because that is the key lerobot-eval's PushT
    env config produces; our adapter maps the contract's single camera onto it.
    """
    from hud_pipelines.agent.lerobot import LeRobotPolicy
    from hud_pipelines.sim.bridge import GymBridge

    with GymBridge(PUSHT, build_args=PUSHT_ARGS) as bridge:
        contract = bridge.contract
    policy = LeRobotPolicy.random("act", contract, device="cpu", rename={"pixels": "observation.image"})
    return policy.save_pretrained(path)


# ---------------------------------------------------------------------------------------------
# our side (runs in its own process: ``bench/agent.py --worker``)


def worker(args: argparse.Namespace) -> None:
    """Spawn the sims first (their start-up overlaps our imports), then roll out every episode."""
    started = time.perf_counter()
    from hud_pipelines.sim.process import SimProcess

    sizes = split(args.n, args.sims)
    processes: list[Any] = [None] * len(sizes)

    def spawn(index: int) -> None:
        processes[index] = SimProcess.spawn(PUSHT, num_envs=sizes[index], build_args=PUSHT_ARGS)

    spawners = [threading.Thread(target=spawn, args=(i,)) for i in range(len(sizes))]
    for thread in spawners:
        thread.start()
    from hud_pipelines.agent.batching import BatchedModel
    from hud_pipelines.agent.lerobot import LeRobotPolicy
    from hud_pipelines.agent.runner import RobotAgent
    from hud_pipelines.agent.torch_runtime import configure_threads
    from hud_pipelines.recording.traces import TraceRecorder

    configure_threads(args.torch_threads)
    imported = time.perf_counter()
    for thread in spawners:
        thread.join()
    spawned = time.perf_counter()
    clients = [p.connect() for p in processes]
    try:
        contract = clients[0].contract
        policy = LeRobotPolicy.from_pretrained(Path(args.policy), contract, device=args.device)
        policy.lockstep_threads = lockstep_setting(args.lockstep_threads)
        loaded = time.perf_counter()
        model = BatchedModel(policy, max_wait_s=2.0, expected_callers=len(clients))
        agents = [RobotAgent(model, contract, send_ahead=args.send_ahead) for _ in clients]
        recorder = TraceRecorder(Path(args.traces), contract) if args.traces else None
        sinks = [recorder] if recorder is not None else []
        batches = math.ceil(args.episodes / args.n)
        outcomes: list[Any] = []
        lock = threading.Lock()
        ready = time.perf_counter()

        def drive(index: int) -> None:
            offset = sum(sizes[:index])
            try:
                for batch in range(batches):
                    seeds = [args.seed + batch * args.n + offset + i for i in range(sizes[index])]
                    done = agents[index].run(
                        clients[index],
                        [{"seed": s} for s in seeds],
                        max_steps=MAX_STEPS,
                        key=("bench", batch, index),
                        sinks=sinks,
                    )
                    with lock:
                        outcomes.extend(done)
            finally:
                model.leave()

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        eval_s = time.perf_counter() - ready
        model.close()
        if recorder is not None:
            recorder.close()
    finally:
        for client in clients:
            client.close()
        for process in processes:
            process.terminate()  # all children wind down together, as an eval's pool does
        for process in processes:
            process.close()
    result = {
        "episodes": len(outcomes),
        "env_steps": sum(o.steps for o in outcomes),
        "forwards": model.stats.forwards.count,
        "forward_rows": model.stats.forwards.rows,
        "eval_s": eval_s,
        "startup_s": ready - started,
        "startup_phases_s": {
            "imports": imported - started,
            "sims_ready": spawned - started,
            "policy_loaded": loaded - started,
        },
        "avg_sum_reward": sum(o.total_reward for o in outcomes) / len(outcomes),
        "pc_success": 100.0 * sum(o.success for o in outcomes) / len(outcomes),
        "errored": sum(o.status == "errored" for o in outcomes),
        "timer_flushes": model.stats.timer_flushes,
        "forward_s": model.stats.forwards.seconds,
        "sent_ahead": sum(a.last_run.sent_ahead for a in agents),
    }
    Path(args.out).write_text(json.dumps(result))


def lockstep_setting(text: str) -> int | str | None:
    """``--lockstep-threads`` as the policy setting: ``auto``, a count, or ``none``."""
    return None if text == "none" else text if text == "auto" else int(text)


def split(n: int, sims: int) -> list[int]:
    """Split ``n`` slots over ``sims`` children as evenly as possible."""
    sims = max(1, min(sims, n))
    return [n // sims + (1 if i < n % sims else 0) for i in range(sims)]


def run_ours(
    n: int,
    episodes: int,
    folder: Path,
    work: Path,
    *,
    sims: int,
    seed: int,
    device: str,
    traces: bool,
    torch_threads: int = 1,
    send_ahead: int = DEFAULT_SEND_AHEAD,
    lockstep_threads: str = "auto",
) -> dict[str, Any]:
    out = work / f"ours_{n}_{sims}.json"
    command = [
        str(PYTHON),
        str(Path(__file__).resolve()),
        "--worker",
        "--n",
        str(n),
        "--episodes",
        str(episodes),
        "--policy",
        str(folder),
        "--sims",
        str(sims),
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--device",
        device,
        "--torch-threads",
        str(torch_threads),
    ]
    if traces:
        command += ["--traces", str(work / f"traces_{n}_{sims}")]
    command += ["--send-ahead", str(send_ahead), "--lockstep-threads", lockstep_threads]
    wall, cpu = timed(command, env=os.environ.copy())
    result = json.loads(out.read_text())
    result["wall_s"] = wall
    result["cpu_s"] = cpu
    return result


# ---------------------------------------------------------------------------------------------
# lerobot-eval


def run_lerobot(
    n: int, episodes: int, folder: Path, work: Path, *, seed: int, device: str, stock: bool
) -> dict[str, Any]:
    tag = "stock" if stock else "novideo"
    output = work / f"lerobot_{n}_{tag}"
    command = [
        str(LEROBOT_EVAL),
        f"--policy.path={folder}",
        f"--policy.device={device}",
        "--env.type=pusht",
        "--env.observation_height=96",
        "--env.observation_width=96",
        f"--eval.batch_size={n}",
        f"--eval.n_episodes={episodes}",
        "--eval.use_async_envs=false",
        f"--seed={seed}",
        f"--output_dir={output}",
    ]
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)  # lerobot-eval only creates it when it writes videos
    env = os.environ.copy()
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    counts = work / f"counts_{n}_{tag}.json"
    env.update(
        PYTHONPATH=os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        BENCH_COUNTS=str(counts),
        BENCH_NO_VIDEO="0" if stock else "1",
    )
    wall, cpu = timed(command, env=env)
    info = json.loads((output / "eval_info.json").read_text())
    aggregated = info["overall"] if "overall" in info else info["aggregated"]
    counted = json.loads(counts.read_text())
    return {
        "episodes": episodes,
        "env_steps": counted["env_steps"],
        "forwards": counted["forwards"],
        "forward_rows": counted["forward_rows"],
        "eval_s": float(aggregated["eval_s"]),
        "avg_sum_reward": float(aggregated["avg_sum_reward"]),
        "pc_success": float(aggregated["pc_success"]),
        "videos": len(list(output.rglob("*.mp4"))),
        "wall_s": wall,
        "cpu_s": cpu,
    }


# ---------------------------------------------------------------------------------------------
# the env alone: the floor any agent pays on these cores

ENV_ALONE = textwrap.dedent(
    """
    import json, sys, time
    import gymnasium as gym
    import gym_pusht  # noqa: F401  (registers PushT)
    import numpy as np
    n, episodes, seed, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    envs = [gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos") for _ in range(n)]
    rng = np.random.default_rng(seed)
    steps, env_cpu = 0, 0.0
    for batch in range(episodes // n):
        started = time.process_time()
        for i, env in enumerate(envs):
            env.reset(seed=seed + batch * n + i)
        running = [True] * n
        for _ in range(300):
            for i, env in enumerate(envs):
                if running[i]:
                    _, _, terminated, truncated, _ = env.step(rng.uniform(0, 512, 2))
                    steps += 1
                    running[i] = not (terminated or truncated)
        env_cpu += time.process_time() - started
    json.dump({"env_steps": steps, "env_cpu_s": env_cpu}, open(out, "w"))
    """
)


def run_env_alone(n: int, episodes: int, work: Path, *, seed: int) -> dict[str, Any]:
    """CPU seconds of the PushT env alone (uniform random targets, the same seeds and episode count, one core).

    The env's step (pymunk physics and the 96x96 render) is work no agent can skip: spread over every
    core, it is a floor under any agent's rollout time, and with the start-up it bounds the ratio
    to lerobot-eval that these cores allow.
    """
    out = work / f"env_alone_{n}.json"
    timed([str(PYTHON), "-c", ENV_ALONE, str(n), str(episodes), str(seed), str(out)], env=os.environ.copy())
    return json.loads(out.read_text())


def timed(command: list[str], *, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the whole process tree) of one subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise SystemExit(f"{command[0]} failed with code {done.returncode}:\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


# ---------------------------------------------------------------------------------------------
# report


def row(n: int, side: str, sims: int, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "n": n,
        "side": side,
        "sims": sims,
        "episodes": result["episodes"],
        "env_steps": result["env_steps"],
        "forwards": result["forwards"],
        "forwards_per_env_step": result["forwards"] / max(1, result["env_steps"]),
        "eval_s": result["eval_s"],
        "env_steps_per_s": result["env_steps"] / result["eval_s"],
        "wall_s": result["wall_s"],
        "cpu_s": result["cpu_s"],
        "episodes_per_s": result["episodes"] / result["wall_s"],
        "avg_sum_reward": result["avg_sum_reward"],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>3} {'side':<14} {'sims':>4} {'eps':>4} {'env-steps':>9} {'fwd':>5} {'fwd/step':>9} "
        f"{'eval s':>7} {'steps/s':>8} {'wall s':>7} {'cpu s':>6} {'eps/s':>7} {'avg return':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['n']:>3} {r['side']:<14} {r['sims']:>4} {r['episodes']:>4} {r['env_steps']:>9} {r['forwards']:>5} "
            f"{r['forwards_per_env_step']:>9.5f} {r['eval_s']:>7.1f} {r['env_steps_per_s']:>8.0f} "
            f"{r['wall_s']:>7.1f} {r['cpu_s']:>6.1f} {r['episodes_per_s']:>7.3f} {r['avg_sum_reward']:>10.2f}"
        )


def default_episodes(n: int) -> int:
    """About 32 episodes (lerobot-eval's default is 50), at most 4 batches, at least 4 episodes.

    Enough that rollouts rather than the ~15 s of imports both sides pay decide episodes/s.
    """
    return max(4, min(4 * n, 32)) if n <= 32 else n


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of repeated runs (the machine is shared: noise only ever adds time)."""
    return min(runs, key=lambda r: r["wall_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 32], help="envs stepped together (default 1 8 32)")
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per N (default: about 32, at most 4 batches, at least 4)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per side and N; the fastest counts (default 1)")
    parser.add_argument(
        "--sims", type=int, default=os.cpu_count() or 1, help="sim children ours splits N over (default: one per core)"
    )
    parser.add_argument("--single-sim", action="store_true", help="also run ours with all N slots in one child")
    parser.add_argument("--seed", type=int, default=1000, help="first seed (lerobot-eval's default)")
    parser.add_argument("--no-traces", action="store_true", help="run ours without writing traces")
    parser.add_argument(
        "--send-ahead",
        type=int,
        default=DEFAULT_SEND_AHEAD,
        help=f"steps ours sends ahead of the observation (default {DEFAULT_SEND_AHEAD}; 0 waits for every reply)",
    )
    parser.add_argument("--device", default="cpu", help="policy device on both sides (cpu, cuda)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads of ours (default 1, the agent's default while sims share the cores; lerobot-eval "
        "keeps torch's default, 2 here)",
    )
    parser.add_argument(
        "--lockstep-threads",
        default="auto",
        help="torch threads of ours for a forward every sim waits on: auto (default), a count, or none",
    )
    parser.add_argument("--stock", action="store_true", help="also run the untouched lerobot-eval (preview videos on)")
    parser.add_argument("--skip-lerobot", action="store_true", help="only run ours")
    parser.add_argument(
        "--floor", action="store_true", help="also time the env alone: the best ratio these cores allow any agent"
    )
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--traces", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.worker:
        args.n = args.n[0]
        worker(args)
        return

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-agent-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = make_policy_folder(work / "act")
    rows: list[dict[str, Any]] = []
    end_to_end: dict[str, float] = {}
    rollouts: dict[str, float] = {}
    cpu: dict[str, float] = {}
    floors: dict[str, dict[str, float]] = {}
    repeats = range(max(1, args.repeat))
    for n in args.n:
        episodes = args.episodes or default_episodes(n)
        common = {"seed": args.seed, "device": args.device}
        traces = not args.no_traces
        sims = max(1, min(args.sims, n))
        threads = args.torch_threads
        ours = best(
            [
                run_ours(
                    n,
                    episodes,
                    folder,
                    work,
                    sims=sims,
                    traces=traces,
                    torch_threads=threads,
                    send_ahead=args.send_ahead,
                    lockstep_threads=args.lockstep_threads,
                    **common,
                )
                for _ in repeats
            ]
        )
        rows.append(row(n, "ours", sims, ours))
        if args.single_sim and sims > 1:
            single = best([run_ours(n, episodes, folder, work, sims=1, traces=traces, **common) for _ in repeats])
            rows.append(row(n, "ours/1", 1, single))
        if not args.skip_lerobot:
            peer = best([run_lerobot(n, episodes, folder, work, stock=False, **common) for _ in repeats])
            rows.append(row(n, "lerobot-eval", 1, peer))
            end_to_end[str(n)] = peer["wall_s"] / ours["wall_s"]  # same episodes: the ratio of episodes/s
            rollouts[str(n)] = peer["eval_s"] / ours["eval_s"]
            cpu[str(n)] = peer["cpu_s"] / ours["cpu_s"]
            if args.floor:
                alone = run_env_alone(n, episodes, work, seed=args.seed)
                cores = os.cpu_count() or 1
                floor_rollouts = alone["env_cpu_s"] / cores
                floor_wall = floor_rollouts + (ours["wall_s"] - ours["eval_s"])  # our own start-up kept
                floors[str(n)] = {
                    "env_cpu_s": alone["env_cpu_s"],
                    "env_cpu_us_per_step": 1e6 * alone["env_cpu_s"] / max(1, alone["env_steps"]),
                    "floor_rollouts_s": floor_rollouts,
                    "best_end_to_end_ratio": peer["wall_s"] / floor_wall,
                    "best_rollout_ratio": peer["eval_s"] / floor_rollouts,
                }
            if args.stock:
                stock = run_lerobot(n, episodes, folder, work, stock=True, **common)
                rows.append(row(n, "lerobot/stock", 1, stock))
        print_table(rows)
        print(flush=True)
    for n, floor in floors.items():
        print(
            f"N={n}: the env alone costs {floor['env_cpu_s']:.1f} CPU s"
            f" ({floor['env_cpu_us_per_step']:.0f} us a step): "
            f"on {os.cpu_count()} cores at best {floor['best_end_to_end_ratio']:.2f}x lerobot-eval end to end "
            f"({floor['best_rollout_ratio']:.2f}x rollouts) with our start-up, whatever the agent does"
        )
    for n in end_to_end:
        print(
            f"N={n}: ours vs lerobot-eval: {end_to_end[n]:.2f}x episodes/s end to end, {rollouts[n]:.2f}x rollouts, "
            f"{cpu[n]:.2f}x less CPU"
        )
    target = end_to_end.get(str(TARGET_N))
    summary = {
        "bench": "agent",
        "env": PUSHT,
        "policy": "act (random weights)",
        "cpus": os.cpu_count(),
        "rows": rows,
        "end_to_end_ratio_vs_lerobot_eval": end_to_end,
        "rollout_ratio_vs_lerobot_eval": rollouts,
        "cpu_ratio_vs_lerobot_eval": cpu,
        "env_alone_floor": floors,
        "target": {"n": TARGET_N, "ratio": TARGET_RATIO, "met": None if target is None else target >= TARGET_RATIO},
        "work_dir": str(work),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
