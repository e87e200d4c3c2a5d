"""``make train-demo``: a policy trained on this project's own expert demonstrations, every checkpoint evaluated.

Nothing comes from a model hub: the project makes its own data and weights, on the CPU.

1. **Demonstrations**: ``hud-pipelines run metaworld_reach_demos`` drives MetaWorld reach-v3 with its
   scripted expert (100 episodes, seeds 0..99) and writes them as a LeRobot dataset
   (``<outputs>/datasets/metaworld_reach_demos``), as any eval with a ``dataset:`` section does.
2. **Training**: ``lerobot-train`` fits a small ACT on that dataset (state only, CPU), saving a
   checkpoint every ``--save-freq`` steps into the directory the sweep watches
   (``<outputs>/train/metaworld_reach_act``, the sweep's ``agent.policy.checkpoints``).
3. **Sweep**: ``hud-pipelines run pipelines/train_demo/metaworld_reach_sweep.yaml`` evaluates every
   checkpoint on the same 100 held-out episodes (seeds from 100000), and writes the comparison
   (success rate per checkpoint with its 95% Wilson interval, paired tests between checkpoints) into its report.

The summary (each stage's wall time, the expert's and every checkpoint's success with their
intervals) is printed and written to ``<outputs>/train_demo.json``. ``<outputs>`` is
``$HUD_PIPELINES_OUTPUTS`` or ``./outputs`` (``--outputs`` sets it). A training run already complete
in that directory is kept (``--retrain`` replaces it), and the sweep evaluates only the checkpoints
it has no current result for, so a second ``make train-demo`` costs the demonstrations only.

The smaller knobs (``--demo-group``, ``--sweep-group``, ``--steps``, ...) make the shortened run of
``tests/eval/test_train_demo.py``; the defaults are the measured run of the README.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hud_pipelines.spec.models import PipelineSpec

PROJECT = Path(__file__).resolve().parents[1]
DEMOS = "metaworld_reach_demos"
SWEEP = "metaworld_reach_sweep"
SWEEP_FILE = Path("pipelines") / "train_demo" / f"{SWEEP}.yaml"
"""Beside, not in, ``pipelines/``: its training run exists only once this script made it, so a fresh
checkout's ``hud-pipelines validate pipelines/`` and code location do not list a sweep of nothing."""
SUMMARY_FILE = "train_demo.json"
DEMO_GROUP_ENV = "DEMO_GROUP"
"""Instances of the demonstrations pipeline (``group: ${DEMO_GROUP:-25}`` in its YAML)."""
SWEEP_GROUP_ENV = "SWEEP_GROUP"
"""Instances of the sweep per checkpoint (``group: ${SWEEP_GROUP:-25}`` in its YAML)."""
OUTPUTS_ENV = "HUD_PIPELINES_OUTPUTS"
TRAINING_MODULES = ("accelerate", "psutil")
"""What ``lerobot-train`` imports beyond lerobot itself (lerobot's ``training`` extra)."""
CHECKPOINT_FIGURES = ("checkpoint", "step", "episodes", "succeeded", "errored", "success_rate", "ci_low", "ci_high")
"""What the summary keeps of each checkpoint's row of the sweep's comparison (its ``all`` row)."""
TRAINING_FIGURES = ("steps", "save_freq", "batch_size", "num_workers", "torch_threads")
"""The settings of the training the summary records beside the policy's."""
SETTLE_TIMEOUT_S = 120.0
"""How long the sweep waits for the last checkpoint's files to settle after training."""

ACT: dict[str, str] = {
    # A small ACT: state only (no image backbone), no VAE (the expert is deterministic), chunks of 10
    # actions of which 5 are executed before the next forward.
    "type": "act",
    "device": "cpu",
    "push_to_hub": "false",
    "dim_model": "128",
    "n_heads": "4",
    "dim_feedforward": "512",
    "n_encoder_layers": "2",
    "n_decoder_layers": "1",
    "chunk_size": "10",
    "n_action_steps": "5",
    "use_vae": "false",
    "optimizer_lr": "1e-4",
    # ACT normalises state and actions by the dataset's mean and std but leaves environment_state raw
    # by default; the goal and the objects then vary by a few centimetres on inputs of order one.
    "normalization_mapping": json.dumps(dict.fromkeys(("VISUAL", "STATE", "ENV", "ACTION"), "MEAN_STD")),
}
"""``--policy.*`` of ``lerobot-train``."""


@dataclass(frozen=True)
class Settings:
    """What one ``make train-demo`` does; the defaults are the README's measured run."""

    outputs: Path
    demo_group: int | None = None
    """Instances of 4 demonstrations; ``None``: the YAML's (25, 100 episodes)."""
    sweep_group: int | None = None
    """Instances of 4 held-out episodes per checkpoint; ``None``: the YAML's (25, 100 episodes)."""
    steps: int = 5000
    save_freq: int = 500
    batch_size: int = 64
    num_workers: int = 1
    """lerobot-train's data loader processes: one prepares the next batch while the model updates."""
    torch_threads: int = 1
    """Threads of the update. Beside other jobs on two cores, two threads wait on each other: steps of up to 2-3 s
    were measured with two, 0.1-0.2 s with one."""
    seed: int = 1000
    retrain: bool = False


@dataclass(frozen=True)
class Stage:
    name: str
    wall_s: float
    kept: bool = False
    """Its outputs were there already (a complete training run), so nothing ran."""


class TrainDemoError(Exception):
    """A stage that cannot go on, with what to do about it."""


# -- the stages ------------------------------------------------------------------------------------


def record_demonstrations(settings: Settings, env: dict[str, str]) -> Stage:
    """The expert's episodes, graded, reported and written as a LeRobot dataset by the project's own eval."""
    return _stage("demonstrations", [_tool("hud-pipelines"), "run", DEMOS], env)


def train(settings: Settings, env: dict[str, str], dataset: Path, repo_id: str, run_dir: Path) -> Stage:
    """``lerobot-train`` into ``run_dir``, unless a complete run of ``settings.steps`` is there already."""
    if run_dir.exists():
        if settings.retrain:
            shutil.rmtree(run_dir)
        elif _finished_step(run_dir) == settings.steps:
            print(f"train-demo: keeping the complete training run in {run_dir} (--retrain trains again)", flush=True)
            return Stage("training", 0.0, kept=True)
        else:
            raise TrainDemoError(
                f"{run_dir} holds another or an unfinished training run (not {settings.steps} steps); "
                "pass --retrain to replace it"
            )
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    command = [
        _tool("lerobot-train"),
        f"--dataset.repo_id={repo_id}",
        f"--dataset.root={dataset}",
        *(f"--policy.{key}={value}" for key, value in ACT.items()),
        f"--batch_size={settings.batch_size}",
        f"--steps={settings.steps}",
        f"--save_freq={settings.save_freq}",
        f"--log_freq={max(1, min(settings.save_freq, 250))}",
        f"--num_workers={settings.num_workers}",
        f"--seed={settings.seed}",
        "--wandb.enable=false",
        f"--output_dir={run_dir}",
        f"--job_name={run_dir.name}",
    ]
    return _stage("training", command, {**env, "OMP_NUM_THREADS": str(settings.torch_threads)})


def evaluate_checkpoints(env: dict[str, str]) -> Stage:
    """Every complete checkpoint of the run on the sweep's held-out episodes (pairs already evaluated are kept)."""
    return _stage("sweep", [_tool("hud-pipelines"), "run", str(PROJECT / SWEEP_FILE)], env)


# -- orchestration ---------------------------------------------------------------------------------


def run(settings: Settings) -> dict[str, Any]:
    """The three stages and their summary (also written to ``<outputs>/train_demo.json``)."""
    env = child_environment(settings)
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.spec.loader import load_pipeline

    demos = load_pipeline(PROJECT / "pipelines" / f"{DEMOS}.yaml", env=env)
    sweep = load_pipeline(PROJECT / SWEEP_FILE, env=env)
    run_dir = training_dir(sweep)
    check_training_dependencies()
    stages = [record_demonstrations(settings, env)]
    dataset = EvalOutputs(settings.outputs, DEMOS).dataset
    stages.append(train(settings, env, dataset, demos.dataset_repo_id, run_dir))
    wait_until_settled(sweep)
    stages.append(evaluate_checkpoints(env))
    summary = summarize(settings, stages, run_dir)
    path = settings.outputs / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=1) + "\n")
    print_summary(summary, path)
    return summary


def child_environment(settings: Settings) -> dict[str, str]:
    """The stages' environment: this checkout first on the path, outputs and group sizes, nothing from a hub."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH", "")) if p)
    env[OUTPUTS_ENV] = str(settings.outputs)
    env["HF_HUB_OFFLINE"] = "1"
    for name, value in ((DEMO_GROUP_ENV, settings.demo_group), (SWEEP_GROUP_ENV, settings.sweep_group)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def training_dir(sweep: PipelineSpec) -> Path:
    """The run directory the sweep watches (its ``agent.policy.checkpoints``), where lerobot-train writes."""
    checkpoints = getattr(sweep.agent.policy, "checkpoints", None)
    if not isinstance(checkpoints, str):
        raise TrainDemoError(f"{SWEEP}.yaml: agent.policy.checkpoints must name one training run directory")
    return sweep.resolve_path(checkpoints)


def check_training_dependencies() -> None:
    """Refuse before any stage runs when ``lerobot-train`` could not start in this environment."""
    missing = [name for name in TRAINING_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise TrainDemoError(
            f"lerobot-train needs {', '.join(missing)} (lerobot's 'training' extra), which {sys.executable} "
            "lacks: add it to the project's dependencies"
        )


def wait_until_settled(sweep: PipelineSpec, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until no checkpoint of the run is still settling, so that the sweep evaluates every one."""
    from hud_pipelines.eval import sweep as sweeps

    deadline = time.monotonic() + timeout_s
    while True:
        found = sweeps.discover(sweep)
        if found.complete and not found.pending:
            return
        if time.monotonic() > deadline:
            waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending) or "none written"
            raise TrainDemoError(f"checkpoints still incomplete after {timeout_s:g} s: {waiting}")
        time.sleep(1.0)


def summarize(settings: Settings, stages: Sequence[Stage], run_dir: Path) -> dict[str, Any]:
    """Wall times, the expert's success and every checkpoint's, each with its 95% Wilson interval."""
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.eval.grades import summarize as summarize_rows
    from hud_pipelines.eval.outputs import EvalOutputs

    rows = [GradeRow.from_dict(r) for r in json.loads(EvalOutputs(settings.outputs, DEMOS).grades_json.read_text())]
    expert = summarize_rows(rows)
    low, high = expert.success_interval
    comparison = json.loads((EvalOutputs(settings.outputs, SWEEP).base / "comparison.json").read_text())
    checkpoints = [{key: row[key] for key in CHECKPOINT_FIGURES} for row in comparison["rows"] if row["task"] == "all"]
    return {
        "stages": {stage.name: round(stage.wall_s, 1) for stage in stages},
        "kept": [stage.name for stage in stages if stage.kept],
        "expert": {
            "episodes": expert.scheduled,
            "succeeded": expert.succeeded,
            "errored": expert.errored,
            "success_rate": expert.success_rate,
            "ci_low": low,
            "ci_high": high,
        },
        "training": {
            "run": str(run_dir),
            **{key: getattr(settings, key) for key in TRAINING_FIGURES},
            "policy": ACT,
        },
        "checkpoints": checkpoints,
        "best": comparison.get("best"),
    }


def print_summary(summary: dict[str, Any], path: Path) -> None:
    expert = summary["expert"]
    lines = [
        "train-demo: "
        + ", ".join(
            f"{name} kept" if name in summary["kept"] else f"{name} {wall:.0f} s"
            for name, wall in summary["stages"].items()
        ),
        f"  expert       {_rate(expert)} ({expert['episodes']} demonstrations)",
        *(f"  {c['checkpoint']:<12} {_rate(c)} (step {c['step']}, held-out)" for c in summary["checkpoints"]),
        f"summary in {path}",
    ]
    print("\n".join(lines), flush=True)


def _rate(figures: dict[str, Any]) -> str:
    rate = figures["success_rate"]
    if rate is None:
        return "no graded episode"
    interval = f"95% CI {figures['ci_low']:.0%}-{figures['ci_high']:.0%}"
    return f"{figures['succeeded']}/{figures['episodes']} = {rate:.0%} ({interval})"


def _finished_step(run_dir: Path) -> int | None:
    """The step of the run's ``checkpoints/last`` when it is a complete checkpoint folder, else ``None``."""
    last = run_dir / "checkpoints" / "last"
    if not (last / "pretrained_model" / "config.json").is_file():
        return None
    name = last.resolve().name
    return int(name) if name.isdigit() else None


def _tool(name: str) -> str:
    """A console script of this interpreter's environment (where ``make`` put it), else from ``PATH``."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise TrainDemoError(f"{name} is not installed beside {sys.executable} nor on PATH: run `make setup`")
    return found


def _stage(name: str, command: list[str], env: dict[str, str]) -> Stage:
    print(f"train-demo: {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    completed = subprocess.run(command, cwd=PROJECT, env=env, check=False)
    wall_s = time.monotonic() - started
    if completed.returncode != 0:
        raise TrainDemoError(f"{name} failed (exit {completed.returncode} after {wall_s:.0f} s): {' '.join(command)}")
    return Stage(name, wall_s)


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    defaults = Settings(outputs=Path("outputs"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--outputs", type=Path, help="outputs root (default: $HUD_PIPELINES_OUTPUTS or ./outputs)")
    parser.add_argument("--demo-group", type=int, help="instances of 4 expert episodes (default: the YAML's 25)")
    parser.add_argument("--sweep-group", type=int, help="instances of 4 held-out episodes per checkpoint (default 25)")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    parser.add_argument("--save-freq", type=int, default=defaults.save_freq, help="steps between checkpoints")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--num-workers", type=int, default=defaults.num_workers, help="lerobot-train data loaders")
    parser.add_argument("--torch-threads", type=int, default=defaults.torch_threads, help="threads of the update")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="lerobot-train's seed")
    parser.add_argument("--retrain", action="store_true", help="replace a training run already in the run directory")
    args = parser.parse_args(argv)
    configured = os.environ.get(OUTPUTS_ENV)
    outputs = args.outputs or (Path(configured) if configured else PROJECT / "outputs")
    return Settings(
        outputs=outputs.expanduser().resolve(),
        demo_group=args.demo_group,
        sweep_group=args.sweep_group,
        steps=args.steps,
        save_freq=args.save_freq,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        torch_threads=args.torch_threads,
        seed=args.seed,
        retrain=args.retrain,
    )


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(PROJECT))
    try:
        run(parse_settings(argv))
    except TrainDemoError as exc:
        print(f"train-demo: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
