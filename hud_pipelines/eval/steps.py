"""The steps of an eval, without Dagster: contract, rollouts, grades, report, dataset.

Each Dagster asset is a thin wrapper around one of these functions (it adds metadata and events);
:func:`evaluate` runs them in order in plain Python, for scripts, notebooks and the benchmark that
measures what Dagster adds. Everything a step produces is a file under ``outputs/<pipeline>/``
(see :mod:`hud_pipelines.eval.outputs`), so the steps only share the disk, never memory.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hud_pipelines.contract import Contract
from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.grades import CheckVerdict, GradeRow, Summary, summarize, verdicts
from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
from hud_pipelines.eval.report import render_markdown, render_plot
from hud_pipelines.eval.runner import EvalRunner, InstanceResult, unreached_result, unreached_rows
from hud_pipelines.recording.events import EpisodeSink, EpisodeStatus
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.spec.models import Partition, PipelineSpec

if TYPE_CHECKING:
    from hud_pipelines.dataset.summary import DatasetSummary

GRADE_COLUMNS: list[tuple[str, str]] = [
    ("task", "string"),
    ("instance", "int"),
    ("slot", "int"),
    ("seed", "int"),
    ("status", "string"),
    ("score", "float"),
    ("success", "bool"),
    ("total_reward", "float"),
    ("steps", "int"),
    ("error", "string"),
]
"""Columns of ``grades.csv`` and of the grades table shown in Dagster."""


def cell(value: object) -> str | int | float | bool | None:
    """A grade field as a plain CSV/table cell."""
    if isinstance(value, EpisodeStatus):
        return value.value
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


# -- contract ------------------------------------------------------------------------------------------


def contract_step(pool: SimPool, outputs: EvalOutputs) -> Contract:
    """The sim's contract, written to ``outputs/<name>/contract.json`` (the sim stays in the pool)."""
    with pool.sim() as live:
        contract = live.client.contract
    outputs.contract.parent.mkdir(parents=True, exist_ok=True)
    outputs.contract.write_text(contract.to_json())
    return contract


# -- rollouts --------------------------------------------------------------------------------------------


def rollouts_step(
    spec: PipelineSpec,
    pool: SimPool,
    outputs: EvalOutputs,
    *,
    run_id: str,
    partitions: Sequence[Partition],
    on_result: Callable[[InstanceResult], None] | None = None,
) -> list[InstanceResult]:
    """Run ``partitions``; each instance's result, traces and dataset shard land as it ends."""
    from hud_pipelines.dataset.shards import ShardStore

    traces = outputs.traces(run_id)
    shards = ShardStore(outputs, spec, run_id=run_id) if spec.dataset_enabled else None

    def sinks(partition: Partition, contract: Contract) -> list[EpisodeSink]:
        from hud_pipelines.recording.traces import TraceRecorder

        recorders: list[EpisodeSink] = [
            TraceRecorder(traces, contract, video=spec.traces.video, max_videos=spec.traces.max_videos)
        ]
        if shards is not None:
            recorders.append(shards.sink(spec.partition_key(*partition), contract))
        return recorders

    finished: set[str] = set()

    def ended(result: InstanceResult) -> None:
        finished.add(result.key)
        result.write(outputs.result(result.key))
        if shards is not None:
            shards.commit(result.key)
        if on_result is not None:
            on_result(result)

    runner = EvalRunner(spec, pool, job=f"{spec.name}/{run_id}", run_id=run_id, sinks=sinks, on_result=ended)
    try:
        return runner.run(partitions)
    except BaseException:  # interrupted: say so for every instance it cut short
        _record_interrupted(spec, outputs, run_id, [p for p in partitions if spec.partition_key(*p) not in finished])
        raise
    finally:
        if shards is not None:
            shards.discard_pending()


def _record_interrupted(spec: PipelineSpec, outputs: EvalOutputs, run_id: str, cut: Sequence[Partition]) -> None:
    """Write ``interrupted`` results for the instances a cancelled run did not finish.

    An instance that already has a result of this configuration from an earlier run keeps it: that
    work was finished, and the run that was cut short changed nothing about it.
    """
    for partition in cut:
        key = spec.partition_key(*partition)
        path = outputs.result(key)
        if path.is_file() and InstanceResult.read(path).rollout_hash == spec.rollout_hash:
            continue
        reason = f"the run was interrupted before instance {key} finished"
        unreached_result(spec, partition, reason, Fault.INTERRUPTED, run_id=run_id).write(path)


# -- grades and report -------------------------------------------------------------------------------


def record_configuration(
    effective: PipelineSpec, base: PipelineSpec, outputs: EvalOutputs, *, run_id: str
) -> dict[str, Any]:
    """Note the configuration a run rolls out (its rollout hash and overrides of the YAML); returns the overrides.

    The grades-side steps read it back (:func:`current_rollout_hash`), so the results of a run with
    overrides are graded as current and those of any other configuration as stale.
    """
    overrides = effective.overrides(base)
    record = {
        "run_id": run_id,
        "rollout_hash": effective.rollout_hash,
        "yaml_rollout_hash": base.rollout_hash,
        "overrides": overrides,
    }
    outputs.base.mkdir(parents=True, exist_ok=True)
    _write_atomically(outputs.configuration_json, json.dumps(record, indent=1))
    return overrides


def current_rollout_hash(spec: PipelineSpec, outputs: EvalOutputs) -> str:
    """The rollout hash results must carry to be current: the latest run's, unless the YAML changed since."""
    path = outputs.configuration_json
    if path.is_file():
        record = json.loads(path.read_text())
        if record.get("yaml_rollout_hash") == spec.rollout_hash:
            return str(record["rollout_hash"])
    return spec.rollout_hash


def collect_rows(spec: PipelineSpec, outputs: EvalOutputs, *, rollout_hash: str | None = None) -> list[GradeRow]:
    """One row per scheduled slot, from the latest result of every partition.

    Every row carries the run that produced it. A partition that never ran, or ran under another
    configuration (its rollout hash differs from ``rollout_hash``, by default the latest run's), gives
    errored ``not_run`` rows saying so and how to run it: results of different configurations are
    never mixed in one table.
    """
    expected = rollout_hash or current_rollout_hash(spec, outputs)
    rows: list[GradeRow] = []
    for partition in spec.partitions():
        key = spec.partition_key(*partition)
        path = outputs.result(key)
        result = InstanceResult.read(path) if path.exists() else None
        rerun = f"run it with: hud-pipelines run {spec.name} --partition {key}"
        if result is None:
            rows.extend(unreached_rows(spec, partition, f"instance {key} has not run yet; {rerun}", Fault.NOT_RUN))
        elif result.rollout_hash != expected:
            reason = (
                f"instance {key} last ran (run {result.run_id or 'unknown'}) before the pipeline's sim, agent, tasks "
                f"or graders changed; {rerun}"
            )
            rows.extend(unreached_rows(spec, partition, reason, Fault.NOT_RUN, run_id=result.run_id))
        else:
            rows.extend(result.rows)
    return rows


def grades_step(spec: PipelineSpec, outputs: EvalOutputs, *, rollout_hash: str | None = None) -> list[GradeRow]:
    """``grades.json`` (full rows) and ``grades.csv`` (flat columns), each replaced atomically."""
    rows = collect_rows(spec, outputs, rollout_hash=rollout_hash)
    outputs.base.mkdir(parents=True, exist_ok=True)
    _write_atomically(outputs.grades_json, json.dumps([row.as_dict() for row in rows], indent=1))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([name for name, _ in GRADE_COLUMNS])
    for row in rows:
        writer.writerow([cell(getattr(row, name)) for name, _ in GRADE_COLUMNS])
    _write_atomically(outputs.grades_csv, buffer.getvalue())
    return rows


def read_grades(outputs: EvalOutputs) -> list[GradeRow]:
    return [GradeRow.from_dict(row) for row in json.loads(outputs.grades_json.read_text())]


def checks_step(spec: PipelineSpec, outputs: EvalOutputs, *, rollout_hash: str | None = None) -> list[CheckVerdict]:
    """Every check on the current grades (the built-in ``instances_completed`` first), to ``checks.json``."""
    results = verdicts(spec.resolved_checks(), collect_rows(spec, outputs, rollout_hash=rollout_hash))
    outputs.base.mkdir(parents=True, exist_ok=True)
    _write_atomically(outputs.checks_json, json.dumps([v.as_dict() for v in results], indent=1))
    return results


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`report_step` wrote: the markdown (also returned for the Dagster UI) and the HTML page."""

    markdown: str
    html: Path
    summary: Summary


def report_step(
    spec: PipelineSpec, outputs: EvalOutputs, *, run_id: str | None = None, rollout_hash: str | None = None
) -> ReportFiles:
    """``report.md`` with the plot inline, ``report.png``, and ``report.html`` (episodes, videos, plots).

    Written for every run that started, failed instances included: the checks' verdicts are part of
    it, and ``run_id`` (the run writing it) tells this run's rows from those of earlier runs.
    """
    from hud_pipelines.eval.report_html import write_html_report

    rows = collect_rows(spec, outputs, rollout_hash=rollout_hash)
    plot = render_plot(spec.name, rows)
    outputs.base.mkdir(parents=True, exist_ok=True)
    outputs.report_png.write_bytes(plot)
    overrides = _recorded_overrides(outputs)
    checks = verdicts(spec.resolved_checks(), rows)
    markdown = render_markdown(spec.name, rows, plot_png=plot, checks=checks, run_id=run_id, overrides=overrides)
    _write_atomically(outputs.report_md, markdown)
    html = write_html_report(spec.name, rows, outputs, checks=checks, run_id=run_id, overrides=overrides)
    return ReportFiles(markdown, html, summarize(rows))


# -- dataset ---------------------------------------------------------------------------------------------


def dataset_step(spec: PipelineSpec, outputs: EvalOutputs, *, project_dir: Path, run_id: str) -> DatasetSummary:
    """Merge every instance's latest shard and publish the dataset atomically."""
    from hud_pipelines.dataset.shards import ShardStore

    return ShardStore(outputs, spec, run_id=run_id).publish(dataset_root(spec, outputs, project_dir))


def dataset_root(spec: PipelineSpec, outputs: EvalOutputs, project_dir: Path) -> Path:
    """``dataset.root`` (relative to the project) when the YAML sets it, else ``<outputs>/datasets/<name>``."""
    configured = spec.dataset.root if spec.dataset is not None else None
    return spec.dataset_root(project_dir) if configured else outputs.dataset


# -- everything --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` produced."""

    rows: list[GradeRow]
    summary: Summary
    results: list[InstanceResult]
    outputs: EvalOutputs
    dataset: DatasetSummary | None
    checks: list[CheckVerdict]
    run_id: str

    @property
    def failed_instances(self) -> list[InstanceResult]:
        return [r for r in self.results if r.failed]

    @property
    def passed(self) -> bool:
        """Every instance ran and every blocking check passed (what a CI gate asks)."""
        return not self.failed_instances and all(v.passed for v in self.checks if v.blocking)


def evaluate(
    spec: PipelineSpec,
    *,
    outputs_dir: Path | None = None,
    project_dir: Path | None = None,
    partitions: Sequence[Partition] | None = None,
    deployment: dict[str, dict[str, Any]] | None = None,
) -> Evaluation:
    """Run a whole eval in this process without Dagster (no run history).

    Grades, checks and the report are always written; the dataset is published only when every
    blocking check passed (the built-in ``instances_completed`` among them), exactly as the Dagster
    job publishes it. The sim, contract, agent and graders are the Dagster job's own resources
    (``deployment`` replaces their fields as a deployment file does).
    """
    from hud_pipelines.dagster.resources import effective_spec, pipeline_resources

    project = (project_dir or Path.cwd()).resolve()
    outputs = EvalOutputs((outputs_dir or default_outputs_root()).resolve(), spec.name)
    run_id = f"local-{uuid.uuid4().hex[:12]}"
    parts = pipeline_resources(spec, project_dir=project, deployment=deployment)  # the Dagster job's resources
    effective = effective_spec(spec, parts.sim, parts.contract, parts.agent, parts.graders)
    try:
        pool = parts.sim.pool(effective)
        with contextlib.suppress(HudPipelinesError):  # a sim that cannot start errors every instance below
            contract_step(pool, outputs)
        record_configuration(effective, spec, outputs, run_id=run_id)
        results = rollouts_step(
            effective, pool, outputs, run_id=run_id, partitions=partitions or effective.partitions()
        )
    finally:
        parts.sim.close()
    current = effective.rollout_hash
    rows = grades_step(effective, outputs, rollout_hash=current)
    checks = checks_step(effective, outputs, rollout_hash=current)
    report_step(effective, outputs, run_id=run_id, rollout_hash=current)
    published = None
    if effective.dataset_enabled and all(v.passed for v in checks if v.blocking):
        published = dataset_step(effective, outputs, project_dir=project, run_id=run_id)
    return Evaluation(
        rows=rows,
        summary=summarize(rows),
        results=results,
        outputs=outputs,
        dataset=published,
        checks=checks,
        run_id=run_id,
    )


def _recorded_overrides(outputs: EvalOutputs) -> dict[str, Any]:
    path = outputs.configuration_json
    return dict(json.loads(path.read_text()).get("overrides", {})) if path.is_file() else {}


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    partial.replace(path)
