"""One side of a comparison: the grade rows of a run, of one checkpoint of a sweep, of a matrix's control tasks.

``compare`` and the ``no_regression`` check read their sides here, so a side is never a mix: a sweep's
file holds every checkpoint's rows (one is taken, named), and a matrix's perturbed tasks run other
configurations (their rows are left out, as the pipeline's checks leave them out, and counted).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError

from hud_pipelines.agent.checkpoints import label_named, several_named
from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.spec.problems import did_you_mean
from hud_pipelines.spec.sections import is_file_target


@dataclass(frozen=True)
class ResultSet:
    """The rows of one side of a comparison, and what they are."""

    rows: list[GradeRow]
    where: str
    checkpoint: str | None = None
    """The sweep checkpoint the rows are, where the file held several (its candidate unless one was named)."""
    checkpoints: tuple[str, ...] = ()
    """Every checkpoint the file held, in its order."""
    arms: int = 0
    """Perturbed tasks (a matrix's) left out: a side is its control tasks, as the pipeline's checks judge."""
    settings: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    """What the runs of the rows recorded of :data:`SETTINGS` (as JSON, each distinct value once); a
    setting none of them recorded is absent."""
    unjudged: bool = False
    """A pipeline's rows read as its last run wrote them: no pipeline file of that name is found here to judge them."""
    folder: bool = False
    """An outputs folder's rows, read as its last run wrote them (its pipeline's name would judge them now)."""

    @property
    def name(self) -> str:
        named = (
            self.where
            if self.checkpoint is None
            else f"{self.where} (checkpoint {self.checkpoint} of {len(self.checkpoints)})"
        )
        return f"{named} (control tasks; {self.arms} perturbed task(s) left out)" if self.arms else named


type Judge = Callable[[str, Path], list[GradeRow] | None]
"""The rows of the pipeline a side names (its name or file), as its YAML and code judge its results now
(``None``: it names no pipeline file here); given an outputs root."""


def grades_file(where: str, outputs_root: Path) -> tuple[Path, bool]:
    """The ``grades.json`` that ``where`` names (a file, an outputs folder, a pipeline file or name under
    ``outputs_root``), and whether it named a pipeline (whose rows are judged now, as ``report`` judges them)."""
    from hud_pipelines.eval.outputs import EvalOutputs

    path = Path(where)
    if path.is_dir():
        return path / "grades.json", False
    if path.suffix in (".yaml", ".yml") and path.is_file():  # a pipeline file: its results, as `report` finds them
        from hud_pipelines.spec.loader import declared_name

        return EvalOutputs(outputs_root, declared_name(path)).grades_json, True
    if not path.exists() and path.suffix != ".json" and len(path.parts) == 1:  # a pipeline's name
        return EvalOutputs(outputs_root, where).grades_json, True
    return path, False


def read_result_set(
    where: str, *, outputs_root: Path | None = None, checkpoint: str | None = None, judge: Judge | None = None
) -> ResultSet:
    """Grade rows from a ``grades.json``, a directory holding one, or a pipeline name or file under the outputs root.

    A pipeline's rows are judged now by ``judge`` where one is given, as ``hud-pipelines report`` judges them
    (results of code or a configuration since edited are ``not_run``), not read as its last run wrote them.
    A sweep's file holds every checkpoint's rows of the same episodes: one side of a comparison is one
    checkpoint, ``checkpoint`` or else the sweep's candidate (the last one of the table, as its checks
    judge), never a mix in which one checkpoint's rows would silently stand for the others.
    """
    from hud_pipelines.eval.outputs import default_outputs_root

    root = (outputs_root or default_outputs_root()).resolve()
    path, pipeline = grades_file(where, root)
    if not path.is_file():
        raise HudPipelinesError(
            f"no grades at {path} (give a grades.json, an outputs/<name> folder or a pipeline name)"
        )
    judged = judge(where, root) if judge is not None and pipeline else None
    unjudged = judge is not None and pipeline and judged is None
    rows = judged if judged is not None else _rows_of(path)
    arms = _perturbed_tasks(path.with_name("perturbations.json"))
    rows = [row for row in rows if row.task not in arms]
    labels = tuple(dict.fromkeys(row.checkpoint for row in rows if row.checkpoint is not None))
    if checkpoint is None and len(labels) < 2:
        settings = _settings(path.parent, rows)
        return ResultSet(rows, where, arms=len(arms), settings=settings, unjudged=unjudged, folder=Path(where).is_dir())
    chosen = label_named(checkpoint, labels) if checkpoint is not None else labels[-1]
    if chosen not in labels:
        raise HudPipelinesError(
            f"{path} has no checkpoint {chosen!r}{several_named(chosen, labels) or did_you_mean(chosen, labels)}; "
            "its checkpoints: "
            f"{', '.join(labels) or 'none (not a sweep)'}"
        )
    rows = [row for row in rows if row.checkpoint == chosen]
    member = path.parent / "checkpoints" / chosen
    settings = _settings(member, rows)
    folder = Path(where).is_dir()
    return ResultSet(rows, where, chosen, labels, len(arms), settings=settings, unjudged=unjudged, folder=folder)


def _rows_of(path: Path) -> list[GradeRow]:
    """The rows of a ``grades.json`` as it was written."""
    try:
        loaded: object = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HudPipelinesError(f"{path}: not a grades file ({exc})") from exc
    if not isinstance(loaded, list):
        raise HudPipelinesError(f"{path}: expected a list of grade rows")
    try:
        return [GradeRow.from_dict(cast(dict[str, Any], row)) for row in cast(list[object], loaded)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSON, but not grade rows
        why = f"a row has no {exc} field" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise HudPipelinesError(f"{path}: not a grades file ({why})") from exc


SETTINGS = ("sim_factory", "sim_args", "max_steps", "graders")
"""What decides a row's figures without being part of an episode's identity (task and seed): where the two
sides of a comparison differ in one, their episodes pair up all the same, and ``compare`` says so."""


def _settings(folder: Path, rows: list[GradeRow]) -> dict[str, list[str]]:
    """The :data:`SETTINGS` the runs of ``rows`` recorded in the results under ``folder`` (none where the
    file stands alone, without its pipeline's results beside it)."""
    runs = {row.run_id for row in rows}
    found: dict[str, list[str]] = {}
    for result in sorted((folder / "rollouts").glob("*.json")):
        try:
            recorded: object = json.loads(result.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # an unreadable result says nothing; the rows are what the comparison reads
        if not isinstance(recorded, dict):
            continue
        recorded = cast(dict[str, Any], recorded)
        provenance = cast(dict[str, Any], recorded.get("provenance") or {})
        if recorded.get("run_id") not in runs:
            continue
        for name in SETTINGS:
            if name in provenance:
                value = json.dumps(_comparable(name, provenance[name]), sort_keys=True)
                if value not in found.setdefault(name, []):
                    found[name].append(value)
    return found


def _comparable(name: str, value: object) -> object:
    """A setting as two sides are compared on: a factory in a file by the file's name (a spawned sim records
    it resolved, a served one as its server was given it, and a project moves: one file, three spellings;
    what the code is, is in each result's digests)."""
    if name == "sim_factory" and isinstance(value, str) and is_file_target(value):
        module, _, attribute = value.rpartition(":")
        return f"{Path(module).name}:{attribute}"
    return value


def _perturbed_tasks(table: Path) -> set[str]:
    """The matrix tasks of the perturbations table beside a grades file (none without one)."""
    if not table.is_file():
        return set()
    try:
        entries = _TABLE.validate_json(table.read_bytes())
    except (OSError, ValidationError) as exc:
        raise HudPipelinesError(f"{table}: not a perturbations table ({exc})") from exc
    return {str(entry["task"]) for entry in entries if entry.get("axis")}


_TABLE = TypeAdapter(list[dict[str, Any]])
