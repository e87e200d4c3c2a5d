"""Grades: per-slot rows and eval-level statistics with honest denominators.

Every scheduled (task, instance, slot) ends in exactly one row whose ``status`` is ``succeeded``,
``failed`` or ``errored``. Errors are never failures: the success rate is ``succeeded / (succeeded +
failed)`` over the episodes that produced an answer, and the error rate is reported beside it, so
``scheduled == succeeded + failed + errored`` always holds. The 95% interval is Wilson's score
interval, which stays inside [0, 1] and is sensible for the small samples evals usually have.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hud_pipelines.errors import Fault
from hud_pipelines.recording.events import EpisodeEnd, EpisodeStatus

Z_95 = 1.959963984540054


@dataclass(frozen=True)
class GradeRow:
    """One graded slot of one instance of one task."""

    pipeline: str
    task: str
    task_index: int
    instance: int
    group_id: str
    slot: int
    seed: int | None
    status: EpisodeStatus
    score: float
    success: bool
    total_reward: float
    steps: int
    error: str | None = None
    trace_id: str | None = None
    metrics: dict[str, float | bool] = field(default_factory=dict[str, float | bool])
    """Columns added by the graders after the first (``<name>_score``, ``<name>_success``)."""
    fault: Fault | None = None
    """Why an errored row errored; ``None`` for rows that produced an answer."""
    run_id: str = ""
    """The run that produced this row (a grade table may hold rows of earlier runs of other instances)."""
    checkpoint: str | None = None
    """The checkpoint of a sweep this row evaluated (its label); ``None`` outside sweeps."""
    success_reported: bool | None = None
    """Whether the env gave a success signal in this episode (``None``: not known, as for rows that never ran)."""
    success_by_signal: bool | None = None
    """Whether that signal decided ``success`` (the grader did not say it); ``None`` for errored rows."""
    ended: EpisodeEnd | None = None
    """How an answered episode ended: ``terminated`` by the env, or ``truncated`` (a time limit, ``max_steps``)."""

    def as_dict(self) -> dict[str, Any]:
        """The row as grades.json and grades.csv hold it: an errored row's score and success are ``null`` (it
        has none: a 0 or a false there would be counted as a failure by whoever reads the file)."""
        row = asdict(self)
        row["status"] = self.status.value
        row["fault"] = None if self.fault is None else self.fault.value
        row["ended"] = None if self.ended is None else self.ended.value
        if self.status is EpisodeStatus.ERRORED:
            row["score"] = row["success"] = None
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> GradeRow:
        fault = row.get("fault")
        fields: dict[str, Any] = {
            **row,
            "status": EpisodeStatus(row["status"]),
            "fault": Fault(fault) if fault else None,
            "ended": EpisodeEnd(ended) if (ended := row.get("ended")) else None,
            "score": 0.0 if row.get("score") is None else row["score"],  # never read: errored rows count no score
            "success": bool(row.get("success")),  # nor a success
        }
        return cls(**fields)


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; ``(0, 1)`` when there are no trials."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Summary:
    """Eval-level figures with their denominators."""

    scheduled: int
    succeeded: int
    failed: int
    errored: int
    mean_score: float | None
    mean_return: float | None
    not_run: int = 0
    """Of the errored, those no run of the current configuration produced (not run yet, or stale): a task
    just added is that, not a failure of the sim or the policy."""

    @property
    def not_run_text(self) -> str:
        """`` (4 of them not run with this configuration yet)`` after the errored count, or ``""``."""
        return f" ({self.not_run} of them not run with this configuration yet)" if self.not_run else ""

    @property
    def graded(self) -> int:
        """Episodes that produced an answer (errors excluded)."""
        return self.succeeded + self.failed

    @property
    def success_rate(self) -> float | None:
        return None if self.graded == 0 else self.succeeded / self.graded

    @property
    def error_rate(self) -> float:
        return 0.0 if self.scheduled == 0 else self.errored / self.scheduled

    @property
    def success_interval(self) -> tuple[float, float]:
        return wilson_interval(self.succeeded, self.graded)

    @property
    def error_bounds(self) -> tuple[float, float] | None:
        """The success rate over every scheduled episode had the errored ones run: all failed, all succeeded.

        The rate leaves errored episodes out, which is right only when errors strike at random. They
        rarely do: a crash keeps the short episodes that ended (often the successes) and cuts the long
        ones, so the rate leans one way. These bounds hold whatever the errored episodes would have done.
        ``None`` without an errored episode.
        """
        if self.errored == 0:
            return None
        return self.succeeded / self.scheduled, (self.succeeded + self.errored) / self.scheduled

    def as_dict(self) -> dict[str, Any]:
        low, high = self.success_interval
        return {
            "scheduled": self.scheduled,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "errored": self.errored,
            "success_rate": self.success_rate,
            "success_rate_ci95": [low, high],
            "error_rate": self.error_rate,
            "mean_score": self.mean_score,
            "mean_return": self.mean_return,
        }


def later_graders(rows: Iterable[GradeRow]) -> list[str]:
    """The graders after the first, by name, in the YAML's order, as the rows' metrics hold them."""
    for row in rows:
        if row.metrics:
            return [key.removesuffix("_success") for key in row.metrics if key.endswith("_success")]
    return []


def as_graded_by(rows: Iterable[GradeRow], grader: str) -> list[GradeRow]:
    """The rows as a later grader judged them: its success and score decide each answered episode."""
    regraded: list[GradeRow] = []
    for row in rows:
        success = row.metrics.get(f"{grader}_success")
        if row.status is EpisodeStatus.ERRORED or success is None:
            regraded.append(row)
            continue
        status = EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED
        score = float(row.metrics.get(f"{grader}_score", float(success)))
        regraded.append(dataclasses.replace(row, status=status, success=bool(success), score=score))
    return regraded


def summarize(rows: Iterable[GradeRow]) -> Summary:
    rows = list(rows)
    graded = [r for r in rows if r.status is not EpisodeStatus.ERRORED]
    return Summary(
        scheduled=len(rows),
        succeeded=sum(r.status is EpisodeStatus.SUCCEEDED for r in rows),
        failed=sum(r.status is EpisodeStatus.FAILED for r in rows),
        errored=sum(r.status is EpisodeStatus.ERRORED for r in rows),
        mean_score=_mean([r.score for r in graded]),
        mean_return=_mean([r.total_reward for r in graded]),
        not_run=sum(r.fault is Fault.NOT_RUN for r in rows),
    )


def produced_by_no_run(row: GradeRow) -> bool:
    """A row no run has produced yet (its instance has not run): never counted as an earlier run's."""
    return not row.run_id and row.fault is Fault.NOT_RUN


def stale(row: GradeRow) -> bool:
    """A row of an instance whose last result was made under another configuration (the YAML changed
    since): not run with this one, and never counted as an earlier run's result."""
    return bool(row.run_id) and row.fault is Fault.NOT_RUN


def not_run_parts(rows: Sequence[GradeRow], *, unit: str = "") -> list[str]:
    """``12 stale (run before the configuration changed)``, ``4 not run yet``: the rows no current run
    produced, by why (``unit`` follows each count: `` row(s)``)."""
    counts = (sum(stale(row) for row in rows), sum(produced_by_no_run(row) for row in rows))
    words = ("stale (run before the configuration changed)", "not run yet")
    return [f"{count}{unit} {what}" for count, what in zip(counts, words, strict=True) if count]


def summarize_by_task(rows: Sequence[GradeRow]) -> dict[str, Summary]:
    tasks: dict[str, list[GradeRow]] = {}
    for row in rows:
        tasks.setdefault(row.task, []).append(row)
    return {task: summarize(task_rows) for task, task_rows in tasks.items()}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def one_line(error: str | None, kept_in: str = "grades.json") -> str:
    """An error's headline for a list item or a check: a multi-line reason (a sim's stack dump) would break it.
    ``kept_in``: where the whole reason is (not grades.json for an attempt whose earlier result was kept)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    return lines[0] if len(lines) == 1 else f"{lines[0]} (full reason in {kept_in})"


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a markdown table: its ``|`` escaped and its lines joined, so the row holds, and any
    HTML in it shown as text (:func:`no_html`)."""
    return no_html(" / ".join(line.strip() for line in text.splitlines() if line.strip()).replace("|", "\\|"))


def no_html(text: str) -> str:
    """User text with its markdown kept and any HTML in it shown as text: a renderer passes raw HTML
    through, and a prompt, a label or an env's error is data, never markup of the report. Only a ``<``
    opens a tag, so only it is escaped, outside code spans (which show their text as is) and autolinks. Code spans
    are kept on one line only, without an escaped backtick: there CommonMark pairs backticks as :data:`_CODE_SPAN`
    does; elsewhere (a span across lines, a block that interrupts it) every ``<`` is escaped."""
    if "\n" in text or "\\`" in text:
        return _TAG_OPENER.sub("&lt;", text)
    parts: list[str] = []
    done = 0
    for span in _CODE_SPAN.finditer(text):
        parts += [_TAG_OPENER.sub("&lt;", text[done : span.start()]), span.group()]
        done = span.end()
    return "".join([*parts, _TAG_OPENER.sub("&lt;", text[done:])])


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)")
"""A code span as CommonMark reads one on a line: a run of backticks, to the next run of the same length."""
_TAG_OPENER = re.compile(r"<(?![a-zA-Z][a-zA-Z0-9+.-]*://[^\s<>]*>)")
"""A ``<`` that does not start an autolink (``<https://...>``)."""
