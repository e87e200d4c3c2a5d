"""A ``sim.lerobot_env`` pipeline beside ``lerobot-eval``: the same episodes, the same numbers, the wall time.

Both sides evaluate one random-weight ACT folder (lerobot's PushT inputs, saved with ``save_pretrained``) on
lerobot's ``pusht`` env config with the same seed and batch size, each in its own process, timed from launch
to exit (imports, policy load and env build included):

- ours: ``hud-pipelines run`` on a pipeline with ``sim.lerobot_env: {type: pusht, episode_length: L}``,
  ``num_envs`` = the batch size, ``group`` = episodes / batch size, ``tasks[0].seed`` = the seed;
- theirs: ``lerobot-eval --env.type=pusht --eval.batch_size=B --eval.n_episodes=E --seed=S`` (sync envs, no
  preview videos: ours renders none either).

Prints both per-episode tables side by side, whether they are equal (seed, success exactly; sum and max
reward to 1e-6 relative), the wall time ratio ours / lerobot-eval, and last one JSON line.

    .venv/bin/python bench/lerobot_equality.py                 # 20 episodes x 300 steps, batch 4
    .venv/bin/python bench/lerobot_equality.py --episodes 8 --length 100
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.eval.lerobot_equality import (  # noqa: E402  (the repository root is put on the path first)
    Episode,
    make_policy_folder,
    pipeline_yaml,
    run_lerobot_eval,
)

NAME = "lerobot_equality"
HEADER = "| episode | seed | sum_reward | max_reward | success | equal |"
"""Each cell of a row reads ``ours / lerobot-eval``."""


def run_ours(path: Path, outputs: Path) -> tuple[list[Episode], float]:
    """``hud-pipelines run`` in its own process; its episodes read back from the grades and traces."""
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.recording.trace_reader import read_trace

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hud_pipelines.cli", "run", str(path), "--outputs", str(outputs), "--quiet"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"hud-pipelines run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    where = EvalOutputs(outputs, NAME)
    rows = [GradeRow.from_dict(r) for r in json.loads(where.grades_json.read_text())]
    traces = {
        (t.header["instance"], t.header["slot"]): t
        for t in (read_trace(p) for p in (outputs / NAME / "traces").rglob("*.jsonl"))
    }
    episodes: list[Episode] = []
    for row in sorted(rows, key=lambda r: (r.instance, r.slot)):
        rewards = [float(s["reward"]) for s in traces[(row.instance, row.slot)].steps if s["type"] == "reward"]
        episodes.append(Episode(int(row.seed or 0), row.total_reward, max(rewards), row.success))
    return episodes, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--length", type=int, default=300, help="episode_length of the pusht config (steps)")
    parser.add_argument("--batch", type=int, default=4, help="lerobot-eval's batch size = the pipeline's num_envs")
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args()
    if args.episodes % args.batch:
        raise SystemExit("--episodes must be a multiple of --batch (lerobot-eval would discard the rest)")
    with tempfile.TemporaryDirectory(prefix="lerobot-equality-") as tmp:
        work = Path(tmp)
        folder = make_policy_folder(work / "act")
        sizes = {"episodes": args.episodes, "batch_size": args.batch, "episode_length": args.length}
        path = work / f"{NAME}.yaml"
        path.write_text(pipeline_yaml(folder, seed=args.seed, name=NAME, **sizes))
        ours, ours_wall = run_ours(path, work / "outputs")
        theirs = run_lerobot_eval(folder, work / "lerobot", seed=args.seed, videos=False, **sizes)
    report(ours, ours_wall, theirs.episodes, theirs.wall_s, args)


def same(a: Episode, b: Episode) -> bool:
    """One episode on both sides: seed and success exactly, rewards to float tolerance."""
    rewards = ((a.sum_reward, b.sum_reward), (a.max_reward, b.max_reward))
    close = all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in rewards)
    return a.seed == b.seed and a.success == b.success and close


def report(
    ours: list[Episode], ours_wall: float, theirs: list[Episode], their_wall: float, args: argparse.Namespace
) -> None:
    print(f"{HEADER}\n|---|---|---|---|---|---|")
    equal = len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        ok = same(a, b)
        equal = equal and ok
        print(
            f"| {index} | {a.seed} / {b.seed} | {a.sum_reward:.6f} / {b.sum_reward:.6f} | "
            f"{a.max_reward:.6f} / {b.max_reward:.6f} | {a.success} / {b.success} | {'yes' if ok else 'NO'} |"
        )
    ratio = ours_wall / their_wall
    print(f"\nequal: {equal}; wall s: ours {ours_wall:.1f}, lerobot-eval {their_wall:.1f}; ratio {ratio:.2f}")
    summary = {
        "episodes": args.episodes,
        "length": args.length,
        "batch": args.batch,
        "seed": args.seed,
        "equal": equal,
        "ours_wall_s": round(ours_wall, 2),
        "lerobot_eval_wall_s": round(their_wall, 2),
        "wall_ratio_ours_over_lerobot_eval": round(ratio, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
