"""An eval's instances on Celery workers: one worker against two for a sim-bound eval, and what a unit costs.

Starts its own ``redis-server`` (127.0.0.1, a free port, a temporary folder) and solo-pool workers
(``celery -A hud_pipelines.dagster.worker worker --pool solo``), and runs one eval through Dagster
in several ways, side by side, ``--repeats`` times each (medians):

- ``in process``: the default, one run whose step drives ``max_concurrent`` (2) sims on threads;
- ``celery, 1 worker`` / ``celery, 2 workers``: the same YAML with the deployment's
  ``execution: {executor: celery}``, one unit (one sim set) per instance.

The eval is *sim-bound*: CartPole whose sim burns ``--busy-ms`` of CPU per env step (and per slot),
so each instance is mostly sim time. Then the fixed costs:

- per unit and per run on one worker: tiny evals (1 slot, 1 step) of ``--small`` and ``--large``
  instances; the slope of wall time over units is what one more unit costs, the intercept what a run
  costs whatever its size (planning, collecting, grades, report, checks: each a step on a worker);
- inside a unit: step start to step end less the instance's own wall time (resources, a sim start,
  the policy, events), and submission to step start (the queue and dagster-celery's 1 s poll);
- ``one run per partition``: a ``hud-pipelines run --partition`` in a fresh process, what a unit
  would cost as a run of its own (a run launcher starts a process per run).

The grades of every way are checked to agree row for row. Prints a table and, last, one JSON line.

    .venv/bin/python bench/celery.py [--repeats 2] [--group 8] [--max-steps 400] [--busy-ms 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve()
# Run as a script, this file's folder leads sys.path, where the file's own name would hide the celery package.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE.parent]


def busy_cartpole(busy_ms: float = 2.0) -> Any:
    """CartPole-v1 whose every step first burns ``busy_ms`` of CPU: a sim that costs what real physics costs."""
    import gymnasium as gym

    class Busy(gym.Wrapper):  # type: ignore[type-arg]
        def step(self, action: Any) -> Any:
            end = time.perf_counter() + busy_ms / 1000
            while time.perf_counter() < end:
                pass
            return self.env.step(action)

    return Busy(gym.make("CartPole-v1"))


def _pipeline(directory: Path, name: str, *, group: int, num_envs: int, max_steps: int, busy_ms: float) -> Path:
    spec = {
        "name": name,
        "sim": {"factory": f"{HERE}:busy_cartpole", "num_envs": num_envs, "args": {"busy_ms": busy_ms}},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "group": group,
        "max_steps": max_steps,
        "max_concurrent": 2,
        "graders": [{"kind": "return", "threshold": 0}],
    }
    path = directory / f"{name}.yaml"
    path.write_text(json.dumps(spec))
    return path


@contextlib.contextmanager
def _redis(directory: Path) -> Iterator[str]:
    import redis

    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed (scripts/setup installs it)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


@contextlib.contextmanager
def _workers(deployment: Path, count: int, logs: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HUD_PIPELINES_DEPLOYMENT": str(deployment), "HF_HUB_OFFLINE": "1"}
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index in range(count):
            log = logs / f"w{index}-{uuid.uuid4().hex[:6]}.log"
            command = [str(BIN / "celery"), "-A", "hud_pipelines.dagster.worker", "worker", "--pool", "solo"]
            command += ["--queues", "cpu", "--hostname", f"w{index}@%h", "--loglevel", "INFO", "--logfile", str(log)]
            command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
            started.append((subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL), log))
        for process, log in started:
            deadline = time.monotonic() + 120
            while not (log.is_file() and " ready." in log.read_text(errors="replace")):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"a worker did not start; see {log}")
                time.sleep(0.1)
        yield [process for process, _ in started]
    finally:
        for process, _ in started:
            process.send_signal(signal.SIGTERM)
        for process, _ in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _run(path: Path, outputs: Path, home: Path) -> tuple[float, str, Any]:
    """One run of the pipeline where ``$HUD_PIPELINES_DEPLOYMENT`` says; its wall time, run id and instance."""
    import dagster as dg

    from hud_pipelines.dagster.definitions import definitions_for_file
    from hud_pipelines.dagster.launch import execute_pipeline_job
    from hud_pipelines.spec.loader import load_pipeline

    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.from_config(str(home))
    name = load_pipeline(path).name
    started = time.perf_counter()
    job = definitions_for_file(path, outputs_dir=outputs, project_dir=REPO).resolve_job_def(name)
    run_id = str(uuid.uuid4())
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    result = execute_pipeline_job(
        job, path, instance=instance, outputs_dir=outputs, project_dir=REPO, tags={}, run_config=quiet, run_id=run_id
    )
    wall = time.perf_counter() - started
    if not result.success:
        raise SystemExit(f"run {run_id} of {name} failed")
    return wall, run_id, instance


def _grades(outputs: Path, name: str) -> list[dict[str, Any]]:
    rows = json.loads((outputs / name / "grades.json").read_text())
    return [{k: v for k, v in row.items() if k not in ("run_id", "trace_id")} for row in rows]


def _unit_costs(instance: Any, run_id: str, outputs: Path, name: str) -> tuple[list[float], list[float]]:
    """Per unit: step time less the instance's own wall time; submission to step start."""
    import dagster as dg

    from hud_pipelines.eval.runner import InstanceResult

    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        key = record.step_key or ""
        if event is None or ".unit[" not in key:
            continue
        if event.event_type == dg.DagsterEventType.ENGINE_EVENT and "Submitting celery task" in (event.message or ""):
            submitted[key] = record.timestamp
        elif event.event_type == dg.DagsterEventType.STEP_START:
            started[key] = record.timestamp
        elif event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            ended[key] = record.timestamp
    walls = {
        result.key: result.wall_s
        for result in (InstanceResult.read(p) for p in (outputs / name / "rollouts").glob("*.json"))
    }
    inside: list[float] = []
    waiting: list[float] = []
    for key, end in ended.items():
        partition = key.split("[", 1)[1].rstrip("]").split("_", 1)[1].replace("_", "-")
        inside.append(end - started[key] - walls.get(partition, 0.0))
        waiting.append(started[key] - submitted[key])
    return inside, waiting


def _cli_partition_run(path: Path, outputs: Path, home: Path) -> float:
    env = {**os.environ, "DAGSTER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HUD_PIPELINES_DEPLOYMENT", None)
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    started = time.perf_counter()
    command = [str(BIN / "hud-pipelines"), "run", str(path), "--partition", "task0-i0", "--quiet"]
    subprocess.run([*command, "--outputs", str(outputs)], env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--group", type=int, default=8, help="instances of the sim-bound eval")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--busy-ms", type=float, default=2.0, help="CPU a sim step burns, per slot")
    parser.add_argument("--small", type=int, default=2, help="units of the small tiny eval")
    parser.add_argument("--large", type=int, default=8, help="units of the large tiny eval")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(REPO))

    work = Path(tempfile.mkdtemp(prefix="bench-celery-"))
    logs = work / "logs"
    logs.mkdir()
    bound = _pipeline(
        work, "bound", group=args.group, num_envs=args.num_envs, max_steps=args.max_steps, busy_ms=args.busy_ms
    )
    small = _pipeline(work, "tiny_small", group=args.small, num_envs=1, max_steps=1, busy_ms=0)
    large = _pipeline(work, "tiny_large", group=args.large, num_envs=1, max_steps=1, busy_ms=0)
    walls: dict[str, list[float]] = {}
    grades: dict[str, list[dict[str, Any]]] = {}
    counter = iter(range(1000))

    def timed(way: str, path: Path) -> tuple[float, str, Any, Path]:
        outputs = work / f"out-{next(counter)}"
        wall, run_id, instance = _run(path, outputs, work / f"home-{next(counter)}")
        walls.setdefault(way, []).append(wall)
        grades.setdefault(f"{path.stem}:{way}", _grades(outputs, path.stem))
        return wall, run_id, instance, outputs

    os.environ.pop("HUD_PIPELINES_DEPLOYMENT", None)
    for _ in range(args.repeats):
        timed("in process", bound)
    inside: list[float] = []
    waiting: list[float] = []
    with _redis(work) as broker:
        deployment = work / "deployment.yaml"
        deployment.write_text(json.dumps({"execution": {"executor": "celery", "broker": broker}}))
        os.environ["HUD_PIPELINES_DEPLOYMENT"] = str(deployment)
        for count in (1, 2):
            with _workers(deployment, count, logs):
                _run(small, work / f"warm-{count}", work / f"home-warm-{count}")  # imports paid in every worker
                for _ in range(args.repeats):
                    _, run_id, instance, outputs = timed(f"celery, {count} worker{'s' * (count > 1)}", bound)
                    if count == 2:
                        more_inside, more_waiting = _unit_costs(instance, run_id, outputs, "bound")
                        inside += more_inside
                        waiting += more_waiting
                if count == 1:
                    for _ in range(args.repeats):
                        timed(f"tiny x{args.small}, 1 worker", small)
                        timed(f"tiny x{args.large}, 1 worker", large)
    os.environ.pop("HUD_PIPELINES_DEPLOYMENT", None)
    partition_runs = [_cli_partition_run(small, work / f"cli-{k}", work / f"home-cli-{k}") for k in range(args.repeats)]

    for key in [k for k in grades if k.startswith("bound:")]:
        assert grades[key] == grades["bound:in process"], f"{key} grades differ from the in-process run"
    median = {way: statistics.median(values) for way, values in walls.items()}
    one, two = median["celery, 1 worker"], median["celery, 2 workers"]
    slope = (median[f"tiny x{args.large}, 1 worker"] - median[f"tiny x{args.small}, 1 worker"]) / (
        args.large - args.small
    )
    intercept = median[f"tiny x{args.small}, 1 worker"] - slope * args.small
    figures = {
        "speedup_2_workers_over_1": round(one / two, 2),
        "celery_2_workers_over_in_process": round(two / median["in process"], 2),
        "per_unit_s_one_worker": round(slope, 2),
        "per_run_s": round(intercept, 2),
        "unit_step_overhead_s_median": round(statistics.median(inside), 2) if inside else None,
        "unit_queue_wait_s_median": round(statistics.median(waiting), 2) if waiting else None,
        "run_per_partition_cli_s": round(statistics.median(partition_runs), 2),
    }
    print(f"{'way':<28} {'median s':>9} {'runs':>5}")
    for way, value in median.items():
        print(f"{way:<28} {value:>9.2f} {len(walls[way]):>5}")
    print()
    for name, value in figures.items():
        print(f"{name:<36} {value}")
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "bench": "celery",
                "group": args.group,
                "num_envs": args.num_envs,
                "max_steps": args.max_steps,
                "busy_ms": args.busy_ms,
                "repeats": args.repeats,
                "medians_s": {k: round(v, 2) for k, v in median.items()},
                "figures": figures,
                "load_average": [round(x, 2) for x in load],
            }
        )
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
