"""Traces read back: one trace file as a :class:`Trace`, a job directory's traces, the job directories.

The format is :mod:`hud_pipelines.recording.traces`'s (its layout and step types); this module is
apart from that writer because its readers (the HTML report, comparisons of two rollouts, tests)
need none of the recording machinery, only the lines on disk, and a malformed file is theirs to
report, naming the file and line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from hud_pipelines.recording.traces import TIMING_FIELDS, TRACE_SUFFIX, StepType


@dataclass(frozen=True)
class Trace:
    """A trace read back from disk."""

    path: Path
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    grade: dict[str, Any] | None
    """``None`` when the episode never ended (the writer was interrupted)."""

    @property
    def trace_id(self) -> str:
        return str(self.header["trace_id"])

    def of_type(self, kind: StepType | str) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["type"] == str(kind)]

    @property
    def videos(self) -> list[Path]:
        return sorted(self.path.parent.glob(f"{self.trace_id}.*.mp4"))

    def without_timing(self) -> list[dict[str, Any]]:
        """Every line with the timing-dependent fields removed (for comparing two rollouts)."""
        lines = [self.header, *self.steps, *([self.grade] if self.grade is not None else [])]
        return [{k: v for k, v in line.items() if k not in TIMING_FIELDS} for line in lines]


def read_trace(path: Path) -> Trace:
    """Parse one trace file; a malformed line is a ``ValueError`` naming the file and line."""
    header: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = []
    grade: dict[str, Any] | None = None
    with Path(path).open(encoding="utf-8") as file:
        for number, text in enumerate(file, start=1):
            if not text.strip():
                continue
            try:
                line: Any = json.loads(text, parse_constant=_constant)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from exc
            if not _is_json_object(line):
                raise ValueError(f"{path}:{number}: a step must be a JSON object")
            entry = line
            kind = entry.get("type")
            if kind not in StepType.__members__.values():
                raise ValueError(f"{path}:{number}: unknown step type {kind!r}")
            if kind == StepType.TRACE:
                header = entry
            elif kind == StepType.GRADE:
                grade = entry
            else:
                steps.append(entry)
    if header is None:
        raise ValueError(f"{path}: no trace header line")
    return Trace(path=Path(path), header=header, steps=steps, grade=grade)


def read_traces(job_dir: Path) -> list[Trace]:
    """Every trace of one job directory, ordered by (task, instance, slot, episode)."""
    traces = [read_trace(p) for p in sorted(Path(job_dir).glob(f"*{TRACE_SUFFIX}"))]
    return sorted(traces, key=lambda t: tuple(t.header.get(k, 0) for k in ("task", "instance", "slot", "episode")))


def iter_jobs(root: Path) -> Iterator[Path]:
    """The job directories under a trace root."""
    return (p for p in sorted(Path(root).iterdir()) if p.is_dir())


def _constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def _is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    """A JSON object (its keys are strings; its values are read field by field)."""
    return isinstance(value, dict)
