"""The steps of an eval, without Dagster: contract, rollouts, grades, report, dataset.

Each Dagster asset is a thin wrapper around one of these functions (it adds metadata and events);
:func:`evaluate` runs them in order in plain Python, for scripts, notebooks and the benchmark that
measures what Dagster adds. Everything a step produces is a file under ``outputs/<pipeline>/``
(see :mod:`hud_pipelines.eval.outputs`), so the steps only share the disk, never memory.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hud_pipelines.contract import Contract, state_images
from hud_pipelines.errors import ContractError, DatasetFitError, HudPipelinesError
from hud_pipelines.eval import perturbations, provenance, run_warnings, sweep, sweep_warnings
from hud_pipelines.eval.checks import CheckVerdict, builtin_verdicts
from hud_pipelines.eval.configuration import (
    LATEST,
    CurrentBy,
    RolloutHashes,
    claim_served_sim,
    record_configuration,
    recorded_overrides,
    recorded_provenance,
    write_contract,
)
from hud_pipelines.eval.grade_table import write_grades
from hud_pipelines.eval.graders import grader_text
from hud_pipelines.eval.grades import GradeRow, Summary, no_html, summarize
from hud_pipelines.eval.judging import all_verdicts, headline_rows
from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root, write_atomically
from hud_pipelines.eval.perturbations import CONTROL_NOTE, control_tasks, has_matrix, perturbation_table
from hud_pipelines.eval.publishing import dataset_root, dataset_step, member_dataset
from hud_pipelines.eval.report import ReportContext, render_markdown, render_plot
from hud_pipelines.eval.results import InstanceResult, recording_warning
from hud_pipelines.eval.rollouts import rollouts_step, sweep_rollouts_step
from hud_pipelines.eval.rows import collect_rows, current_results, sweep_members
from hud_pipelines.eval.seed_check import SeedCheck, check_seeded_reset, seed_warning, write_seed_check
from hud_pipelines.recording.thumbnails import png_data_uri
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.spec.models import Partition, PipelineSpec

if TYPE_CHECKING:
    from hud_pipelines.dataset.summary import DatasetSummary
    from hud_pipelines.eval.sweep_table import SweepComparison

logger = logging.getLogger(__name__)

# -- contract ------------------------------------------------------------------------------------------


def contract_step(spec: PipelineSpec, pool: SimPool, outputs: EvalOutputs, *, run_id: str) -> Contract:
    """The sim's contract, written to ``outputs/<name>/contract.json`` (the sim stays in the pool).

    Then the sim's seeded reset is checked on the first instance's tasks (``seed_check.json``); a
    served sim's account of itself is claimed for run ``run_id`` (``served_sim.json``: the run's provenance
    and fingerprint).
    """
    contract = seed_checked_contract(spec, pool, outputs)
    write_contract(outputs, run_id, contract.to_json())
    if pool.served_sim:
        pool.hold_to(claim_served_sim(outputs, run_id, pool.served_sim))
    return contract


def seed_checked_contract(spec: PipelineSpec, pool: SimPool, outputs: EvalOutputs) -> Contract:
    """The sim's contract, then its seeded reset checked on the first instance's tasks (``seed_check.json``);
    an observation of an image's shape read as state is warned of.

    The check runs once per run: in its contract step, or in the first unit of a run on workers.
    """
    outputs.seed_check.unlink(missing_ok=True)  # a sim that does not start leaves no verdict of an earlier one
    tasks = spec.slot_tasks(*spec.partitions()[0])
    checked: list[SeedCheck | None] = []  # stays empty when a reset of the check failed
    contract = pool.contract(
        then=lambda client: checked.append(check_seeded_reset(client, tasks, rollout_hash=spec.rollout_hash))
    )
    write_seed_check(outputs, checked[0] if checked else None)
    for warning in state_images(contract):
        logger.warning("%s: %s", spec.name, warning)
    return contract


def refuse_misfit_dataset(spec: PipelineSpec, contract: Contract) -> None:
    """Refuse a dataset section that does not fit the sim's contract before any rollout (the writer would refuse
    it after every one): called once the contract is written, by whatever derived it (its contract step, every
    unit on workers), outside the tolerance of a sim that does not start."""
    if spec.dataset is not None and spec.dataset_enabled:
        from hud_pipelines.dataset.features import DatasetLayout
        from hud_pipelines.spec.loader import located

        try:
            DatasetLayout.build(contract, spec.dataset.writer_options())
        except ContractError as exc:
            key = ("dataset", "state_features") if spec.dataset.state_features is not None else ("dataset",)
            at = located(spec, key) or spec.name  # its line, as validate says it where a contract file is given
            raise DatasetFitError(f"{at}: the dataset section does not fit the sim's contract: {exc}") from exc


# -- grades and report -------------------------------------------------------------------------------


def grades_step(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    current: CurrentBy = LATEST,
    run_failure: str | None = None,
) -> tuple[list[GradeRow], list[CheckVerdict]]:
    """``grades.json`` (full rows), ``grades.csv`` (flat columns) and ``checks.json`` (every check's verdict on
    them, the built-in ``instances_completed`` first), each replaced atomically; returns the rows and verdicts.

    ``current``: what a result must match to count (:func:`collect_rows`; by default the latest run's).
    ``run_failure``: why the run writing them failed before its grades (:func:`all_verdicts`).
    """
    rows = collect_rows(spec, outputs, current=current)
    write_grades(spec, outputs, rows)
    if spec.is_sweep:  # each checkpoint's own grades beside its report: `hud-pipelines compare` takes two folders
        for member, expected in sweep_members(spec, outputs, current):
            write_grades(member.spec, member.outputs, collect_rows(member.spec, member.outputs, current=expected))
    checks = all_verdicts(spec, outputs, rows, run_failure)
    write_atomically(outputs.checks_json, json.dumps([v.as_dict() for v in checks], indent=1))
    return rows, checks


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`report_step` wrote: the markdown (also returned for the Dagster UI) and the HTML page."""

    markdown: str
    html: Path
    summary: Summary
    thumbnails_png: bytes | None = None
    """The last frame of the first episodes' videos, failures first (none without videos)."""
    warnings: tuple[str, ...] = ()
    """What the report warns of (a Dagster run logs them as warnings too)."""


def report_step(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    *,
    run_id: str | None = None,
    current: CurrentBy = LATEST,
    dataset: Path | None = None,
    member: sweep.Member | None = None,
    run_failure: str | None = None,
    notes: Sequence[str] = (),
) -> ReportFiles:
    """``report.md`` with its plot ``report.png`` beside it, and ``report.html`` (episodes, videos, plots).

    The page of one checkpoint of a sweep (a spec with a ``checkpoint_hash``) has the built-in checks: the
    YAML's judge the sweep's candidate on the sweep's page (a ``no_regression`` baseline there is a label).

    Written for every run that started, failed instances included: the checks' verdicts are part of
    it, and ``run_id`` (the run writing it) tells this run's rows from those of earlier runs.
    ``dataset`` is where the pipeline's dataset is published (:func:`dataset_root`): the page links
    each episode to its dataset episode once it is there. ``notes``: more warnings, from the caller.
    """
    from hud_pipelines.eval.report_html import write_html_report
    from hud_pipelines.eval.report_html.episodes import episode_thumbnails

    rows = collect_rows(spec, outputs, current=current)
    scope, headline = headline_rows(spec, rows)
    name = spec.name if member is None else f"{spec.name}: checkpoint {member.label}"  # ``member``: of a sweep
    title = f"{name} ({scope})" if scope else name
    plot = render_plot(name, headline)
    outputs.base.mkdir(parents=True, exist_ok=True)
    outputs.report_png.write_bytes(plot)
    overrides = recorded_overrides(outputs, current.run_id)
    member_of_sweep = spec.checkpoint_hash is not None
    own = builtin_verdicts(rows, outputs.run_command(spec)) if member_of_sweep else None  # a sweep's member's
    checks = own or all_verdicts(spec, outputs, rows, run_failure)
    members = sweep_members(spec, outputs, current) if spec.is_sweep else []
    for checkpoint, expected in members:  # every checkpoint's own report (episodes, videos, plots) beside the sweep's
        folder = member_dataset(dataset, checkpoint.label)
        report_step(
            checkpoint.spec, checkpoint.outputs, run_id=run_id, current=expected, dataset=folder, member=checkpoint
        )
    seeded = seed_warning(outputs, current.resolve(spec, outputs)[0].pipeline)
    mixed = sweep_warnings.mixed_policy_types(spec, outputs) if spec.is_sweep else None
    gone = sweep_warnings.gone_warning(spec, outputs, rows) if spec.is_sweep else None
    unevaluated = sweep_warnings.unevaluated_warning(spec, outputs, rows) if spec.is_sweep else None
    stale = sweep_warnings.stale_warning(rows) if spec.is_sweep else None
    errored = run_warnings.episode_errors_warning(spec.checks, headline)
    recorded = None if spec.is_sweep else recording_warning(current_results(spec, outputs, current).values())
    failed = run_failure and f"this run failed, so these are the results it kept of earlier runs, if any: {run_failure}"
    signal = run_warnings.success_signal_warning(spec.graders[0], headline)
    warned = [w for w in (failed, unevaluated, stale, signal, errored, recorded, seeded, mixed, gone, *notes) if w]
    context = ReportContext(
        checks=checks,
        run_id=run_id,
        overrides=overrides,
        warnings=warned,
        graded_by=grader_text(spec.graders[0]),
        description=spec.description if member is None else member.described(spec.name, spec.description),
        prompts={task.name: task.prompt for task in spec.tasks if task.prompt},
    )
    # the plot is a file beside the report: readable in a terminal, shown by a viewer
    markdown = render_markdown(title, headline, outputs.report_png.name, context, produced=rows)
    table = comparison_step(spec, outputs, rows=rows) if spec.is_sweep and rows else None
    not_evaluated = sweep.not_evaluated(spec, outputs) if table is not None else []
    if table is not None:
        markdown += _sweep_section(table, not_evaluated, has_matrix(spec))
    studied = _perturbations(spec, outputs, rows) if has_matrix(spec) else None
    if studied is not None:
        markdown += perturbations.report_section(*studied)
    markdown += provenance.markdown(recorded_provenance(outputs, current.run_id))
    write_atomically(outputs.report_md, markdown)
    page = write_html_report(
        name,
        rows,
        outputs,
        context,
        sweep=table,
        dataset=dataset if spec.dataset_enabled else None,
        repo_id=spec.dataset_repo_id,
        perturbations=studied[:2] if studied is not None else None,
        members={m.label: m.outputs for m, _ in members} if spec.is_sweep else None,
        not_evaluated=not_evaluated,
        headline=headline,
    )
    embedded = markdown.replace(f"]({outputs.report_png.name})", f"]({png_data_uri(plot)})", 1)  # the UI: no folder
    return ReportFiles(embedded, page.path, summarize(headline), episode_thumbnails(page.views), tuple(warned))


def failed_run_step(
    spec: PipelineSpec, outputs: EvalOutputs, *, run_id: str, project_dir: Path, failure: str | None
) -> None:
    """The grades and report of a run that failed or was cancelled before its grades step, saying ``failure``:
    else the files keep an earlier run's verdict while the results hold what this run did."""
    current, dataset = CurrentBy(run_id=run_id), dataset_root(spec, outputs, project_dir)
    grades_step(spec, outputs, current, run_failure=failure)
    report_step(spec, outputs, run_id=run_id, current=current, dataset=dataset, run_failure=failure)


def comparison_step(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    *,
    current: CurrentBy = LATEST,
    rows: Sequence[GradeRow] | None = None,
) -> SweepComparison:
    """A sweep's ``comparison.{csv,json,png}``: every checkpoint per task, paired with the previous and the baseline.

    ``rows`` are the sweep's current grade rows when the caller has them already (the report step).
    """
    table = _comparison(spec, outputs, rows if rows is not None else collect_rows(spec, outputs, current=current))
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.comparison_csv, table.to_csv())
    write_atomically(outputs.comparison_json, table.to_json())
    outputs.comparison_png.write_bytes(table.plot())
    return table


def _comparison(spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow]) -> SweepComparison:
    from hud_pipelines.eval.sweep_stats import compare_checkpoints
    from hud_pipelines.eval.sweep_table import CheckpointRows

    shown = {row.checkpoint for row in rows}  # a checkpoint that left the table (never loaded, deleted) is not compared
    members = [m for m in sweep.evaluated(spec, outputs) if m.label in shown]
    labels = {m.label for m in members}
    checkpoints = [
        CheckpointRows(m.label, m.step, [row for row in rows if row.checkpoint == m.label], m.run) for m in members
    ]
    baseline = sweep.baseline_label(spec, labels)
    return compare_checkpoints(checkpoints, baseline=baseline, pooled=control_tasks(spec))


def _perturbations(
    spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow]
) -> tuple[list[perturbations.AxisRow], str, list[GradeRow]]:
    """``perturbations.{csv,json}``: each matrix value against its control (a sweep's candidate); the table, whose
    it is, and the matrix values' own rows (the headline's sections hold the controls')."""
    candidate = sweep.candidate_label(rows) if spec.is_sweep else None
    judged = [row for row in rows if row.checkpoint == candidate] if candidate is not None else list(rows)
    table = perturbation_table(spec, judged)
    write_atomically(outputs.perturbations_csv, perturbations.to_csv(table))
    write_atomically(outputs.perturbations_json, perturbations.to_json(table))
    controls = control_tasks(spec) or set()
    whose = f" of checkpoint {candidate}" if candidate is not None else ""
    return table, whose, [row for row in judged if row.task not in controls]


def _sweep_section(table: SweepComparison, not_evaluated: Sequence[str], matrix: bool) -> str:
    waiting = f"\nNot evaluated yet: {no_html('; '.join(not_evaluated))}.\n" if not_evaluated else ""
    baseline = f" and the baseline {no_html(table.baseline)}" if table.baseline else ""  # no check, no baseline
    return (
        "\n## Checkpoints\n\n"
        f"Every checkpoint on the same episodes; each is compared with the previous one{baseline} "
        f"by McNemar's exact test on the paired successes.{CONTROL_NOTE if matrix else ''}\n\n"
        f"{table.markdown()}\n{waiting}\n![success rate by training step](comparison.png)\n"
    )


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
    checkpoints: Sequence[str] | None = None,
    rerun: bool = False,
    settle_s: float = sweep.DEFAULT_SETTLE_S,
) -> Evaluation:
    """Run a whole eval in this process without Dagster (no run history).

    Grades, checks and the report are always written; the dataset is published only when every
    blocking check passed (the built-in ``instances_completed`` among them), exactly as the Dagster
    job publishes it. A dataset that cannot be published (a writer failed: ``DatasetWriteError``) is
    raised after them, as the Dagster job's dataset step fails. The sim, contract, agent and graders are
    the Dagster job's own resources (``deployment`` replaces their fields as a deployment file does).
    """
    from hud_pipelines.dagster.deployment import checked_overrides
    from hud_pipelines.dagster.resources import effective_spec, pipeline_resources

    project = (project_dir or Path.cwd()).resolve()
    outputs = EvalOutputs((outputs_dir or default_outputs_root()).resolve(), spec.name)
    run_id = f"local-{uuid.uuid4().hex[:12]}"
    parts = pipeline_resources(spec, project_dir=project, deployment=checked_overrides(deployment or {}))
    effective = effective_spec(spec, parts.sim, parts.contract, parts.agent, parts.graders)
    try:
        pool = parts.sim.pool(effective)
        try:
            contract = contract_step(effective, pool, outputs, run_id=run_id)
        except HudPipelinesError:  # a sim that cannot start errors every instance below
            pass
        else:
            refuse_misfit_dataset(effective, contract)
        record_configuration(effective, spec, outputs, run_id=run_id)
        if effective.is_sweep:
            members = sweep.select(sweep.members(effective, outputs, settle_s=settle_s), checkpoints)
            wanted = list(partitions or effective.partitions())
            ran = sweep_rollouts_step(
                effective,
                pool,
                outputs,
                run_id=run_id,
                members=members,
                selection={m.label: wanted for m in members},
                rerun=rerun,
            )
            results = [result for _, result in ran]
        else:
            results = rollouts_step(
                effective,
                pool,
                outputs,
                run_id=run_id,
                partitions=partitions or effective.partitions(),
                keep_earlier=True,  # an instance that did not start is a failed instance of this evaluation
            )
    finally:
        parts.sim.close()
    current = CurrentBy(RolloutHashes.of(effective), run_id=run_id)
    rows, checks = grades_step(effective, outputs, current)
    report_step(effective, outputs, run_id=run_id, current=current, dataset=dataset_root(effective, outputs, project))
    published = None
    if effective.dataset_enabled and all(v.passed for v in checks if v.blocking):
        published = dataset_step(effective, outputs, project_dir=project, run_id=run_id, current=current)
    return Evaluation(
        rows=rows,
        summary=summarize(headline_rows(effective, rows)[1]),
        results=results,
        outputs=outputs,
        dataset=published,
        checks=checks,
        run_id=run_id,
    )
