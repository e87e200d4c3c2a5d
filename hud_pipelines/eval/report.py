"""The eval report: success rate with its 95% interval and denominators, a per-task table, a plot.

Rendered as markdown that links its plot (``report.png`` beside it, so the file reads in a terminal
and on a code host); the Dagster UI's copy carries the plot inline, as a PNG data URI.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hud_pipelines.errors import Fault
from hud_pipelines.eval.checks import CheckVerdict
from hud_pipelines.eval.grades import (
    GradeRow,
    Summary,
    as_graded_by,
    later_graders,
    markdown_cell,
    no_html,
    not_run_parts,
    one_line,
    summarize,
    summarize_by_task,
)
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.slots import seed_named

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STATUS_COLOURS = {
    EpisodeStatus.SUCCEEDED: "#2e7d32",
    EpisodeStatus.FAILED: "#c62828",
    EpisodeStatus.ERRORED: "#9e9e9e",
}


INTERVAL_DIGITS = 12
"""Decimals kept of the interval's bounds: floating-point residue (``2.8e-17`` for 0 of 6) is not a bound."""
TITLE_POINTS = 8
TITLE_CHARACTER_WIDTH = 0.6
"""A title character's width in ems (an upper bound for the default sans-serif), to wrap titles that fit."""


PLOT_ALT = "per-slot outcomes"


@dataclass(frozen=True)
class ReportContext:
    """What an eval's report says beside its rows, whichever format renders it (report.md, report.html).

    ``run_id`` is the run writing the report: the rows that earlier runs produced are counted apart,
    so nobody reads them as this run's. ``warnings`` open the report, before any figure; ``graded_by``
    (the deciding grader in words, since "success" means one thing in one benchmark and another
    elsewhere) follows the rate. ``prompts``: each task's prompt (what the policy was told).
    """

    checks: Sequence[CheckVerdict] = ()
    run_id: str | None = None
    overrides: Mapping[str, object] = field(default_factory=dict[str, object])
    """What the run configuration overrode of the YAML."""
    warnings: Sequence[str] = ()
    graded_by: str = ""
    description: str = ""
    """The pipeline's own words, shown under its name."""
    prompts: Mapping[str, str] = field(default_factory=dict[str, str])


def success_interval(summary: Summary) -> tuple[float, float]:
    """The 95% Wilson interval as people read it: ``0`` and ``1`` where the arithmetic lands a hair off them."""
    low, high = summary.success_interval
    return round(low, INTERVAL_DIGITS), round(high, INTERVAL_DIGITS)


@dataclass(frozen=True, kw_only=True)
class RateFigures:
    """A table row's denominators and success rate with its 95% Wilson interval: the columns every
    table of rates shares (a sweep's, a perturbation study's), before its own."""

    episodes: int
    """Scheduled episodes: ``succeeded + failed + errored``."""
    succeeded: int
    failed: int
    errored: int
    success_rate: float | None
    """Over the answered episodes (errors excluded); ``None`` when none answered."""
    ci_low: float | None
    ci_high: float | None

    @property
    def answered(self) -> int:
        """The episodes the rate is over: ``succeeded + failed``."""
        return self.succeeded + self.failed


def rate_columns(summary: Summary) -> dict[str, Any]:
    """The :class:`RateFigures` of ``summary``, as keywords for a row that extends it.

    Without an answered episode there is no rate and no interval (Wilson's ``(0, 1)`` would read as data).
    """
    low, high = success_interval(summary) if summary.graded else (None, None)
    return {
        "episodes": summary.scheduled,
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "errored": summary.errored,
        "success_rate": summary.success_rate,
        "ci_low": low,
        "ci_high": high,
    }


def other_graders(rows: Sequence[GradeRow]) -> list[tuple[str, Summary]]:
    """Each grader after the first with the figures it gives the same episodes."""
    return [(name, summarize(as_graded_by(rows, name))) for name in later_graders(rows)]


def rate_text(summary: Summary) -> str:
    """``50.0% (95% CI 15.0%-85.0%, 2/4)``: the rate, its interval and its denominator in one phrase."""
    rate = summary.success_rate
    if rate is None:
        return "n/a (no graded episodes)"
    low, high = success_interval(summary)
    return f"{rate:.1%} (95% CI {low:.1%}-{high:.1%}, {summary.succeeded}/{summary.graded})"


def error_bounds_text(summary: Summary) -> str:
    """``had the 2 errored episode(s) run: 43.8% (all failed) to 56.2% (all succeeded)``, or ``""`` without
    errored episodes."""
    bounds = summary.error_bounds
    if bounds is None:
        return ""
    low, high = bounds
    return f"had the {summary.errored} errored episode(s) run: {low:.1%} (all failed) to {high:.1%} (all succeeded)"


def figures_line(rows: Sequence[GradeRow]) -> str:
    """``success rate 50.0% (95% CI ...); scheduled 4 = succeeded 2 + failed 2 + errored 0``: a terminal's line."""
    summary = summarize(rows)
    rate = summary.success_rate
    low, high = success_interval(summary)
    rate_text = "n/a" if rate is None else f"{rate:.1%} (95% CI {low:.1%}-{high:.1%})"
    bounds = error_bounds_text(summary)
    return (
        f"success rate {rate_text}; scheduled {summary.scheduled} = succeeded {summary.succeeded} + failed "
        f"{summary.failed} + errored {summary.errored}" + (f"; {bounds}" if bounds else "")
    )


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def render_markdown(
    pipeline: str,
    rows: Sequence[GradeRow],
    plot: str | None = None,
    context: ReportContext | None = None,
    *,
    produced: Sequence[GradeRow] | None = None,
) -> str:
    """The report as markdown; ``plot`` is where its image is (a path beside the report, or a ``data:``
    URI where no file can be linked). The checks are listed with their verdicts, each task's prompt
    under the task table. ``produced``: every row of the results where ``rows`` are the part the rate
    counts (a matrix's control tasks, a sweep's candidate); which runs produced them is said of all.
    """
    context = context or ReportContext()
    total = summarize(rows)
    overrides = _overridden(context.overrides)
    overridden = [f"Run configuration overrides the YAML: {overrides}.", ""] if overrides else []
    lines = [
        f"# {no_html(pipeline)}",
        "",
        *([no_html(context.description.strip()), ""] if context.description.strip() else []),
        # the warnings come before any figure
        *(line for warning in context.warnings for line in (f"**Warning:** {no_html(warning)}.", "")),
        *_provenance(rows if produced is None else produced, context.run_id),
        *overridden,
        f"**Success rate:** {rate_text(total)}",
        "",
        *([f"Graded by {context.graded_by}.", ""] if context.graded_by else []),
        f"Scheduled {total.scheduled} = succeeded {total.succeeded} + failed {total.failed} + "
        f"errored {total.errored}{total.not_run_text} (error rate {total.error_rate:.1%}; errors are not failures).",
        "",
        *([f"The rate leaves the errored episodes out; {bounds}.", ""] if (bounds := error_bounds_text(total)) else []),
        f"Mean score {_number(total.mean_score)}, mean return {_number(total.mean_return)}.",
        "",
        "| task | scheduled | succeeded | failed | errored | success rate (95% CI) | mean return |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for task, summary in summarize_by_task(rows).items():
        lines.append(
            f"| {task} | {summary.scheduled} | {summary.succeeded} | {summary.failed} | {summary.errored} | "
            f"{rate_text(summary)} | {_number(summary.mean_return)} |"
        )
    told = [(task, context.prompts[task]) for task in summarize_by_task(rows) if context.prompts.get(task)]
    if told:
        lines += ["", "Task prompts (what the policy was told):", ""]
        lines += [f"- {task}: {markdown_cell(prompt)}" for task, prompt in told]
    others = other_graders(rows)
    if others:
        lines += [
            "",
            "## Other graders",
            "",
            "The first grader decides each episode; these judged the same episodes.",
            "",
            "| grader | success rate (95% CI) | mean score |",
            "|---|---|---:|",
            *(f"| {name} | {rate_text(summary)} | {_number(summary.mean_score)} |" for name, summary in others),
        ]
    if context.checks:
        lines += ["", "## Checks", "", "| check | verdict | blocking | details |", "|---|---|---|---|"]
        for verdict in context.checks:
            passed = "passed" if verdict.passed else "**FAILED**"
            details = markdown_cell(verdict.description)
            lines.append(f"| {verdict.name} | {passed} | {'yes' if verdict.blocking else 'no'} | {details} |")
    lines += errored_section(rows, "Errored episodes")
    if plot is not None:
        lines += ["", f"![{PLOT_ALT}]({plot})"]
    return "\n".join(lines) + "\n"


def errored_section(rows: Sequence[GradeRow], title: str, *, most: int = 20) -> list[str]:
    """A section listing the errored episodes among ``rows`` with their faults and errors (none: no lines)."""
    errors = [r for r in rows if r.status is EpisodeStatus.ERRORED]
    if not errors:
        return []
    lines = ["", f"## {title}", ""]
    lines += [
        f"- {r.task} {seed_named(r.seed)} (instance {r.instance} slot {r.slot})"
        f"{f' ({r.fault.value})' if r.fault is not None else ''}: {no_html(one_line(r.error))}"
        for r in errors[:most]
    ]
    if len(errors) > most:
        lines.append(f"- ... and {len(errors) - most} more (see the grades table)")
    return lines


def _overridden(overrides: Mapping[str, object]) -> str:
    return ", ".join(f"`{key}` = `{value}`" for key, value in sorted(overrides.items()))


def rows_by_run(rows: Sequence[GradeRow]) -> dict[str, int]:
    """How many of ``rows`` each run produced (rows not run with this configuration are no run's result)."""
    runs: dict[str, int] = {}
    for row in rows:
        if row.fault is not Fault.NOT_RUN:
            runs[row.run_id or "unknown"] = runs.get(row.run_id or "unknown", 0) + 1
    return runs


def _provenance(rows: Sequence[GradeRow], run_id: str | None) -> list[str]:
    """Which runs the rows come from: this run's count first, then each earlier run's."""
    runs = rows_by_run(rows)
    pending = ", ".join(not_run_parts(rows, unit=" row(s)"))
    if run_id is None:
        ran = [f"Rows from run(s): {', '.join(f'{r} ({n})' for r, n in runs.items())}"] if runs else []
        return ["; ".join([*ran, *([pending] if pending else [])]) + ".", ""]
    mine = runs.pop(run_id, 0)
    line = f"Run `{run_id}` produced {mine} of the {len(rows)} rows"
    if runs:
        line += "; earlier runs produced: " + ", ".join(f"`{r}` ({n})" for r, n in runs.items())
    return [line + (f"; {pending}" if pending else "") + ".", ""]


def render_plot(pipeline: str, rows: Sequence[GradeRow]) -> bytes:
    """A PNG of per-slot returns, coloured by outcome, grouped by task and instance."""
    return png_bytes(plot_figure(pipeline, rows))


def png_bytes(figure: Figure) -> bytes:
    """``figure`` as PNG bytes; the figure is closed (pyplot keeps every open one alive, a report draws many)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def plot_figure(pipeline: str, rows: Sequence[GradeRow]) -> Figure:
    """The per-slot returns figure; its title is wrapped to the figure's width and its colours are a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ordered = sorted(rows, key=lambda r: (r.task_index, r.instance, r.slot))
    width = max(4.0, 0.25 * len(ordered) + 2)
    figure, axis = plt.subplots(figsize=(width, 3.0), dpi=100)
    positions = list(range(len(ordered)))
    axis.bar(
        positions,
        [r.total_reward for r in ordered],
        color=[STATUS_COLOURS[r.status] for r in ordered],
    )
    axis.set_xticks(positions, [f"{r.task}/{r.instance}/{r.slot}" for r in ordered], rotation=90, fontsize=6)
    axis.set_ylabel("episode return")
    characters = int(width * 72 / (TITLE_POINTS * TITLE_CHARACTER_WIDTH)) - 2
    title = textwrap.fill(f"{pipeline}: per-slot returns", width=max(characters, 10), break_long_words=True)
    axis.set_title(title, fontsize=TITLE_POINTS)
    handles = [Patch(color=colour, label=status.value) for status, colour in STATUS_COLOURS.items()]
    axis.legend(handles=handles, fontsize=6, loc="best", framealpha=0.8)
    figure.tight_layout()
    return figure
