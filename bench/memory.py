"""Peak memory of an eval's parent process at 1x and 16x the episodes: is it flat in their number?

One pipeline, run through ``evaluate()`` (the Python API: the same resources and steps as the
Dagster job): the camera pendulum (``envs.camera_pendulum``, a 96x96x3 ``uint8`` frame per slot
and step) under the scripted swing-up rule, ``num_envs`` slots per instance, ``max_concurrent`` 2,
traces with video for every episode (``traces.video: all``) and the LeRobot dataset on. Only
``group`` changes between sizes (1x, 4x, 16x the instances, so the episodes); each size runs in a
fresh process, so its figures are its own.

Figures per size:

- the parent's peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``, exact) and its RSS after the eval;
- the children's: the largest peak RSS of one child (``RUSAGE_CHILDREN``: sim processes, video
  encoders, each waited for) and the peak of all live descendants' RSS summed (sampled every 50 ms);
- ``--tracemalloc``: Python allocations still held by the parent after the eval (the process's
  baseline before it diffed away), top lines by size: where per-episode memory would live.

    .venv/bin/python bench/memory.py                 # group 2 / 8 / 32 x 4 slots x 100 steps
    .venv/bin/python bench/memory.py --quick         # group 1 / 4 x 4 slots x 40 steps
    .venv/bin/python bench/memory.py --tracemalloc   # also where the parent's Python memory is

Prints a table and ratios, and last one JSON line (``parent_peak_ratio_16x``: the parent's peak RSS
at 16x over 1x; flat is about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def pipeline(
    name: str, group: int, *, num_envs: int, max_steps: int, video: bool = True, dataset: bool = True
) -> dict[str, Any]:
    """The eval: only ``group`` differs between sizes (``video`` / ``dataset`` off to tell them apart)."""
    return {
        "name": name,
        "sim": {"factory": "envs.camera_pendulum:camera_pendulum", "num_envs": num_envs},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:PendulumSwingUp"}},
        "tasks": [{"name": "swingup", "seed": 100}],
        "group": group,
        "max_concurrent": 2,
        "max_steps": max_steps,
        "graders": [{"kind": "return", "threshold": -400}],
        "traces": {"video": "all" if video else "none", "max_videos": num_envs},
        "dataset": {"enabled": dataset},
    }


# ---------------------------------------------------------------------------------------------
# one size (a fresh process: ``bench/memory.py --child``)


def rss_of(pid: int) -> int:
    """Resident bytes of one process now (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                pending += children
        except OSError:
            continue
    return found


class Sampler:
    """Peak RSS of this process and of all its live descendants together, sampled on a thread.

    With ``tracemalloc`` on it also keeps a snapshot near the peak of traced Python memory (a new
    one each time the traced total grows by a quarter), so what the parent holds *during* the eval
    can be diffed against what it held before.
    """

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self.parent_peak = 0
        self.children_peak = 0
        self.peak_snapshot: Any = None
        self._snapshot_size = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.every_s):
            self.parent_peak = max(self.parent_peak, rss_of(me))
            self.children_peak = max(self.children_peak, sum(rss_of(c) for c in descendants(me)))
            self._maybe_snapshot()

    def _maybe_snapshot(self) -> None:
        import tracemalloc

        if not tracemalloc.is_tracing():
            return
        current, _ = tracemalloc.get_traced_memory()
        if current > 1.25 * self._snapshot_size:
            self.peak_snapshot = tracemalloc.take_snapshot()
            self._snapshot_size = current


def child(args: argparse.Namespace) -> dict[str, Any]:
    import tracemalloc

    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text

    work = Path(args.work)
    os.chdir(REPO)
    shape = {"num_envs": args.num_envs, "max_steps": args.max_steps, "video": not args.no_video}
    text = json.dumps(pipeline("memory_bench", args.group, dataset=not args.no_dataset, **shape))
    spec = load_pipeline_text(text, source=work / "memory_bench.yaml")
    start: Any = None
    if args.tracemalloc:
        preimport()  # imports are not what grows with episodes; tracing them would take minutes
        tracemalloc.start(TRACE_DEPTH)
        start = tracemalloc.take_snapshot()
    before = rss_of(os.getpid())
    started = time.perf_counter()
    with Sampler() as sampler:
        evaluation = evaluate(spec, outputs_dir=work / "outputs", project_dir=work)
    seconds = time.perf_counter() - started
    if (evaluation.dataset is None and not args.no_dataset) or evaluation.failed_instances:
        raise SystemExit(f"the eval did not complete: {evaluation.failed_instances} {evaluation.checks}")
    held: list[dict[str, Any]] = []
    traced_peak = 0.0
    if args.tracemalloc:
        traced_peak = tracemalloc.get_traced_memory()[1] / MIB
        held = grown(start, sampler.peak_snapshot or tracemalloc.take_snapshot(), args.top)
        tracemalloc.stop()
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    children_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "group": args.group,
        "episodes": len(evaluation.rows),
        "frames": None if evaluation.dataset is None else evaluation.dataset.frames,
        "seconds": seconds,
        "parent_rss_before_mib": before / MIB,
        "parent_rss_after_mib": rss_of(os.getpid()) / MIB,
        "parent_peak_mib": self_usage.ru_maxrss * 1024 / MIB,
        "parent_peak_sampled_mib": sampler.parent_peak / MIB,
        "largest_child_peak_mib": children_usage.ru_maxrss * 1024 / MIB,
        "children_sum_peak_mib": sampler.children_peak / MIB,
        "traced_peak_mib": traced_peak,
        "held": held,
    }


TRACE_DEPTH = 6


def preimport() -> None:
    """What an eval imports on its way, imported before tracing starts."""
    import av  # noqa: F401  # pyright: ignore[reportUnusedImport]
    import lerobot.datasets.aggregate  # pyright: ignore[reportUnusedImport]
    import lerobot.datasets.lerobot_dataset  # noqa: F401  # pyright: ignore[reportUnusedImport]
    import torch  # noqa: F401  # pyright: ignore[reportUnusedImport]


def grown(start: Any, peak: Any, top: int) -> list[dict[str, Any]]:
    """The allocation sites that grew most between ``start`` and ``peak``, with their call stacks."""
    import tracemalloc

    noise = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    diff = peak.filter_traces(noise).compare_to(start.filter_traces(noise), "traceback")
    return [
        {
            "where": " <- ".join(reversed(stat.traceback.format(limit=TRACE_DEPTH))),
            "kib": stat.size_diff / 1024,
            "blocks": stat.count_diff,
        }
        for stat in diff[:top]
    ]


# ---------------------------------------------------------------------------------------------
# driving the sizes


def run_size(group: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    folder = work / f"group-{group}"
    folder.mkdir(parents=True)
    out = folder / "result.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--group", str(group)]
    command += ["--num-envs", str(args.num_envs), "--max-steps", str(args.max_steps), "--top", str(args.top)]
    command += ["--work", str(folder), "--out", str(out)]
    command += [flag for flag, on in FLAGS.items() if getattr(args, on)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"group {group} failed with code {done.returncode}:\n{tail}")
    return json.loads(out.read_text())


FLAGS = {"--tracemalloc": "tracemalloc", "--no-video": "no_video", "--no-dataset": "no_dataset"}
"""Options the parent passes on to each size's process."""


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'size':>5} {'group':>5} {'episodes':>8} {'frames':>7} {'eval s':>7} {'parent peak MiB':>15} "
        f"{'parent after MiB':>16} {'largest child MiB':>17} {'children sum MiB':>16}"
    )
    print(header)
    print("-" * len(header))
    base = rows[0]["group"]
    for r in rows:
        frames = "-" if r["frames"] is None else str(r["frames"])
        print(
            f"{r['group'] // base:>4}x {r['group']:>5} {r['episodes']:>8} {frames:>7} {r['seconds']:>7.1f} "
            f"{r['parent_peak_mib']:>15.1f} {r['parent_rss_after_mib']:>16.1f} {r['largest_child_peak_mib']:>17.1f} "
            f"{r['children_sum_peak_mib']:>16.1f}"
        )


def print_held(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if not r["held"]:
            continue
        peak = r["traced_peak_mib"]
        print(f"\ngroup {r['group']}: Python memory grown from before the eval to its traced peak ({peak:.0f} MiB)")
        for h in r["held"]:
            print(f"  {h['kib']:>9.1f} KiB {h['blocks']:>7} blocks  {h['where']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", type=int, nargs="+", default=[2, 8, 32], help="instances per size (default 2 8 32)")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="group 1 and 4, 40 steps (a smoke run)")
    parser.add_argument("--tracemalloc", action="store_true", help="also list what Python memory the parent holds")
    parser.add_argument("--no-video", action="store_true", help="traces without video (to tell the parts apart)")
    parser.add_argument("--no-dataset", action="store_true", help="no dataset (to tell the parts apart)")
    parser.add_argument("--top", type=int, default=12, help="lines of the --tracemalloc listing (default 12)")
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.group = args.group[0]
        Path(args.out).write_text(json.dumps(child(args)))
        return
    if args.quick:
        args.group, args.max_steps = [1, 4], 40
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-memory-"))
    load_before = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f}", flush=True)
    rows = [run_size(group, args, work) for group in args.group]
    print_table(rows)
    print_held(rows)
    base = rows[0]
    ratios = {
        f"{r['group'] // base['group']}x": {
            "episodes": r["episodes"] / base["episodes"],
            "parent_peak": r["parent_peak_mib"] / base["parent_peak_mib"],
            "parent_after": r["parent_rss_after_mib"] / base["parent_rss_after_mib"],
            "children_sum_peak": r["children_sum_peak_mib"] / base["children_sum_peak_mib"],
        }
        for r in rows[1:]
    }
    print()
    for size, ratio in ratios.items():
        print(
            f"{size} the episodes: parent peak RSS {ratio['parent_peak']:.3f}x, after the eval "
            f"{ratio['parent_after']:.3f}x, children's summed peak {ratio['children_sum_peak']:.3f}x"
        )
    summary: dict[str, Any] = {
        "bench": "memory",
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "pipeline": pipeline(
            "memory_bench",
            0,
            num_envs=args.num_envs,
            max_steps=args.max_steps,
            video=not args.no_video,
            dataset=not args.no_dataset,
        ),
        "rows": [{k: v for k, v in r.items() if k != "held"} for r in rows],
        "ratios": ratios,
        "work_dir": str(work),
    }
    last = rows[-1]["group"] // base["group"]
    summary[f"parent_peak_ratio_{last}x"] = round(rows[-1]["parent_peak_mib"] / base["parent_peak_mib"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
