"""Dataset writing: the asset's path (sink + merge + atomic publish) vs a plain lerobot loop, same frames.

Frames are real PushT frames (96x96 RGB camera, 2-d state, 2-d action) rendered once and replayed.
Every measurement runs in its own subprocess, so peak RSS (``ru_maxrss``) belongs to that run alone;
lerobot is imported before the clock starts in every mode. Modes:

- ``plain``: ``LeRobotDataset.create`` with lerobot's defaults, ``add_frame`` per frame,
  ``save_episode`` per episode, ``finalize`` (one thread, the loop a user would write);
- ``plain-h264``: the same loop with the asset's codec, to separate the codec from the pipeline;
- ``asset``: what the dataset asset does with default options (one writer thread, h264, camera
  frames encoded from memory by the part's hooks into lerobot):
  ``DatasetBuild`` -> one shard sink fed through the ``EpisodeSink`` calls the agent loop makes (two
  slots interleaved), then ``publish()`` (close, merge, swap in).

Start-up is timed apart: the plain loop's clock starts after ``import lerobot``, the asset's after
``sink.wait_ready()`` (the writer thread imports lerobot); the table shows that start-up in its own
column.

Besides wall-clock frames/s it reports CPU time per frame (all threads), which depends far less on
how busy the machine is than wall-clock time, and the load average while it ran. Peak RSS is the
measuring process's.

Sizes grow 1x, 4x, 16x in episodes. It prints a table, then ratios, and last one JSON line.

    .venv/bin/python bench/dataset.py            # 4 / 16 / 64 episodes of 150 frames
    .venv/bin/python bench/dataset.py --quick    # 2 / 8 / 32 episodes of 60 frames
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["HF_HUB_OFFLINE"] = "1"

MODES = ("plain", "plain-h264", "asset")
TASK = "push the T into the target"


def render_frames(path: Path, steps: int) -> None:
    """One PushT episode of ``steps`` frames under a random policy, saved for every run to replay."""
    import gym_pusht  # noqa: F401  # pyright: ignore[reportUnusedImport]
    import gymnasium as gym

    env = gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos")
    rng = np.random.default_rng(0)
    observation, _ = env.reset(seed=0)
    pixels: list[Any] = []
    state: list[Any] = []
    actions: list[Any] = []
    rewards: list[float] = []
    for _ in range(steps):
        action = rng.uniform(0, 512, size=2).astype(np.float32)
        pixels.append(observation["pixels"])
        state.append(observation["agent_pos"])
        actions.append(action)
        observation, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            observation, _ = env.reset(seed=1)
    env.close()
    np.savez(path, pixels=np.stack(pixels), state=np.stack(state), action=np.stack(actions), reward=rewards)


# ---------------------------------------------------------------------------------------------
# one measurement (child process)


def contract() -> Any:
    from hud_pipelines.contract import Contract, Feature, FeatureType

    return Contract(
        control_rate=10,
        robot_type="pusht",
        features={
            "pixels": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(96, 96, 3)),
            "agent_pos": Feature(role="observation", dtype="float64", shape=(2,), names=["x", "y"]),
            "action": Feature(
                role="action", dtype="float32", shape=(2,), names=["x", "y"], low=[0, 0], high=[512, 512]
            ),
        },
    )


def run_plain(frames: Any, episodes: int, root: Path, codec: str | None) -> dict[str, Any]:
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.images.pixels": {"dtype": "video", "shape": (96, 96, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
    }
    encoder = RGBEncoderConfig(vcodec=codec, preset="ultrafast") if codec == "h264" else None
    steps = len(frames["action"])
    calls: list[float] = []
    start = time.perf_counter()
    dataset = LeRobotDataset.create("local/plain", 10, features, root=root, robot_type="pusht", rgb_encoder=encoder)
    for _ in range(episodes):
        for i in range(steps):
            row = {
                "observation.images.pixels": frames["pixels"][i],
                "observation.state": frames["state"][i].astype(np.float32),
                "action": frames["action"][i],
                "next.reward": np.array([frames["reward"][i]], dtype=np.float32),
                "next.done": np.array([i == steps - 1]),
                "next.success": np.array([False]),
                "task": TASK,
            }
            t = time.perf_counter()
            dataset.add_frame(row)
            calls.append(time.perf_counter() - t)
        t = time.perf_counter()
        dataset.save_episode()
        calls.append(time.perf_counter() - t)
    dataset.finalize()
    return {"seconds": time.perf_counter() - start, "calls": calls, "startup": 0.0}


def run_asset(frames: Any, episodes: int, root: Path) -> dict[str, Any]:
    from hud_pipelines.dataset.publish import DatasetBuild
    from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus, Frame

    steps = len(frames["action"])
    slots = 2
    calls: list[float] = []
    started = time.perf_counter()
    with DatasetBuild(root, contract(), repo_id="local/asset") as build:
        sink = build.sink("instance-0")
        sink.wait_ready()  # like lerobot's import in the plain loop, writer start-up is timed apart
        start = time.perf_counter()
        for first in range(0, episodes, slots):
            keys = [EpisodeKey("bench", 0, 0, s, first + s, first + s) for s in range(min(slots, episodes - first))]
            for k in keys:
                sink.begin(k, TASK)
            for i in range(steps):
                for k in keys:  # the agent loop's order: every running slot, one step at a time
                    frame = Frame(
                        index=i,
                        observation={"pixels": frames["pixels"][i], "agent_pos": frames["state"][i]},
                        action=frames["action"][i],
                        reward=float(frames["reward"][i]),
                        terminated=False,
                        truncated=i == steps - 1,
                        success=False,
                    )
                    t = time.perf_counter()
                    sink.add(k, frame)
                    calls.append(time.perf_counter() - t)
            for k in keys:
                outcome = EpisodeOutcome(EpisodeStatus.FAILED, 0.0, False, float(np.sum(frames["reward"])), steps)
                t = time.perf_counter()
                sink.end(k, outcome)
                calls.append(time.perf_counter() - t)
        published = build.publish()
    assert published.episodes == episodes, published
    return {"seconds": time.perf_counter() - start, "calls": calls, "startup": start - started}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def child(mode: str, episodes: int, frames_path: Path, out: Path) -> None:
    import lerobot.datasets.aggregate  # pyright: ignore[reportUnusedImport]
    import lerobot.datasets.lerobot_dataset  # noqa: F401  # pyright: ignore[reportUnusedImport]

    loaded = np.load(frames_path)
    frames = {k: loaded[k] for k in loaded.files}
    root = out / "dataset"
    cpu = time.process_time() + _children_cpu()
    if mode.startswith("asset"):
        result = run_asset(frames, episodes, root)
    else:
        result = run_plain(frames, episodes, root, "h264" if mode == "plain-h264" else None)
    cpu = time.process_time() + _children_cpu() - cpu
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    written = LeRobotDataset(f"local/{mode}", root=root)
    calls = np.asarray(result["calls"]) * 1e3
    report = {
        "mode": mode,
        "episodes": written.num_episodes,
        "frames": written.num_frames,
        "seconds": result["seconds"],
        "fps": written.num_frames / result["seconds"],
        "cpu_ms_per_frame": 1e3 * cpu / written.num_frames,
        "startup_s": result["startup"],
        "load": os.getloadavg()[0],
        "call_p99_ms": float(np.percentile(calls, 99)),
        "call_max_ms": float(calls.max()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "size_mb": sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20,
    }
    print(json.dumps(report), flush=True)


# ---------------------------------------------------------------------------------------------
# the comparison (parent process)


def measure(mode: str, episodes: int, frames_path: Path, repeat: int) -> dict[str, Any]:
    """Best of ``repeat`` runs (the least disturbed by other load); peak RSS is the largest seen."""
    runs: list[dict[str, Any]] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix=f"bench-dataset-{mode}-") as out:
            command = [sys.executable, __file__, "--child", mode, "--episodes", str(episodes)]
            command += ["--frames", str(frames_path), "--out", out]
            done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{mode} x{episodes} failed:\n{done.stderr[-4000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    return best | {"peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--episodes", type=int, help="episodes at 1x (default 8, quick 2)")
    parser.add_argument("--steps", type=int, help="frames per episode (default 150, quick 60)")
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest counts")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.episodes, args.frames, args.out)
        return

    base = args.episodes or (2 if args.quick else 4)
    steps = args.steps or (60 if args.quick else 150)
    scales = [int(s) for s in args.scales.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-dataset-") as tmp:
        frames_path = Path(tmp) / "frames.npz"
        render_frames(frames_path, steps)
        rows: list[dict[str, Any]] = []
        for scale in scales:
            for mode in MODES:  # interleaved, so every mode sees the same machine load at each size
                row = measure(mode, base * scale, frames_path, args.repeat)
                row["scale"] = scale
                rows.append(row)
                print(
                    f"  measured {mode:10s} x{scale:<3d} {row['frames']:6d} frames {row['fps']:7.0f} fps",
                    file=sys.stderr,
                    flush=True,
                )

    header = f"{'mode':11s} {'scale':>5s} {'episodes':>8s} {'frames':>7s} {'seconds':>8s} {'frames/s':>9s} "
    header += f"{'CPU ms/frame':>12s} {'call p99 ms':>11s} {'call max ms':>11s} {'peak RSS MB':>11s} "
    header += f"{'size MB':>8s} "
    header += f"{'start s':>7s} {'load':>5s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['mode']:11s} {r['scale']:>4d}x {r['episodes']:8d} {r['frames']:7d} {r['seconds']:8.2f} "
            f"{r['fps']:9.0f} {r['cpu_ms_per_frame']:12.2f} {r['call_p99_ms']:11.3f} {r['call_max_ms']:11.1f} "
            f"{r['peak_rss_mb']:11.0f} {r['size_mb']:8.2f} {r['startup_s']:7.1f} "
            f"{r['load']:5.1f}"
        )

    def by(mode: str) -> dict[int, dict[str, Any]]:
        return {r["scale"]: r for r in rows if r["mode"] == mode}

    plain, plain_h264, asset = by("plain"), by("plain-h264"), by("asset")
    frames_total = {m: sum(r["frames"] for r in by(m).values()) for m in MODES}
    seconds_total = {m: sum(r["seconds"] for r in by(m).values()) for m in MODES}
    overall = {m: frames_total[m] / seconds_total[m] for m in MODES}
    ratio = overall["asset"] / overall["plain"]
    ratio_h264 = overall["asset"] / overall["plain-h264"]
    top = max(scales)
    rss_growth = {m: by(m)[top]["peak_rss_mb"] / by(m)[min(scales)]["peak_rss_mb"] for m in MODES}
    print()
    print(f"asset vs plain loop (lerobot defaults): {ratio:.2f}x frames/s over all sizes")
    print(f"asset vs plain loop with the same codec: {ratio_h264:.2f}x")
    for scale in scales:
        print(
            f"  x{scale}: asset {asset[scale]['fps']:.0f} fps, "
            f"plain {plain[scale]['fps']:.0f}, plain-h264 {plain_h264[scale]['fps']:.0f}"
        )
    cpu = {m: sum(r["cpu_ms_per_frame"] * r["frames"] for r in by(m).values()) / frames_total[m] for m in MODES}
    print("CPU ms/frame: " + ", ".join(f"{m} {v:.2f}" for m, v in cpu.items()))
    print(f"peak RSS {top}x / {min(scales)}x: " + ", ".join(f"{m} {g:.2f}" for m, g in rss_growth.items()))
    print(
        json.dumps(
            {
                "bench": "dataset",
                "cpus": os.cpu_count(),
                "episode_frames": steps,
                "episodes_1x": base,
                "repeat": args.repeat,
                "fps": {m: round(v, 1) for m, v in overall.items()},
                "asset_vs_plain": round(ratio, 3),
                "asset_vs_plain_same_codec": round(ratio_h264, 3),
                "cpu_ms_per_frame": {m: round(v, 3) for m, v in cpu.items()},
                "load_avg": round(float(np.mean([r["load"] for r in rows])), 2),
                "peak_rss_mb": {m: {str(s): round(r["peak_rss_mb"], 1) for s, r in by(m).items()} for m in MODES},
                "peak_rss_growth": {m: round(g, 3) for m, g in rss_growth.items()},
                "asset_call_p99_ms": {str(s): round(r["call_p99_ms"], 3) for s, r in asset.items()},
                "plain_call_p99_ms": {str(s): round(r["call_p99_ms"], 3) for s, r in plain.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
