"""What ``hud-pipelines run`` and ``hud-pipelines contract`` do.

``run`` executes a pipeline's Dagster job on the *local* Dagster instance (``$DAGSTER_HOME``, or
``.dagster_home/`` in the project, created with telemetry off), so every CLI run shows up in
``dagster dev`` with its history. It draws a progress bar over the pipeline's instances and ends
with a per-slot table and the success rate with its interval and denominators. The exit code is 0
when the run succeeded (every instance ran and every blocking check passed), 1 otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.grading import GradeRow, summarize
from hud_pipelines.recording import EpisodeStatus

if TYPE_CHECKING:
    from dagster import ExecuteInProcessResult
    from rich.console import Console

    from hud_pipelines.eval import InstanceResult

DAGSTER_HOME_ENV = "DAGSTER_HOME"
LOCAL_DAGSTER_HOME = ".dagster_home"
STATUS_STYLE = {
    EpisodeStatus.SUCCEEDED: "green",
    EpisodeStatus.FAILED: "red",
    EpisodeStatus.ERRORED: "yellow",
}


def ensure_dagster_home(project_dir: Path) -> Path:
    """``$DAGSTER_HOME`` if set, else ``<project>/.dagster_home``; created with telemetry disabled."""
    configured = os.environ.get(DAGSTER_HOME_ENV)
    home = Path(configured).expanduser().resolve() if configured else (project_dir / LOCAL_DAGSTER_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists():
        settings.write_text("telemetry:\n  enabled: false\n")
    os.environ[DAGSTER_HOME_ENV] = str(home)
    return home


def resolve_pipeline_file(pipeline: str, pipelines_dir: Path | None) -> Path:
    """A path as given, else ``<pipelines_dir>/<name>.yaml`` (or the file whose ``name`` matches)."""
    candidate = Path(pipeline)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise HudPipelinesError(f"pipeline file {candidate} does not exist")
        return candidate.resolve()
    from hud_pipelines.dagster.definitions import default_pipelines_dir
    from hud_pipelines.spec.loader import load_pipelines

    directory = (pipelines_dir or default_pipelines_dir()).resolve()
    for suffix in (".yaml", ".yml"):
        if (directory / f"{pipeline}{suffix}").is_file():
            return directory / f"{pipeline}{suffix}"
    specs = load_pipelines(directory) if directory.is_dir() else []
    for spec in specs:
        if spec.name == pipeline and spec.source is not None:
            return spec.source
    known = ", ".join(sorted(s.name for s in specs)) or "none"
    raise HudPipelinesError(f"no pipeline named {pipeline!r} in {directory} (known: {known})")


def run_pipeline(
    pipeline: str,
    *,
    pipelines_dir: Path | None = None,
    outputs_dir: Path | None = None,
    partitions: list[str] | None = None,
    quiet: bool = False,
) -> int:
    """Run one pipeline's job in this process on the local Dagster instance; returns the exit code."""
    path = resolve_pipeline_file(pipeline, pipelines_dir)
    project_dir = Path.cwd()
    ensure_dagster_home(project_dir)

    import dagster as dg

    from hud_pipelines import progress
    from hud_pipelines.dagster.assets import RANGE_END_TAG, RANGE_START_TAG
    from hud_pipelines.dagster.definitions import definitions_for_file
    from hud_pipelines.outputs import EvalOutputs, default_outputs_root
    from hud_pipelines.spec.loader import load_pipeline
    from hud_pipelines.steps import collect_rows

    spec = load_pipeline(path)
    outputs = EvalOutputs((outputs_dir or default_outputs_root()).resolve(), spec.name)
    defs = definitions_for_file(path, outputs_dir=outputs.root, project_dir=project_dir)
    job = defs.resolve_job_def(spec.name)
    keys = spec.partition_keys()
    selected = partitions or keys
    unknown = sorted(set(selected) - set(keys))
    if unknown:
        raise HudPipelinesError(f"{spec.name} has no instance(s) {unknown}; known: {', '.join(keys)}")
    ordered = [k for k in keys if k in selected]
    first = keys.index(ordered[0])
    if ordered != keys[first : first + len(ordered)]:
        raise HudPipelinesError(f"--partition values must form a contiguous range of {', '.join(keys)}")
    tags = {RANGE_START_TAG: ordered[0], RANGE_END_TAG: ordered[-1]}
    from rich.console import Console

    console = Console(stderr=True)
    logging.getLogger("hud_pipelines").setLevel(logging.WARNING)
    # Dagster's console logger would print every failure with a stack trace; the summary below says
    # what failed in a line each, and the full event log stays in the instance (`dagster dev`).
    run_config = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    with (
        dg.DagsterInstance.get() as instance,
        _progress(console, spec.name, len(ordered), quiet) as on_result,
        progress.listening(on_result),
    ):
        result = job.execute_in_process(instance=instance, tags=tags, run_config=run_config, raise_on_error=False)
    rows = collect_rows(spec, outputs)
    _print_summary(spec.name, rows, result.success, result.run_id, outputs.base, _problems(result))
    return 0 if result.success else 1


def _problems(result: ExecuteInProcessResult) -> list[str]:
    """One line per failed step or failed check of a run."""
    problems: list[str] = []
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            blocking = "blocking " if evaluation.severity.value == "ERROR" else ""
            description = evaluation.description or ""
            problems.append(f"{blocking}check {evaluation.check_name} failed: {description}")
    for event in result.all_events:
        if event.event_type_value != "STEP_FAILURE":
            continue
        error = event.step_failure_data.error
        if error is None or error.cls_name == "DagsterAssetCheckFailedError":  # reported above
            continue
        cause = error.cause if error.cls_name == "DagsterExecutionStepExecutionError" and error.cause else error
        lines = cause.message.strip().splitlines()
        problems.append(f"step {event.step_key} failed: {' / '.join(lines[:6])}")
    return problems


@contextlib.contextmanager
def _progress(console: Console, name: str, total: int, quiet: bool) -> Generator[Callable[[InstanceResult], None]]:
    """A rich progress bar over instances (nothing with ``quiet``); yields the per-result callback."""
    if quiet:
        yield lambda result: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn(f"[bold]{name}[/bold] instances"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("", total=total)
        yield lambda result: bar.update(
            task, advance=1, description=f"{result.key} {'FAILED' if result.failed else 'ok'}"
        )


def _print_summary(
    name: str, rows: list[GradeRow], succeeded: bool, run_id: str, base: Path, problems: list[str]
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=f"{name}: per-slot grades")
    for column in ("task", "instance", "slot", "seed", "status", "score", "return", "steps", "error"):
        table.add_column(
            column, justify="right" if column in ("instance", "slot", "seed", "score", "return", "steps") else "left"
        )
    for row in rows:
        style = STATUS_STYLE[row.status]
        table.add_row(
            row.task,
            str(row.instance),
            str(row.slot),
            str(row.seed),
            f"[{style}]{row.status.value}[/{style}]",
            f"{row.score:.3g}",
            f"{row.total_reward:.3g}",
            str(row.steps),
            (row.error or "")[:60],
        )
    console.print(table)
    summary = summarize(rows)
    rate = summary.success_rate
    low, high = summary.success_interval
    rate_text = "n/a" if rate is None else f"{rate:.1%} (95% CI {low:.1%}-{high:.1%})"
    console.print(
        f"success rate {rate_text}; scheduled {summary.scheduled} = succeeded {summary.succeeded} + failed "
        f"{summary.failed} + errored {summary.errored}"
    )
    for problem in problems:
        console.print(f"[red]{problem}[/red]", markup=True, highlight=False)
    verdict = "[green]run succeeded[/green]" if succeeded else "[red]run FAILED[/red]"
    console.print(f"{verdict} (run {run_id}); outputs in {base}")


def write_contract(pipeline: str, *, pipelines_dir: Path | None = None, out: Path | None = None) -> int:
    """Start the pipeline's sim once, derive its contract, refresh the file with it, print the features.

    The sim starts exactly as the eval starts it, except that it derives its contract in memory: the
    file is refreshed here (:func:`~hud_pipelines.contract.refresh_contract`), so a file written for
    an env whose shapes have changed since is brought up to date, keeping the edits that still fit,
    where the eval refuses it. Each changed feature is printed (old -> new shape, names dropped).
    """
    from rich.console import Console
    from rich.table import Table

    from hud_pipelines.contract import load_contract, refresh_contract
    from hud_pipelines.eval import sim_settings
    from hud_pipelines.simpool import SimPool
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(resolve_pipeline_file(pipeline, pipelines_dir))
    target = out.resolve() if out is not None else spec.contract_path
    settings = dataclasses.replace(sim_settings(spec, cwd=Path.cwd()), contract_path=None)
    with SimPool(settings) as pool, pool.sim() as live:
        contract = live.client.contract
    if target is None:
        outcome = "not written (the pipeline sets no sim.contract; use --out)"
    elif target.exists():
        edited = load_contract(target)
        contract, changes = refresh_contract(edited, contract)
        if changes:  # an unchanged file keeps its user's formatting
            target.write_text(contract.to_json())
        noun = "feature" if len(changes) == 1 else "features"
        summary = f"refreshed {target}: {len(changes)} {noun} changed" if changes else f"{target} is up to date"
        outcome = "\n".join([*changes, summary])
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(contract.to_json())
        outcome = f"written to {target}"
    table = Table(title=f"{spec.name}: contract ({contract.control_rate:g} Hz, robot {contract.robot_type})")
    for column in ("feature", "role", "type", "dtype", "shape", "names"):
        table.add_column(column)
    for name, feature in contract.features.items():
        names = ", ".join(feature.names or [])
        table.add_row(
            name,
            feature.role,
            feature.type.value,
            feature.dtype,
            str(list(feature.shape)),
            names if len(names) < 60 else names[:57] + "...",
        )
    Console().print(table)
    print(outcome)
    return 0
