"""The sweep table: every checkpoint of a training run, side by side on the same episodes.

A sweep evaluates each checkpoint on exactly the same (task, seed) episodes, so two
checkpoints compare episode by episode (see :mod:`hud_pipelines.eval.comparison`) rather than as two
independent samples. This module is the pure layer over their grade rows that answers "did training
help, and which checkpoint do we keep?":

- one :class:`SweepRow` per (checkpoint, task), then one all-tasks row (task ``"all"``) per checkpoint,
  *always*, even for a single task, so that every consumer finds a checkpoint's overall figures in
  the same place (the markdown and the plot leave the duplicate out when there is one task);
- each row's denominators (scheduled = succeeded + failed + errored), its success rate over the
  answered episodes with the 95% Wilson interval, and its mean score with a 95% bootstrap interval
  (the Wilson one where every score is the success, none for a single answered episode);
- the paired comparison with the previous checkpoint (in the order given, which is the training order; the
  last before it that answered an episode, named where it is not the one listed before) and with a baseline
  checkpoint, at the ``alpha`` and ``min_effect`` given: McNemar's exact test, the paired success difference
  with its exact interval (coherent with that test), and the episodes a ``min_effect`` difference would need.
  Errored episodes are never failures: :func:`compare` pairs only episodes answered on both sides, and a
  comparison without a pair says so (``no paired episodes``), never a direction; one that episodes errored on
  one side only could make worse says it is undecided, as ``no_regression`` and ``compare`` do.

Every bootstrap draws from a fixed seed over rows in episode order, so the same rows (in any order)
give the same table, CSV and JSON byte for byte. A rate with no answered episode is ``None`` (null in
JSON, empty in CSV), never a made-up 0 or NaN.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from hud_pipelines.eval.comparison import PairedComparison, Verdict
from hud_pipelines.eval.grades import GradeRow, markdown_cell, no_html
from hud_pipelines.eval.report import RateFigures, png_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ALL_TASKS = "all"
"""The task name of a checkpoint's all-tasks row."""
SCORE_CONFIDENCE = 0.95
"""The level of the mean score's bootstrap interval (the success interval is Wilson's 95% one)."""


class CheckpointRows(NamedTuple):
    """One checkpoint of a sweep: its label, its training step (``None`` when unknown) and its grade rows (a plain
    ``(label, step, rows)`` tuple is accepted wherever this is)."""

    label: str
    step: int | None
    rows: Sequence[GradeRow]
    run: str | None = None
    """The training run, where the sweep watches several (its ``vs previous`` is the run's previous checkpoint)."""


UNDECIDED = "; undecided: {} errored on one side only would make it worse"  # a comparison cell's end, the page's too
NO_PAIRS = "no paired episodes"
"""A comparison's outcome when the two sides share no answered episode."""


@dataclass(frozen=True)
class Versus:
    """A row's paired comparison with another checkpoint; every field ``None`` when there is none to make."""

    verdict: Verdict | None = None
    pairs: int | None = None
    """Episodes answered by both checkpoints (the comparison's sample)."""
    diff: float | None = None
    """This checkpoint's success rate minus the other's, over the pairs."""
    diff_low: float | None = None
    diff_high: float | None = None
    p: float | None = None
    """McNemar's exact two-sided p-value."""
    episodes_needed: int | None = None
    """Paired episodes that a ``min_effect`` difference would need for 80% power."""
    min_effect: float | None = None
    """The success difference ``episodes_needed`` is sized for (not the one observed)."""
    checkpoint: str | None = None
    """The checkpoint compared with (``None`` in a table written before it was recorded)."""
    undecided_by_errors: int | None = None
    """Episodes errored on one side only, where they would make this checkpoint worse had they gone against it."""

    @classmethod
    def of(cls, comparison: PairedComparison, checkpoint: str | None = None, undecided: int | None = None) -> Versus:
        low, high = comparison.success_interval or (None, None)
        return cls(
            verdict=comparison.verdict,
            pairs=comparison.pairs,
            diff=comparison.success_difference,
            diff_low=low,
            diff_high=high,
            p=comparison.mcnemar_p,
            episodes_needed=comparison.episodes_needed,
            min_effect=comparison.min_effect,
            checkpoint=checkpoint,
            undecided_by_errors=undecided,
        )

    @property
    def outcome(self) -> str:
        """The verdict in words: ``""`` with nothing to compare, ``no paired episodes`` when the two
        checkpoints share no answered episode (the test's "no difference" there says nothing)."""
        if self.verdict is None:
            return ""
        return self.verdict.value if self.pairs else NO_PAIRS

    def columns(self, prefix: str) -> dict[str, Any]:
        """The flat columns: ``vs_<prefix>`` for the verdict, ``<prefix>_<field>`` for the rest."""
        return {
            f"vs_{prefix}": self.outcome or None,
            **{f"{prefix}_{f.name}": getattr(self, f.name) for f in fields(self) if f.name != "verdict"},
        }

    @classmethod
    def from_columns(cls, prefix: str, row: dict[str, Any]) -> Versus:
        verdict = row[f"vs_{prefix}"]
        return cls(
            verdict=None if verdict is None else Verdict.NO_DIFFERENCE if verdict == NO_PAIRS else Verdict(verdict),
            **{f.name: row.get(f"{prefix}_{f.name}") for f in fields(cls) if f.name != "verdict"},
        )


NO_COMPARISON = Versus()


@dataclass(frozen=True, kw_only=True)
class SweepRow(RateFigures):
    """One checkpoint on one task (or on all of them): its figures and its comparisons."""

    checkpoint: str
    step: int | None
    task: str
    mean_score: float | None
    score_ci_low: float | None
    score_ci_high: float | None
    versus_previous: Versus = field(default=NO_COMPARISON)
    versus_baseline: Versus = field(default=NO_COMPARISON)
    run: str | None = None
    """The training run, where the sweep watches several (``None`` otherwise)."""

    def as_dict(self) -> dict[str, Any]:
        """The row's flat columns, in table order (the comparisons as ``vs_previous``, ``previous_diff``...)."""
        own = {name: getattr(self, name) for name in _OWN_COLUMNS}
        return {**own, **self.versus_previous.columns("previous"), **self.versus_baseline.columns("baseline")}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> SweepRow:
        own: dict[str, Any] = {name: row.get(name) for name in _OWN_COLUMNS}
        previous, baseline = (Versus.from_columns(prefix, row) for prefix in ("previous", "baseline"))
        return cls(**own, versus_previous=previous, versus_baseline=baseline)


_LABELS = ("checkpoint", "step", "task")
_OWN_COLUMNS = (
    *_LABELS,
    *(f.name for f in fields(SweepRow) if f.name not in _LABELS and not f.name.startswith("versus_")),
)
"""A row's own columns: what it is of, then its figures (the rates' first, as :class:`RateFigures` has them)."""
COLUMNS: tuple[str, ...] = (*_OWN_COLUMNS, *NO_COMPARISON.columns("previous"), *NO_COMPARISON.columns("baseline"))
"""The table's columns, in order (the CSV header)."""
_LATER_COLUMNS = (  # a table written before them still reads
    *("run", "previous_checkpoint", "baseline_checkpoint"),
    *("previous_undecided_by_errors", "baseline_undecided_by_errors"),
)


@dataclass(frozen=True)
class SweepComparison:
    """The sweep table: each checkpoint's task rows then its all-tasks row, checkpoints in training order."""

    rows: list[SweepRow]
    baseline: str | None = None
    """The label the ``vs_baseline`` columns compare with; ``None`` for none."""
    alpha: float = 0.05
    min_effect: float = 0.1

    @property
    def overall(self) -> list[SweepRow]:
        """Each checkpoint's all-tasks row, in order."""
        return [row for row in self.rows if row.task == ALL_TASKS]

    @property
    def tasks(self) -> list[str]:
        """The tasks any checkpoint ran, in the order they first appear (``"all"`` not included)."""
        return list(dict.fromkeys(row.task for row in self.rows if row.task != ALL_TASKS))

    @property
    def best(self) -> str | None:
        """The checkpoint whose all-tasks success rate has the highest 95% lower bound (``None``: none answered).

        Where checkpoints answered as many episodes, that is the highest rate; one that answered fewer
        (its other episodes errored) must do better to count: 1 success of 1 answered (lower bound 21%)
        is not ahead of 5 of 9 (27%). Ties (:attr:`tied`) go to the one later in training order (training went
        further for the same result): the later of the table, as the candidate is its last (the last run listed
        holds the latest checkpoint, whatever the steps of another run).
        """
        labels = self.tied
        tied = [row for row in self.overall if row.checkpoint in labels]
        return tied[-1].checkpoint if tied else None

    @property
    def tied(self) -> list[str]:
        """The checkpoints with the best all-tasks figures (the highest lower bound, then rate), in table order:
        one unless several are tied, which the conclusion says rather than call the latest of them the best."""
        rated = [row for row in self.overall if row.ci_low is not None]
        top = max(((row.ci_low or 0.0, row.success_rate or 0.0) for row in rated), default=None)
        return [row.checkpoint for row in rated if (row.ci_low, row.success_rate) == top]

    def named_previous(self, row: SweepRow) -> str | None:
        """The checkpoint ``row`` is compared with as its previous where that is not the one listed just before it
        (which answered no episode of its task, so an earlier one stands in), to be named beside the verdict."""
        labels, against = [overall.checkpoint for overall in self.overall], row.versus_previous.checkpoint
        before = labels[labels.index(row.checkpoint) - 1] if labels.index(row.checkpoint) else None
        return against if against not in (None, before) else None

    def to_csv(self) -> str:
        """One line per row, ``COLUMNS`` as the header; ``None`` is an empty cell, floats round-trip exactly."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in self.rows:
            writer.writerow(_csv_cell(value) for value in row.as_dict().values())
        return buffer.getvalue()

    def to_json(self) -> str:
        """The table as JSON with a fixed key order; non-finite numbers and ``None`` are ``null``."""
        rows = [{key: _finite(value) for key, value in row.as_dict().items()} for row in self.rows]
        document = {"baseline": self.baseline, "alpha": self.alpha, "min_effect": self.min_effect, "best": self.best}
        return json.dumps(document | {"rows": rows}, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SweepComparison:
        """The table :meth:`to_json` wrote (``best`` is derived again from the rows)."""
        document = cast(dict[str, Any], json.loads(text))
        missing = [key for key in ("baseline", "alpha", "min_effect", "rows") if key not in document]
        if missing:
            raise ValueError(f"not a sweep table: the JSON lacks {', '.join(missing)}")
        rows = cast(list[dict[str, Any]], document["rows"])
        for index, row in enumerate(rows):
            absent = [column for column in COLUMNS if column not in row and column not in _LATER_COLUMNS]
            if absent:
                raise ValueError(f"sweep table row {index}: missing column(s) {', '.join(absent)}")
        baseline, alpha, min_effect = document["baseline"], document["alpha"], document["min_effect"]
        return cls([SweepRow.from_dict(row) for row in rows], baseline, alpha, min_effect)

    def plot(self, path: Path | None = None) -> bytes:
        """The success-rate-vs-step figure as PNG bytes, also written to ``path`` when given."""
        png = png_bytes(self.figure())
        if path is not None:
            path.write_bytes(png)
        return png

    def figure(self) -> Figure:
        """Success rate against training step with its 95% band: one line per task and a bold all-tasks one
        (one all-tasks line per training run where the sweep watches several).

        Each point also carries its interval as a bar, which stays visible where a checkpoint with no
        answered episode cuts the line and its band.

        When any checkpoint lacks a step, every checkpoint is placed by its position in the order
        instead: a mixed axis of steps and positions would misplace them.
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        overall = self.overall
        by_step = bool(overall) and all(row.step is not None for row in overall)
        position = {
            row.checkpoint: float(row.step if by_step and row.step is not None else index)
            for index, row in enumerate(overall)
        }
        figure, axis = plt.subplots(figsize=(max(5.0, 0.6 * len(overall) + 3), 3.5), dpi=100)
        runs = list(dict.fromkeys(row.run for row in overall))
        series: list[tuple[str, list[SweepRow], bool]]
        if len(runs) > 1:  # a line per run: their steps share the axis, their checkpoints never join up
            series = [(f"run {run}", [row for row in overall if row.run == run], False) for run in runs]
        else:
            tasks = self.tasks if len(self.tasks) > 1 else []
            series = [(task, [row for row in self.rows if row.task == task], False) for task in tasks]
            series.append(("all tasks", overall, True))
        for name, task_rows, bold in series:
            xs = np.array([position[row.checkpoint] for row in task_rows], dtype=np.float64)
            rates, lows, highs = (
                np.array([_or_nan(getattr(row, column)) for row in task_rows], dtype=np.float64)
                for column in ("success_rate", "ci_low", "ci_high")
            )
            (drawn,) = axis.plot(
                xs, rates, marker="o", linewidth=2.4 if bold else 1.2, color="black" if bold else None, label=name
            )
            axis.fill_between(xs, lows, highs, where=~np.isnan(rates), color=drawn.get_color(), alpha=0.15)
            axis.vlines(xs, lows, highs, color=drawn.get_color(), alpha=0.5, linewidth=1.0)
        if len(runs) > 1 and by_step:
            steps = sorted({position[row.checkpoint] for row in overall})
            axis.set_xticks(steps, [f"{step:g}" for step in steps])
        else:
            axis.set_xticks([position[row.checkpoint] for row in overall], [row.checkpoint for row in overall])
        axis.tick_params(axis="x", labelrotation=45, labelsize=7)
        axis.set_xlabel("training step" if by_step else "checkpoint (in training order)")
        axis.set_ylabel("success rate (95% CI)")
        axis.set_ylim(-0.02, 1.02)
        axis.set_title("success rate per checkpoint", fontsize=9)
        axis.legend(fontsize=7, loc="best", framealpha=0.8)
        figure.tight_layout()
        return figure

    def markdown(self) -> str:
        """A compact table for the report, then a one-line conclusion: the best checkpoint and its verdict."""
        many_tasks = len(self.tasks) > 1
        header = ["checkpoint", "step", *(["task"] if many_tasks else []), "success (95% CI, n)", "vs previous"]
        header += [f"vs baseline ({markdown_cell(self.baseline)})"] if self.baseline is not None else []
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in self.rows if many_tasks else self.overall:
            cells = [markdown_cell(row.checkpoint), "" if row.step is None else str(row.step)]
            cells += [markdown_cell(row.task)] if many_tasks else []
            named = self.named_previous(row)
            cells += [_rate_cell(row), _versus_cell(row.versus_previous, named and markdown_cell(named))]
            cells += [_versus_cell(row.versus_baseline)] if self.baseline is not None else []  # none: no column
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join([*lines, "", no_html(self.conclusion())]) + "\n"

    def summary_lines(self) -> list[str]:
        """For a terminal: the candidate (the last checkpoint) against the previous one and the baseline, then
        the best checkpoint (:meth:`conclusion`)."""
        if not self.overall:
            return []
        candidate = self.overall[-1]
        sides = [("previous", candidate.versus_previous, self.named_previous(candidate))]
        sides.append(("baseline", candidate.versus_baseline, None))
        compared = [f"vs {name}: {_versus_cell(versus, named)}" for name, versus, named in sides if versus.verdict]
        line = f"candidate {candidate.checkpoint}: {_rate_cell(candidate)}" + "".join(f"; {c}" for c in compared)
        return [line, self.conclusion()]

    def conclusion(self) -> str:
        """``000300 is the best (62.0%, 95% CI 45.0%-77.0%, n=29); vs baseline 000100: better (+20.0%, p=0.012).``

        Checkpoints tied for the best are named together (``A, B and C tie for the best; C is taken (...)``, by
        :attr:`best`'s rule), the figures being the one taken's: to call it the best alone would claim that it did
        better, and at 0% checkpoints of different numbers of episodes tie."""
        best, tied = self.best, self.tied
        if best is None:
            return "No checkpoint has an answered episode: there is no best one."
        row = next(row for row in self.overall if row.checkpoint == best)
        errored = f", {row.errored} errored" if row.errored else ""
        figures = f"({row.success_rate:.1%}, 95% CI {row.ci_low:.1%}-{row.ci_high:.1%}, n={row.answered}{errored})"
        listed = f"{', '.join(tied[:-1])} and {tied[-1]} tie for the best; {best} is taken" if len(tied) > 1 else ""
        sentence = f"{listed or f'{best} is the best'} {figures}"
        if self.baseline is None:
            return sentence + "."
        if best == self.baseline:
            return sentence + "; it is the baseline."
        versus = row.versus_baseline
        if not versus.pairs:
            return sentence + f"; vs baseline {self.baseline}: {NO_PAIRS}."
        return sentence + f"; vs baseline {self.baseline}: {versus.verdict} ({versus.diff:+.1%}, p={versus.p:.3g})."


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _csv_cell(value: object) -> str:
    value = _finite(value)
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _rate_cell(row: SweepRow) -> str:
    errored = f", {row.errored} errored" if row.errored else ""
    if row.success_rate is None or row.ci_low is None or row.ci_high is None:
        return f"n/a (no answered episode{errored})"
    return f"{row.success_rate:.1%} ({row.ci_low:.1%}-{row.ci_high:.1%}, {row.succeeded}/{row.answered}{errored})"


def _versus_cell(versus: Versus, named: str | None = None) -> str:
    """The verdict, its difference and p, and the pairs (``with`` the checkpoint compared, where ``named``)."""
    if versus.verdict is None:
        return ""
    with_named = "" if named is None else f" with {named}"
    if not versus.pairs or versus.diff is None or versus.p is None:
        return NO_PAIRS + with_named
    text = f"{versus.verdict} {versus.diff:+.1%} (p={versus.p:.3g}, {versus.pairs} pairs{with_named}"
    if versus.verdict is Verdict.NO_DIFFERENCE and versus.episodes_needed is not None:
        effect = "" if versus.min_effect is None else f" to detect a {versus.min_effect:.0%} difference at 80% power"
        text += f"; ~{versus.episodes_needed} pairs needed{effect}"
    if versus.undecided_by_errors:  # errors are not failures, nor do they carry a pass
        text += UNDECIDED.format(versus.undecided_by_errors)
    return text + ")"
