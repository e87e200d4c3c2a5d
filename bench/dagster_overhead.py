"""Fixed overhead of running an eval through Dagster, over the same eval through the Python API.

Runs one pipeline (default: the bundled CartPole eval) four ways, side by side, ``--repeats`` times
each, and reports medians and ratios to the direct Python API:

- ``python-api``: :func:`hud_pipelines.eval.steps.evaluate` in this process: the same steps (contract,
  rollouts, grades, report, dataset) with no Dagster at all, imports already paid;
- ``python-api, fresh process``: the same call in a new interpreter (imports included), the fair
  baseline for the two CLIs;
- ``execute_in_process``: the pipeline's Dagster job in this process on an ephemeral instance;
- ``hud-pipelines run``: the project's CLI in a fresh process (local instance, progress, summary);
- ``dagster job execute``: Dagster's CLI in a fresh process.

The two CLI figures include interpreter start-up and imports (dagster, torch-free agent code), i.e.
what a CI job pays per eval. Prints a table and, last, one JSON line.

    .venv/bin/python bench/dagster_overhead.py [--pipeline pipelines/cartpole.yaml] [--repeats 3]
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
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _python_api(pipeline: Path, outputs: Path) -> None:
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    evaluation = evaluate(load_pipeline(pipeline), outputs_dir=outputs, project_dir=REPO)
    assert not evaluation.failed_instances


def _in_process(pipeline: Path, outputs: Path) -> None:
    import dagster as dg

    from hud_pipelines.dagster.definitions import definitions_for_file
    from hud_pipelines.spec.loader import load_pipeline

    name = load_pipeline(pipeline).name
    defs = definitions_for_file(pipeline, outputs_dir=outputs, project_dir=REPO)
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(name).execute_in_process(instance=instance)
    assert result.success


def _subprocess(command: list[str], env: dict[str, str]) -> Callable[[Path, Path], None]:
    def run(pipeline: Path, outputs: Path) -> None:
        done = subprocess.run(
            command,
            check=False,
            env={**env, "HUD_PIPELINES_OUTPUTS": str(outputs)},
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", type=Path, default=REPO / "pipelines" / "cartpole.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from hud_pipelines.spec.loader import load_pipeline

    pipeline = args.pipeline.resolve()
    name = load_pipeline(pipeline).name
    scratch = Path(tempfile.mkdtemp(prefix="hud-bench-dagster-"))
    home = scratch / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "HF_HUB_OFFLINE": "1", "HUD_PIPELINES_DIR": str(pipeline.parent)}
    fresh = (
        "import sys; from pathlib import Path; from hud_pipelines.spec.loader import load_pipeline; "
        "from hud_pipelines.eval.steps import evaluate; "
        f"e = evaluate(load_pipeline(Path({str(pipeline)!r})), project_dir=Path.cwd()); "
        "sys.exit(1 if e.failed_instances else 0)"
    )
    ways: dict[str, Callable[[Path, Path], None]] = {
        "python-api": _python_api,
        "python-api, fresh process": _subprocess([sys.executable, "-W", "ignore", "-c", fresh], env),
        "execute_in_process": _in_process,
        "hud-pipelines run": _subprocess([str(BIN / "hud-pipelines"), "run", str(pipeline), "--quiet"], env),
        "dagster job execute": _subprocess(
            [str(BIN / "dagster"), "job", "execute", "-m", "hud_pipelines.definitions", "-j", name], env
        ),
    }
    os.environ.update({k: env[k] for k in ("DAGSTER_HOME", "HF_HUB_OFFLINE")})
    times: dict[str, list[float]] = {way: [] for way in ways}
    for repeat in range(args.repeats):
        for way, run in ways.items():  # interleaved, so load changes hit every way alike
            started = time.perf_counter()
            run(pipeline, scratch / f"out-{repeat}-{way.replace(' ', '_')}")
            times[way].append(time.perf_counter() - started)
    base = statistics.median(times["python-api"])
    fresh_base = statistics.median(times["python-api, fresh process"])
    print(f"{name}: median wall time over {args.repeats} repeats")
    print(f"{'way':<27} {'median s':>9} {'min s':>7} {'x python-api':>13} {'x fresh api':>12} {'overhead s':>11}")
    summary: dict[str, dict[str, float]] = {}
    for way, samples in times.items():
        median = statistics.median(samples)
        fresh_process = way in ("python-api, fresh process", "hud-pipelines run", "dagster job execute")
        reference = fresh_base if fresh_process else base
        summary[way] = {
            "median_s": round(median, 3),
            "ratio": round(median / base, 2),
            "ratio_to_fresh_api": round(median / fresh_base, 2),
            "overhead_s": round(median - reference, 3),
        }
        print(
            f"{way:<27} {median:>9.2f} {min(samples):>7.2f} {median / base:>13.2f} {median / fresh_base:>12.2f} "
            f"{median - reference:>11.2f}"
        )
    print(json.dumps({"bench": "dagster_overhead", "pipeline": name, "repeats": args.repeats, "results": summary}))


if __name__ == "__main__":
    main()
