"""The grade table's files, and its flat view: the columns of ``grades.csv`` and of the grades table Dagster shows.

``grades.json`` keeps every field of every row; this is its flat view, one column per field a
spreadsheet or a Dagster table can hold, and two per grader after the first (``<name>_score``,
``<name>_success``), so a grader the YAML adds is a column wherever grades are read.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import fields
from enum import Enum

from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.models import PipelineSpec

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
    ("ended", "string"),
    ("error", "string"),
    ("fault", "string"),
    ("run_id", "string"),
    ("trace_id", "string"),
]
"""The columns every grade table has (a sweep's adds ``checkpoint`` first)."""
_ROW_FIELDS = frozenset(f.name for f in fields(GradeRow))


def grade_columns(spec: PipelineSpec) -> list[tuple[str, str]]:
    """Name and kind of each column of ``spec``'s grade table: the checkpoint for a sweep, then the rows'
    fields, then each grader's after the first."""
    metrics = [
        (f"{g.name}_{part}", kind) for g in spec.graders[1:] for part, kind in (("score", "float"), ("success", "bool"))
    ]
    return [*([("checkpoint", "string")] if spec.is_sweep else []), *GRADE_COLUMNS, *metrics]


NO_ANSWER_COLUMNS = frozenset({"score", "success"})
"""What an errored row has no value of: empty, never a 0 or a false that a reader would average in as a failure."""
MORE_IN_JSON = " [more in grades.json]"
"""Ends an error cell cut to its first line (a hung sim's error holds the stacks of its threads)."""


def grade_cell(row: GradeRow, column: str) -> str | int | float | bool | None:
    """One cell: a field of the row, else the metric a later grader gave it (empty for an errored row, as
    its score and success are: it has none); an error is its first line, one row to a line."""
    if column in NO_ANSWER_COLUMNS and row.status is EpisodeStatus.ERRORED:
        return None
    if column == "error" and row.error is not None and "\n" in row.error.strip():
        return row.error.strip().splitlines()[0] + MORE_IN_JSON
    return cell(getattr(row, column) if column in _ROW_FIELDS else row.metrics.get(column))


def cell(value: object) -> str | int | float | bool | None:
    """A value as a plain CSV or table cell."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def grades_csv(spec: PipelineSpec, rows: Sequence[GradeRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    columns = [name for name, _ in grade_columns(spec)]
    writer.writerow(columns)
    for row in rows:
        writer.writerow([grade_cell(row, name) for name in columns])
    return buffer.getvalue()


def write_grades(spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow]) -> None:
    """``grades.json`` (full rows) and ``grades.csv`` (flat columns), each replaced atomically."""
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.grades_json, json.dumps([row.as_dict() for row in rows], indent=1))
    write_atomically(outputs.grades_csv, grades_csv(spec, rows))


def read_grades(outputs: EvalOutputs) -> list[GradeRow]:
    return [GradeRow.from_dict(row) for row in json.loads(outputs.grades_json.read_text())]
