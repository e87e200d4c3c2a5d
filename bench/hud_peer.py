"""Pendulum-v1 under one scripted policy: an in-process loop, our agent loop, and hud 0.6.21's eval.

The same env (``Pendulum-v1``, 200-step episodes), the same deterministic torque rule
(``envs.controllers:PendulumSwingUp``, a function of the observation) and the same seeds (slot ``i``
of batch ``b`` gets ``seed + b * N + i``) run three ways, N envs stepped together:

- ``in-process``: a ``SyncVectorEnv`` stepped in a plain loop, the rule applied to all N rows at once
  (the baseline, in this process);
- ``ours``: one served sim of N slots (``SimProcess``, a child process) driven by ``RobotAgent``,
  one batched forward of the rule per tick, a JSON-lines trace per episode written as an eval
  writes it, on a thread of its own (``--no-traces`` to skip); in its own process;
- ``hud``: hud 0.6.21 the way its docs drive a vectorized gym sim: an ``Environment`` with
  ``env.gym("Pendulum-v1", num_envs=N)`` (its sim program in a child process), a template that claims
  a slot (``sim.reset`` -> token as the rollout's binding) and grades it (``sim.result``), and
  ``Taskset.run(agent, runtime=Shared(LocalRuntime(env), width=N), group=N)``: N concurrent rollouts,
  each a ``RobotAgent`` with one scalar WebSocket and the rule as its ``Model`` (hud's agent asks
  the model per slot, one ``ainfer`` per step; its ``BatchedModel`` needs torch and only coalesces
  ``ainfer`` calls of that same shape); spans written locally (``HUD_TELEMETRY_LOCAL_DIR``) when
  ours writes traces. It runs in its own virtual environment, which this bench creates once under
  ``~/.cache/hud-pipelines-bench/hud-0.6.21`` (pip, the package index this machine's pip uses).

Every side runs one warm-up batch first (sim start-up, first reset) and then ``--batches`` timed
batches; a batch is N episodes started together. Figures: env-steps/s over the timed batches, CPU
microseconds per env-step of the side's whole process tree over them, and the wall/CPU seconds of
the side's process from launch to exit. The episode returns of every side are compared with the
in-process loop's (same seeds and rule: they must agree).

    .venv/bin/python bench/hud_peer.py              # N = 1, 8, 32
    .venv/bin/python bench/hud_peer.py --quick      # N = 8, one timed batch (a smoke run)
    .venv/bin/python bench/hud_peer.py --skip-hud   # no hud install

Prints a table per N and, last, one JSON line whose ``ours_vs_hud_n32`` is the headline ratio
(env-steps/s ours / hud at N = 32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "Pendulum-v1"
POLICY = "envs.controllers:PendulumSwingUp"
STEPS = 200
TARGET_N = 32
TARGET_RATIO = 15.0
HUD_VERSION = "0.6.21"
HUD_DISTRIBUTIONS = ("hud-python", "hud")
"""The names hud 0.6.x is published under; the first that has this version is installed."""
HUD_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hud-pipelines-bench" / f"hud-{HUD_VERSION}"
)


def seed_of(base: int, batch: int, n: int) -> int:
    """The seed of slot 0 of ``batch``; slot ``i`` gets this plus ``i`` (gymnasium's vector reset)."""
    return base + batch * n


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its live descendants (Linux ``/proc``; else 0)."""
    total = 0.0
    pending = [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


# ---------------------------------------------------------------------------------------------
# in-process baseline (this process)


def run_in_process(n: int, batches: int, seed: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np

    sys.path.insert(0, str(REPO))
    from envs.controllers import PendulumSwingUp

    rule = PendulumSwingUp()
    env = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="sync")

    def batch(index: int) -> list[float]:
        observation, _ = env.reset(seed=seed_of(seed, index, n))
        total = np.zeros(n)
        for _ in range(STEPS):
            observation, reward, *_ = env.step(rule({"state": observation}))
            total += reward
        return [float(r) for r in total]

    try:
        batch(0)
        cpu = time.process_time()
        started = time.perf_counter()
        returns = [batch(b) for b in range(1, batches + 1)]
        rollout_s = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        env.close()
    return {"env_steps": n * STEPS * batches, "rollout_s": rollout_s, "rollout_cpu_s": cpu, "returns": returns}


# ---------------------------------------------------------------------------------------------
# ours (its own process: ``bench/hud_peer.py --side ours``)


def ours_side(args: argparse.Namespace) -> dict[str, Any]:
    from hud_pipelines.agent.builtin import scripted_policy
    from hud_pipelines.agent.runner import RobotAgent
    from hud_pipelines.recording.background import InBackground
    from hud_pipelines.recording.events import EpisodeSink
    from hud_pipelines.recording.traces import TraceRecorder
    from hud_pipelines.sim.process import SimProcess

    n = args.n
    with SimProcess.spawn(ENV_ID, num_envs=n) as process, process.connect() as client:
        contract = client.contract
        agent = RobotAgent(scripted_policy(POLICY, contract), contract)
        # as an eval writes them: on a thread of their own (``hud_pipelines.eval.rollouts``)
        recorder = InBackground(TraceRecorder(Path(args.traces), contract)) if args.traces else None
        sinks: list[EpisodeSink] = [recorder] if recorder is not None else []

        def batch(index: int) -> list[float]:
            tasks = [{"seed": seed_of(args.seed, index, n) + slot} for slot in range(n)]
            outcomes = agent.run(client, tasks, max_steps=STEPS, key=("bench", index, 0), sinks=sinks)
            if any(o.steps != STEPS for o in outcomes):
                raise SystemExit(f"ours: batch {index} ran {[o.steps for o in outcomes]} steps, expected {STEPS}")
            return [o.total_reward for o in outcomes]

        batch(0)
        cpu = tree_cpu_s(os.getpid())
        started = time.perf_counter()
        returns = [batch(b) for b in range(1, args.batches + 1)]
        rollout_s = time.perf_counter() - started
        cpu = tree_cpu_s(os.getpid()) - cpu
        if recorder is not None:
            recorder.close()
    return {"env_steps": n * STEPS * args.batches, "rollout_s": rollout_s, "rollout_cpu_s": cpu, "returns": returns}


# ---------------------------------------------------------------------------------------------
# hud 0.6.21 (its own virtual environment: ``<hud venv>/bin/python bench/hud_peer.py --side hud``)


def hud_side(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio
    import importlib

    import numpy as np

    hud: Any = importlib.import_module("hud")  # from the hud venv, not the project's
    robot: Any = importlib.import_module("hud.agents.robot")
    runtimes: Any = importlib.import_module("hud.eval.runtime")

    sys.path.insert(0, str(REPO))
    from envs.controllers import PendulumSwingUp

    n = args.n
    rule = PendulumSwingUp()
    env = hud.Environment("pendulum-bench")
    sim = env.gym(ENV_ID, num_envs=n, contract=None)

    @env.template(id="swing")
    async def swing(seed: int = 0) -> Any:  # pyright: ignore[reportUnusedFunction]
        episode = await sim.reset(seed=seed)  # one reset for the whole batch: slot i gets seed + i
        yield {"prompt": episode["prompt"], "bindings": {"robot": {"token": episode["token"]}}}
        yield await sim.result(token=episode["token"])

    class Rule(robot.Model):
        """The torque rule on one slot's observation, as hud's ``[N, T, A]`` chunk with N = T = 1."""

        def infer(self, batch: Any) -> Any:
            state = np.asarray(batch["data"]["obs"], dtype=np.float32).reshape(1, -1)
            return rule({"state": state}).reshape(1, 1, -1)

    class Agent(robot.RobotAgent):
        max_steps = STEPS
        log_every = 0

        def __init__(self) -> None:
            super().__init__()
            self.model = Rule()
            self.adapter = None

    agent = Agent()

    async def batches() -> tuple[list[list[float]], float, float]:
        async with runtimes.Shared(runtimes.LocalRuntime(env), width=n) as runtime:

            async def batch(index: int) -> list[float]:
                task = swing(seed=seed_of(args.seed, index, n))
                job = await hud.Taskset("pendulum-bench", [task]).run(agent, runtime=runtime, group=n, max_concurrent=n)
                graded: list[float | None] = [run.reward for run in job.runs]
                rewards = [float(r) for r in graded if r is not None]
                if len(rewards) != n:
                    raise SystemExit(f"hud: batch {index} graded {graded}, expected {n} returns")
                return rewards

            await batch(0)
            cpu = tree_cpu_s(os.getpid())
            started = time.perf_counter()
            returns = [await batch(b) for b in range(1, args.batches + 1)]
            return returns, time.perf_counter() - started, tree_cpu_s(os.getpid()) - cpu

    returns, rollout_s, cpu = asyncio.run(batches())
    return {"env_steps": n * STEPS * args.batches, "rollout_s": rollout_s, "rollout_cpu_s": cpu, "returns": returns}


class HudUnavailable(Exception):
    """hud could not be installed or started; the message says why."""


def hud_python() -> Path:
    """The hud venv's interpreter, created and installed on first use."""
    python = HUD_VENV / "bin" / "python"
    stamp = HUD_VENV / "installed.txt"
    if stamp.exists() and python.exists():
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"installing hud {HUD_VERSION} into {HUD_VENV} (once) ...", flush=True)
    made = subprocess.run([base, "-m", "venv", "--clear", str(HUD_VENV)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise HudUnavailable(f"`{base} -m venv` failed: {last_line(made.stderr)}")
    failures: list[str] = []
    for name in HUD_DISTRIBUTIONS:
        requirement = f"{name}[robot]=={HUD_VERSION}"
        pip = [str(python), "-m", "pip", "install", "--quiet", requirement]
        done = subprocess.run(pip, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            stamp.write_text(requirement + "\n")
            return python
        failures.append(f"{requirement}: {last_line(done.stderr)}")
    raise HudUnavailable("pip could not install hud: " + "; ".join(failures))


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def hud_env(work: Path, traces: bool) -> dict[str, str]:
    """No platform key, no analytics; spans written locally where ours writes traces."""
    env = {k: v for k, v in os.environ.items() if k not in ("HUD_API_KEY", "PYTHONPATH")}
    env["HUD_CLI_ANALYTICS_ENABLED"] = "false"
    if traces:
        env["HUD_TELEMETRY_LOCAL_DIR"] = str(work / "hud-spans")
    return env


# ---------------------------------------------------------------------------------------------
# driving the sides


def run_side(
    side: str, python: Path | str, n: int, batches: int, seed: int, work: Path, env: dict[str, str]
) -> dict[str, Any]:
    from bench.agent import timed

    out = work / f"{side}_{n}.json"
    command = [str(python), str(Path(__file__).resolve()), "--side", side, "--n", str(n)]
    command += ["--batches", str(batches), "--seed", str(seed), "--out", str(out)]
    if side == "ours" and env.get("BENCH_TRACES"):
        command += ["--traces", env["BENCH_TRACES"]]
    wall, cpu = timed(command, env=env)
    result = json.loads(out.read_text())
    result.update(wall_s=wall, cpu_s=cpu)
    return result


def summarize(side: str, n: int, result: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    import numpy as np

    matches = None
    if baseline is not None:
        mine = [sorted(batch) for batch in result["returns"]]
        theirs = [sorted(batch) for batch in baseline["returns"]]
        matches = bool(np.allclose(mine, theirs, rtol=1e-5, atol=1e-3))
    episodes = sum(len(batch) for batch in result["returns"])
    return {
        "n": n,
        "side": side,
        "episodes": episodes,
        "env_steps": result["env_steps"],
        "rollout_s": result["rollout_s"],
        "env_steps_per_s": result["env_steps"] / result["rollout_s"],
        "cpu_us_per_env_step": 1e6 * result["rollout_cpu_s"] / result["env_steps"],
        "wall_s": result.get("wall_s"),
        "cpu_s": result.get("cpu_s"),
        "mean_return": sum(sum(batch) for batch in result["returns"]) / episodes,
        "returns_match": matches,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>3} {'side':<11} {'episodes':>8} {'env-steps':>9} {'rollout s':>9} {'env-steps/s':>11} "
        f"{'CPU us/step':>11} {'wall s':>7} {'CPU s':>6} {'mean return':>11} {'same returns':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        cpu = "-" if r["cpu_s"] is None else f"{r['cpu_s']:.1f}"
        same = "-" if r["returns_match"] is None else "yes" if r["returns_match"] else "NO"
        print(
            f"{r['n']:>3} {r['side']:<11} {r['episodes']:>8} {r['env_steps']:>9} {r['rollout_s']:>9.2f} "
            f"{r['env_steps_per_s']:>11,.0f} {r['cpu_us_per_env_step']:>11.1f} {wall:>7} {cpu:>6} "
            f"{r['mean_return']:>11.2f} {same:>12}"
        )


def default_batches(n: int) -> int:
    """Timed batches per N: about 64 episodes where N is small, at least two batches."""
    return max(2, min(8, 64 // n))


def versions(hud: Path | None) -> dict[str, str]:
    import gymnasium
    import numpy

    found = {"python": platform.python_version(), "gymnasium": gymnasium.__version__, "numpy": numpy.__version__}
    if hud is not None:
        probe = "import hud, gymnasium, numpy; print(hud.__version__, gymnasium.__version__, numpy.__version__)"
        done = subprocess.run([str(hud), "-c", probe], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            hud_version, gym_version, numpy_version = done.stdout.split()
            found.update(hud=hud_version, hud_gymnasium=gym_version, hud_numpy=numpy_version)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 32], help="envs stepped together (default 1 8 32)")
    parser.add_argument("--batches", type=int, default=None, help="timed batches per N (default: 8, 8, 2)")
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="N = 8, one timed batch (a smoke run)")
    parser.add_argument("--no-traces", action="store_true", help="ours writes no traces, hud no local spans")
    parser.add_argument("--skip-hud", action="store_true", help="do not install or run hud")
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    parser.add_argument("--side", choices=("ours", "hud"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--traces", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        args.n = args.n[0]
        result = ours_side(args) if args.side == "ours" else hud_side(args)
        Path(args.out).write_text(json.dumps(result))
        return
    sys.path.insert(0, str(REPO))
    if args.quick:
        args.n, args.batches = [8], 1
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-hud-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    traces = not args.no_traces
    hud: Path | None = None
    hud_skipped: str | None = "--skip-hud" if args.skip_hud else None
    if hud_skipped is None:
        try:
            hud = hud_python()
        except HudUnavailable as exc:
            hud_skipped = str(exc)
            print(f"hud column skipped: {hud_skipped}", flush=True)
    ours_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    if traces:
        ours_env["BENCH_TRACES"] = str(work / "traces")
    load_before = os.getloadavg()
    load = " ".join(f"{x:.2f}" for x in load_before)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load}")
    rows: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, float]] = {}
    for n in args.n:
        batches = args.batches or default_batches(n)
        baseline = run_in_process(n, batches, args.seed)
        rows.append(summarize("in-process", n, baseline, None))
        ours = summarize("ours", n, run_side("ours", sys.executable, n, batches, args.seed, work, ours_env), baseline)
        rows.append(ours)
        ratios[str(n)] = {"ours_vs_in_process": ours["env_steps_per_s"] / rows[-2]["env_steps_per_s"]}
        if hud is not None and hud_skipped is None:
            try:
                result = run_side("hud", hud, n, batches, args.seed, work, hud_env(work, traces))
            except SystemExit as exc:  # hud could not start or run: skip its column, say why
                hud_skipped = f"hud failed at N = {n}: {exc}"
                print(f"hud column skipped: {hud_skipped}", flush=True)
            else:
                peer = summarize("hud " + HUD_VERSION, n, result, baseline)
                rows.append(peer)
                ratios[str(n)]["ours_vs_hud"] = ours["env_steps_per_s"] / peer["env_steps_per_s"]
                ratios[str(n)]["hud_vs_in_process"] = peer["env_steps_per_s"] / rows[-3]["env_steps_per_s"]
        print_table([r for r in rows if r["n"] == n])
        print(", ".join(f"{k} {v:.2f}x" for k, v in ratios[str(n)].items()), flush=True)
        print()
    load_after = os.getloadavg()
    summary: dict[str, Any] = {
        "bench": "hud_peer",
        "env": ENV_ID,
        "policy": POLICY,
        "episode_steps": STEPS,
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "versions": versions(hud),
        "traces": traces,
        "rows": rows,
        "ratios": ratios,
        "work_dir": str(work),
    }
    headline = ratios.get(str(TARGET_N), {}).get("ours_vs_hud")
    if headline is not None:
        summary["ours_vs_hud_n32"] = round(headline, 2)
        summary["target"] = {"n": TARGET_N, "ratio": TARGET_RATIO, "met": headline >= TARGET_RATIO}
    if hud_skipped is not None:
        summary["hud_skipped"] = hud_skipped
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
