"""What ``hud-pipelines run`` and ``hud-pipelines contract`` do.

``run`` executes a pipeline's Dagster job on the *local* Dagster instance (``$DAGSTER_HOME``, or
``.dagster_home/`` in the project, created with telemetry off), so every CLI run shows up in
``dagster dev`` with its history. It draws a progress bar over the pipeline's instances and ends
with a per-slot table and the success rate with its interval and denominators, telling this run's
rows from those that earlier runs of other instances left. The exit code is 0 when the run
succeeded (every instance ran and every blocking check passed), 1 otherwise, and 130 / 143 when
SIGINT / SIGTERM interrupted it: then the grades, checks and report are still written, and the
summary says the run was interrupted and how far it got.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hud_pipelines.cli.interrupts import (
    catching_interrupts,
    finishing_despite_signals,
    how_to_resume,
    how_to_resume_sweep,
    interrupted_line,
    was_interrupted,
)
from hud_pipelines.cli.selection import (
    as_invoked,
    asked_command,
    queue_for,
    refuse_misconfigured,
    resolve_pipeline_file,
    select_instances,
)
from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.grades import GradeRow, not_run_parts
from hud_pipelines.eval.report import figures_line
from hud_pipelines.recording.events import EpisodeStatus

if TYPE_CHECKING:
    from dagster._core.execution.execution_result import ExecutionResult
    from rich.console import Console

    from hud_pipelines.eval.results import InstanceResult

DAGSTER_HOME_ENV = "DAGSTER_HOME"
LOCAL_DAGSTER_HOME = ".dagster_home"
LOCAL_INSTANCE_SETTINGS = (
    "telemetry:\n  enabled: false\nconcurrency:\n  runs:\n    max_concurrent_runs: 2\n"
    "compute_logs:\n  module: hud_pipelines.dagster.compute_logs\n  class: InterruptSafeComputeLogManager\n"
)
"""A new local instance's ``dagster.yaml``: two runs at a time suit a workstation's sims (a sweep's sensor requests a
run per new checkpoint; Dagster's default is ten), and :mod:`hud_pipelines.dagster.compute_logs` for step logs."""
STATUS_STYLE = {
    EpisodeStatus.SUCCEEDED: "green",
    EpisodeStatus.FAILED: "red",
    EpisodeStatus.ERRORED: "yellow",
}


def ensure_dagster_home(project_dir: Path) -> Path:
    """``$DAGSTER_HOME`` if set, else ``<project>/.dagster_home``; created with telemetry disabled and two runs
    at a time (:data:`LOCAL_INSTANCE_SETTINGS`)."""
    configured = os.environ.get(DAGSTER_HOME_ENV)
    home = Path(configured).expanduser().resolve() if configured else (project_dir / LOCAL_DAGSTER_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists():
        settings.write_text(LOCAL_INSTANCE_SETTINGS)
    os.environ[DAGSTER_HOME_ENV] = str(home)
    return home


def run_pipeline(
    pipeline: str,
    *,
    pipelines_dir: Path | None = None,
    outputs_dir: Path | None = None,
    partitions: list[str] | None = None,
    quiet: bool = False,
    checkpoints: list[str] | None = None,
    rerun: bool = False,
    queue: str | None = None,
) -> int:
    """Run one pipeline's job in this process on the local Dagster instance; returns the exit code.

    ``queue`` sends this run's units to that Celery queue instead of the deployment's (a run tag).
    """
    path = resolve_pipeline_file(pipeline, pipelines_dir)
    project_dir = Path.cwd()
    ensure_dagster_home(project_dir)

    import dagster as dg

    from hud_pipelines.dagster.assets import RANGE_END_TAG, RANGE_START_TAG
    from hud_pipelines.dagster.definitions import definitions_for_file
    from hud_pipelines.dagster.deployed import deployed_spec
    from hud_pipelines.dagster.launch import execute_pipeline_job
    from hud_pipelines.dagster.overlap import launcher_tags, overlapping_runs
    from hud_pipelines.dagster.step_recovery import retried_steps
    from hud_pipelines.dagster.unit_tags import RUN_QUEUE_TAG
    from hud_pipelines.eval import progress
    from hud_pipelines.eval.configuration import CurrentBy, current_rollout_hashes
    from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
    from hud_pipelines.eval.perturbations import control_tasks
    from hud_pipelines.eval.results import recording_warning
    from hud_pipelines.eval.rollouts import kept_pairs
    from hud_pipelines.eval.rows import collect_rows, current_results
    from hud_pipelines.eval.run_warnings import episode_errors_warning, rewritten_warning, success_signal_warning
    from hud_pipelines.eval.seed_check import seed_warning
    from hud_pipelines.eval.steps import dataset_root, failed_run_step
    from hud_pipelines.eval.sweep_warnings import unevaluated_warning
    from hud_pipelines.spec.loader import load_pipeline_to_run

    spec = load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, project_dir))  # as it runs
    outputs = EvalOutputs((outputs_dir or default_outputs_root()).resolve(), spec.name)
    refuse_misconfigured(path, spec, outputs)
    defs = definitions_for_file(path, outputs_dir=outputs.root, project_dir=project_dir)
    job = defs.resolve_job_def(spec.name)
    asked = {"--checkpoint": checkpoints or [], "--partition": partitions or []}  # as given: how to resume a sweep
    ordered, checkpoints = select_instances(spec, partitions, checkpoints)
    tags = {RANGE_START_TAG: ordered[0], RANGE_END_TAG: ordered[-1]}
    units = len(ordered)
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True)
    waiting, kept = "", 0
    if spec.is_sweep:
        from hud_pipelines.dagster import sweeps
        from hud_pipelines.dagster.deployed import deployed_spec

        with dg.DagsterInstance.get() as instance:
            found = sweeps.run_tags(instance, spec, ordered, checkpoints=checkpoints, rerun=rerun, say=console.print)
        tags, labels, waiting = found
        kept = 0 if rerun else kept_pairs(deployed_spec(spec, project_dir), outputs, labels, ordered)
        units = units * len(labels) - kept  # what the bar counts: the pairs this run evaluates
    elif checkpoints or rerun:
        raise HudPipelinesError(f"{spec.name} is not a sweep: --checkpoint and --rerun need agent.policy.checkpoints")
    if queue is not None:
        tags = {**tags, RUN_QUEUE_TAG: queue_for(spec.name, queue)}
    with dg.DagsterInstance.get() as instance:  # another run of this pipeline at once does the same work again
        for overlap in overlapping_runs(instance, spec.name):
            console.print(Text(f"warning: {overlap}", style="yellow"), soft_wrap=True)
    run_id = str(uuid.uuid4())
    tags = {**tags, **launcher_tags(run_id)}
    if waiting:  # a checkpoint still being written, or missing a file: said, not silently left out
        console.print(Text(f"not evaluated yet (incomplete checkpoints): {waiting}", style="yellow"), soft_wrap=True)
    if kept:
        pairs = f"{kept} of {kept + units} (checkpoint, instance) pairs"
        console.print(Text(f"{pairs} keep their current result (--rerun evaluates them again)", style="dim"))
    # Dagster's console logger would print every failure with a stack trace; the summary below says
    # what failed in a line each, and the full event log stays in the instance (`dagster dev`).
    run_config = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    finished: list[InstanceResult] = []
    result: ExecutionResult | None = None
    with finishing_despite_signals() as late:  # a signal once the run ended would leave the last green report
        with catching_interrupts() as received:
            try:
                with (
                    dg.DagsterInstance.get() as instance,
                    _progress(console, spec.name, units, quiet) as on_result,
                    progress.listening(_counting(finished, on_result)),
                ):
                    result = execute_pipeline_job(  # in process, or on the deployment's workers
                        job,
                        path,
                        instance=instance,
                        outputs_dir=outputs.root,
                        project_dir=project_dir,
                        tags=tags,
                        run_config=run_config,
                        run_id=run_id,
                    )
            except KeyboardInterrupt:
                pass  # which signal it was is read when the block ends
        this_run_judges = CurrentBy(run_id=run_id)  # as its own steps judged, whatever run overlapped it
        rows = collect_rows(spec, outputs, current=this_run_judges)
        invocation = asked_command(pipeline, pipelines_dir, outputs_dir, queue)
        order = list(dict.fromkeys(row.group_id for row in rows))  # every partition, in order: ranges to re-run
        published = dataset_root(spec, outputs, project_dir) if spec.dataset_enabled else None
        problems = (
            [*_problems(result, invocation, order, published), *retried_steps(result.all_events)]
            if result is not None
            else []
        )
        if result is not None and was_interrupted(result):
            received.setdefault("signal", signal.SIGINT)
        interrupted = received.get("signal")
        if interrupted is not None or _eval_failed(result):  # the job stopped before its grades: write them now
            failure = " / ".join(p.removeprefix("step ") for p in problems if p.startswith("step ")) or (
                f"the run was interrupted by {interrupted.name} before its instances ended"
                if interrupted and len(finished) < units
                else None
            )  # an interrupt's unfinished instances keep their earlier results, which would pass every check
            failed_run_step(spec, outputs, run_id=run_id, project_dir=project_dir, failure=failure)
        if interrupted is not None:
            if spec.is_sweep:  # its results name no checkpoint: what is left is counted in pairs
                rest = how_to_resume_sweep(units - len(finished), invocation, asked, rerun=rerun)
            else:
                done = {r.key for r in finished}
                unfinished = [key for key in ordered if key not in done]
                rest = how_to_resume(unfinished, invocation, spec.partition_keys())
            problems.insert(
                0,
                interrupted_line(
                    interrupted, len(finished), units, rest, on_workers=job.executor_def.name == "hud_celery"
                ),
            )
        succeeded = result is not None and result.success and interrupted is None
        this_run = [row for row in rows if row.run_id == run_id]
        warned = [
            success_signal_warning(spec.graders[0], rows, run_id),
            unevaluated_warning(spec, outputs, rows) if spec.is_sweep else None,
            episode_errors_warning(spec.checks, this_run, control_tasks(spec)),
            rewritten_warning(rows, [r.key for r in finished if not r.failed], run_id),
            recording_warning(
                r for r in current_results(spec, outputs, this_run_judges).values() if r.run_id == run_id
            ),
            seed_warning(outputs, current_rollout_hashes(spec, outputs, run_id).pipeline),
        ]
        said = [*(f"warning: {w}" for w in warned if w), *problems]
        _print_summary(spec.name, rows, succeeded, run_id, outputs.base, said, control_tasks(spec))
    stopped = interrupted or late.get("signal")
    return 128 + int(stopped) if stopped is not None else 0 if succeeded else 1


def _counting(
    finished: list[InstanceResult], then: Callable[[InstanceResult], None]
) -> Callable[[InstanceResult], None]:
    """A progress listener that also notes each finished instance's result."""

    def listener(result: InstanceResult) -> None:
        finished.append(result)
        then(result)

    return listener


DAGSTER_FAILURE = "dagster._core.definitions.events.Failure"  # heads a step's dg.Failure message
INTERRUPTED_ERROR = "DagsterExecutionInterruptedError"  # said by the run's own line, in words


def _eval_failed(result: ExecutionResult | None) -> bool:
    """Whether the step running the instances failed (one kept an earlier result), or one of its steps on workers:
    the grades after it did not run."""
    from hud_pipelines.dagster.eval_failure import is_eval_step

    failed = [e.step_key or "" for e in result.all_events if e.event_type_value == "STEP_FAILURE"] if result else []
    return any(is_eval_step(key) for key in failed)


def _problems(result: ExecutionResult, invocation: list[str], order: list[str], dataset: Path | None) -> list[str]:
    """One line per failed step or failed check of a run; failed instances with the command as this run was asked;
    the ``dataset`` (when the pipeline publishes one) held back by a failed blocking check."""
    from hud_pipelines.eval.checks import INSTANCES_CHECK, RERUN_HINT, rerun_command

    problems: list[str] = []
    evaluations = result.get_asset_check_evaluations()
    if dataset is not None and any(not e.passed and e.severity.value == "ERROR" for e in evaluations):
        before = f"{dataset} holds what was published before" if dataset.exists() else "none was published before"
        problems.append(f"dataset not published (a blocking check failed): {before}")
    for evaluation in evaluations:
        if not evaluation.passed:
            blocking = "blocking " if evaluation.severity.value == "ERROR" else ""
            description = evaluation.description or ""
            failed = evaluation.metadata.get("failed_instances")
            if evaluation.check_name == INSTANCES_CHECK and failed is not None and RERUN_HINT in description:
                keys = [str(key) for key in cast(list[object], failed.value)]
                description = description.split(RERUN_HINT)[0] + RERUN_HINT + rerun_command(keys, invocation, order)
            problems.append(f"{blocking}check {evaluation.check_name} failed: {description}")
    for event in result.all_events:
        if event.event_type_value != "STEP_FAILURE":
            continue
        error = event.step_failure_data.error
        if error is None or error.cls_name in ("DagsterAssetCheckFailedError", INTERRUPTED_ERROR):
            continue  # a check: reported above; an interrupt: said by the run's own line
        cause = error.cause if error.cls_name == "DagsterExecutionStepExecutionError" and error.cause else error
        lines = cause.message.strip().removeprefix(f"{DAGSTER_FAILURE}: ").splitlines()
        said = " / ".join(lines[:6])  # a command it gives runs as this run was asked (its --outputs, ...)
        problems.append(f"step {event.step_key} failed: {as_invoked(said, invocation)}")
    failures = [e.job_failure_data.error for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE"]
    said = [error for error in failures if error and INTERRUPTED_ERROR not in error.message]  # the run says it
    if not problems:  # no step says why: the run's own failure does (a step that died on a worker, say)
        problems += [f"run failed: {' / '.join(error.message.strip().splitlines()[:6])}" for error in said]
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


def _cut(text: str, width: int = 60) -> str:
    """The first line of ``text`` in ``width`` characters, an ellipsis where cut (a URL cut short reads as another)."""
    first = text.strip().split("\n", 1)[0]
    return first[: width - 1] + "…" if len(first) > width else first + ("…" if first != text.strip() else "")


def _whole(rows: list[GradeRow], run_id: str, of: str = "") -> str:
    """``all 20 rows of 000500, with 8 from other runs and 12 not run yet``: what a figure over them counts (other runs:
    earlier ones, or one that ran some of the same instances at the same time)."""
    current = sum(1 for row in rows if row.fault is not Fault.NOT_RUN)
    mine = sum(1 for row in rows if row.run_id == run_id)
    *parts, last = [f"{current - mine} from other runs", *not_run_parts(rows)]
    return f"all {len(rows)} rows{of}, with {', '.join(parts) + ' and ' if parts else ''}{last}"


def _print_summary(
    name: str,
    rows: list[GradeRow],
    succeeded: bool,
    run_id: str,
    base: Path,
    problems: list[str],
    controls: set[str] | None = None,
) -> None:
    """The per-slot table, this run's figures and the problems; ``controls``: a matrix's control tasks, whose
    figures are the headline (each arm is compared with its control in the report's perturbations table)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=f"{name}: per-slot grades")
    sweep = any(row.checkpoint is not None for row in rows)
    columns = ("task", "instance", "slot", "seed", "status", "score", "return", "steps", "run", "error")
    for column in ("checkpoint", *columns) if sweep else columns:
        table.add_column(
            column, justify="right" if column in ("instance", "slot", "seed", "score", "return", "steps") else "left"
        )
    for row in rows:
        style = STATUS_STYLE[row.status]
        table.add_row(
            *([Text(row.checkpoint or "")] if sweep else []),
            Text(row.task),
            str(row.instance),
            str(row.slot),
            str(row.seed),
            Text(row.status.value, style=style),
            "n/a" if row.status is EpisodeStatus.ERRORED else f"{row.score:.3g}",
            f"{row.total_reward:.3g}",
            str(row.steps),
            Text("this" if row.run_id == run_id else (row.run_id[:8] or "-")),
            Text(_cut(row.error or "")),  # plain text: brackets in a reason are not markup
        )
    console.print(table)
    mine = [row for row in rows if row.run_id == run_id]
    if sweep:  # one rate over several checkpoints would mean nothing: a line each, in sweep order
        judged = mine if controls is None else [row for row in mine if row.task in controls]
        whose = "" if controls is None else " control tasks"
        for label in dict.fromkeys(row.checkpoint for row in judged):
            console.print(
                Text(f"this run, {label}{whose}: {figures_line([r for r in judged if r.checkpoint == label])}")
            )
            whole = [r for r in rows if r.checkpoint == label and (controls is None or r.task in controls)]
            if len(whole) != sum(r.run_id == run_id for r in whole):  # earlier runs' rows, or rows not run yet
                console.print(Text(f"{_whole(whole, run_id, f' of {label}')}{whose}: {figures_line(whole)}"))
    if sweep and (base / "comparison.json").is_file():  # the checkpoints compared, as the report's table has them
        from hud_pipelines.eval.sweep_table import SweepComparison

        for line in SweepComparison.from_json((base / "comparison.json").read_text()).summary_lines():
            console.print(Text(line), soft_wrap=True)
    if not mine:
        console.print(Text("this run produced no graded rows"))
    elif controls is not None and not sweep:
        own = [row for row in mine if row.task in controls]  # none when it ran matrix values alone
        console.print(Text(f"this run, control tasks: {figures_line(own)}" if own else "this run ran no control task"))
        console.print(Text(f"each matrix task against its control: the perturbations table in {base / 'report.md'}"))
    elif not sweep:
        console.print(Text(f"this run: {figures_line(mine)}"))
    if len(mine) != len(rows) and not sweep:
        judged, whose = (rows, "") if controls is None else ([r for r in rows if r.task in controls], ", control tasks")
        console.print(Text(f"{_whole(rows, run_id)}{whose}: {figures_line(judged)}"))
    for problem in problems:  # one line each, never folded: a re-run command must paste as it is
        console.print(Text(problem, style="red"), soft_wrap=True)
    verdict = "[green]run succeeded[/green]" if succeeded else "[red]run FAILED[/red]"
    console.print(f"{verdict} (run {run_id}); outputs in {base}")
