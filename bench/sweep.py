"""A sweep of three checkpoints as one run, against three separate runs of one checkpoint each.

Writes a training run of a tiny ACT at three steps with lerobot's own checkpoint code (as
lerobot-train does), then evaluates it two ways, side by side, ``--repeats`` times each, each in a
fresh process through the project's CLI (what a user or a CI job pays):

- ``sweep``: one ``hud-pipelines run`` of a pipeline whose policy names the run's ``checkpoints``:
  one process, one Dagster run, one sim pool reset for every instance of every checkpoint, each
  checkpoint's policy loaded once;
- ``separate runs``: three ``hud-pipelines run`` calls, each of a pipeline with one checkpoint
  ``path`` (the same episodes): three interpreters, three runs, three sim sets.

Both evaluate the same (checkpoint, task, instance, slot) episodes; the bench checks that their
grades agree row for row. Prints a table and, last, one JSON line with the ratio.

    .venv/bin/python bench/sweep.py [--repeats 3] [--group 2] [--num-envs 4] [--max-steps 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEPS = (500, 1000, 1500)
RENAME = {"goal": "observation.environment_state"}


def _pipeline(name: str, policy: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": name,
        "sim": {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": args.num_envs},
        "agent": {"policy": {"kind": "lerobot", "device": "cpu", "rename": RENAME, **policy}},
        "tasks": [{"name": "near", "seed": 10}, {"name": "far", "seed": 500}],
        "group": args.group,
        "max_steps": args.max_steps,
    }


def _cli(pipeline: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "hud-pipelines"), "run", str(pipeline), "--quiet"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{pipeline.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def _grades(outputs: Path, name: str) -> list[tuple[Any, ...]]:
    rows = json.loads((outputs / name / "grades.json").read_text())
    return [(r["task"], r["instance"], r["slot"], r["seed"], r["status"], round(r["total_reward"], 9)) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=50)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.agent.checkpoint_runs import age, write_lerobot_run

    with tempfile.TemporaryDirectory(prefix="hud-bench-sweep-") as tmp:
        root = Path(tmp)
        run = write_lerobot_run(root / "train" / "act_reach", STEPS)
        age(run.output_dir, 60)
        pipelines = root / "pipelines"
        pipelines.mkdir()
        sweep = pipelines / "bench_sweep.yaml"
        sweep.write_text(json.dumps(_pipeline("bench_sweep", {"checkpoints": str(run.output_dir)}, args)))
        singles = []
        for step in STEPS:
            single = pipelines / f"bench_single_{step}.yaml"
            single.write_text(json.dumps(_pipeline(f"bench_single_{step}", {"path": str(run.pretrained(step))}, args)))
            singles.append(single)
        times: dict[str, list[float]] = {"sweep": [], "separate runs": []}
        for repeat in range(args.repeats):
            outputs = root / f"outputs-{repeat}"
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "HUD_PIPELINES_OUTPUTS": str(outputs),
                "DAGSTER_HOME": str(root / f"home-{repeat}"),
                "PYTHONPATH": str(REPO),
            }
            Path(env["DAGSTER_HOME"]).mkdir()
            Path(env["DAGSTER_HOME"], "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            times["sweep"].append(_cli(sweep, env))
            times["separate runs"].append(sum(_cli(single, env) for single in singles))
            swept = json.loads((outputs / "bench_sweep" / "grades.json").read_text())
            for step in STEPS:
                label = f"{step:06d}"
                mine = [
                    (r["task"], r["instance"], r["slot"], r["seed"], r["status"], round(r["total_reward"], 9))
                    for r in swept
                    if r["checkpoint"] == label
                ]
                if mine != _grades(outputs, f"bench_single_{step}"):
                    raise SystemExit(f"checkpoint {label}: the sweep and the separate run disagree")
    episodes = len(STEPS) * 2 * args.group * args.num_envs
    sweep_s = statistics.median(times["sweep"])
    separate_s = statistics.median(times["separate runs"])
    print(f"{len(STEPS)} checkpoints x 2 tasks x {args.group} instances x {args.num_envs} slots = {episodes} episodes")
    print(f"{'way':<16}{'median s':>10}{'runs (s)':>30}")
    for way, values in times.items():
        print(f"{way:<16}{statistics.median(values):>10.2f}{', '.join(f'{v:.1f}' for v in values):>30}")
    print(f"separate runs / sweep: {separate_s / sweep_s:.2f}x")
    print(
        json.dumps(
            {
                "bench": "sweep",
                "episodes": episodes,
                "sweep_s": round(sweep_s, 3),
                "separate_runs_s": round(separate_s, 3),
                "speedup_sweep_vs_separate": round(separate_s / sweep_s, 3),
                "grades_equal": True,
            }
        )
    )


if __name__ == "__main__":
    main()
