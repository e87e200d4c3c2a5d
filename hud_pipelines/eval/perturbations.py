"""A perturbation study: each value of a task's ``matrix``, against the unperturbed task on the same seeds.

A task with ``matrix: {difficulty: [0.2, 0.5, 0.8]}`` is the control arm; the spec adds one task per
value (:meth:`~hud_pipelines.spec.sections.TaskSpec.variants`) that changes that one build argument
and keeps the seeds, so every perturbed episode has an unperturbed twin. The table says, per axis and
value, the success rate with its 95% Wilson interval and denominators, and the paired comparison with
the control (McNemar's exact test on the twins, the control's rate on them, the difference with its
interval, a verdict).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hud_pipelines.eval.comparison import compare
from hud_pipelines.eval.grades import GradeRow, markdown_cell, summarize
from hud_pipelines.eval.report import RateFigures, errored_section, rate_columns
from hud_pipelines.spec.models import PipelineSpec

CONTROL = "control"
"""The ``value`` column of a control task's own row."""
COLUMNS = (
    "control",
    "axis",
    "value",
    "task",
    "episodes",
    "succeeded",
    "failed",
    "errored",
    "success_rate",
    "ci_low",
    "ci_high",
    "vs_control",
    "control_on_pairs",
    "diff",
    "diff_low",
    "diff_high",
    "p",
    "pairs",
)


@dataclass(frozen=True, kw_only=True)
class AxisRow(RateFigures):
    """One value of one axis of a control task (or the control itself), with its figures."""

    control: str
    axis: str
    value: str
    task: str
    vs_control: str = ""
    control_on_pairs: float | None = None
    """The control's success rate on the paired episodes, the ones ``diff`` compares (its own row's rate also
    counts episodes whose twin errored, so the two rates in the table may differ by more than ``diff``)."""
    diff: float | None = None
    diff_low: float | None = None
    diff_high: float | None = None
    p: float | None = None
    pairs: int | None = None


CONTROL_NOTE = (
    " A checkpoint's `all` row counts its control tasks; each perturbation is compared with its control below."
)
"""What a sweep's table says of its all-tasks rows when the pipeline has a matrix."""


def has_matrix(spec: PipelineSpec) -> bool:
    return any(task.variant_of is not None for task in spec.tasks)


def control_rows(spec: PipelineSpec, rows: Sequence[GradeRow]) -> list[GradeRow]:
    """The rows of the file's own tasks: what the YAML's checks and the headline judge.

    A matrix's tasks run other configurations; each is compared with its control in the
    perturbations table, never pooled into a gate or a headline rate (adding a perturbation study
    leaves what a check means as it was).
    """
    controls = control_tasks(spec)
    return list(rows) if controls is None else [row for row in rows if row.task in controls]


def control_tasks(spec: PipelineSpec) -> set[str] | None:
    """The file's own tasks when it has a matrix (what a headline or a pooled row counts); ``None`` without."""
    return {task.name for task in spec.tasks if task.variant_of is None} if has_matrix(spec) else None


def perturbation_table(spec: PipelineSpec, rows: Sequence[GradeRow]) -> list[AxisRow]:
    """A row per control task, then one per value of each of its axes (in the YAML's order)."""
    by_task: dict[str, list[GradeRow]] = {}
    for row in rows:
        by_task.setdefault(row.task, []).append(row)
    table: list[AxisRow] = []
    for task in spec.tasks:
        variants = [v for v in spec.tasks if v.variant_of is not None and v.variant_of.control == task.name]
        if not variants:
            continue
        control = by_task.get(task.name, [])
        table.append(_figures(task.name, "", CONTROL, task.name, control))
        for variant in variants:
            assert variant.variant_of is not None
            mine = by_task.get(variant.name, [])
            twins = [dataclasses.replace(row, task=task.name) for row in mine]  # paired on their seeds
            result = compare(twins, control)
            low, high = result.success_interval or (None, None)
            table.append(
                dataclasses.replace(
                    _figures(task.name, variant.variant_of.axis, str(variant.variant_of.value), variant.name, mine),
                    vs_control=result.verdict.value if result.pairs else "no paired episodes",
                    control_on_pairs=(result.both_succeeded + result.only_baseline) / result.pairs
                    if result.pairs
                    else None,
                    diff=result.success_difference,
                    diff_low=low,
                    diff_high=high,
                    p=result.mcnemar_p,
                    pairs=result.pairs,
                )
            )
    return table


def to_csv(table: Sequence[AxisRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for row in table:
        writer.writerow(["" if (v := getattr(row, name)) is None else v for name in COLUMNS])
    return buffer.getvalue()


def to_json(table: Sequence[AxisRow]) -> str:
    return json.dumps(as_dicts(table), indent=1)


HEADERS = ("task", "axis", "value", "success (95% CI, n)", "errored", "vs control")
EXPLANATION = (
    "Each value of a task's matrix on the same seeds as the unperturbed task (the control); McNemar's exact "
    "test on the paired episodes (both answered), where the difference and the control's rate beside it are taken."
)


def cells(row: AxisRow) -> list[str]:
    """One row of the report's table (markdown and HTML): success with its interval, the verdict against the control."""
    rate = (
        "n/a"
        if row.success_rate is None
        else f"{row.success_rate:.1%} ({row.ci_low:.1%}-{row.ci_high:.1%}, {row.succeeded}/"
        f"{row.succeeded + row.failed})"
    )
    versus = "" if row.value == CONTROL else _versus(row)
    return [row.control, row.axis or "-", row.value, rate, f"{row.errored}/{row.episodes}", versus]


def markdown(table: Sequence[AxisRow]) -> str:
    """The table for ``report.md`` (a matrix's values are the user's text: ``|`` and HTML in them stay text)."""
    lines = [f"| {' | '.join(HEADERS)} |", f"|{'---|' * len(HEADERS)}"]
    lines += [f"| {' | '.join(markdown_cell(cell) for cell in cells(row))} |" for row in table]
    return "\n".join(lines)


def report_section(table: Sequence[AxisRow], whose: str, values: Sequence[GradeRow]) -> str:
    """The section of ``report.md``: the table, then the errored episodes of the values (``values``: their rows)."""
    errored = "\n".join(errored_section(values, f"Errored episodes of the perturbations{whose}"))
    return f"\n## Perturbations{whose}\n\n{EXPLANATION}\n\n{markdown(table)}\n{errored}\n"


def _versus(row: AxisRow) -> str:
    """The verdict, the difference and the control's rate it is taken from: both on the paired episodes only,
    so beside rates over all answered episodes (the control's own row) it says what it compares."""
    if not row.pairs or row.diff is None or row.p is None or row.control_on_pairs is None:
        return row.vs_control
    control = f"control {row.control_on_pairs:.1%} on {row.pairs} pairs"
    return f"{row.vs_control} {row.diff:+.1%} vs {control} (p={row.p:.3g})"


def _figures(control: str, axis: str, value: str, task: str, rows: list[GradeRow]) -> AxisRow:
    return AxisRow(control=control, axis=axis, value=value, task=task, **rate_columns(summarize(rows)))


def as_dicts(table: Sequence[AxisRow]) -> list[dict[str, Any]]:
    return [{name: getattr(row, name) for name in COLUMNS} for row in table]
