"""The summary section of ``report.html``: the headline rate with its interval and denominators, what
decides success, and the figures every other grader gives the same episodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from hud_pipelines.eval.grades import GradeRow, Summary
from hud_pipelines.eval.report import error_bounds_text, other_graders, rate_text, success_interval


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def number(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def summary_section(summary: Summary, graded_by: str = "", scope: str = "") -> str:
    """``graded_by``: the deciding grader in words ("success" means one thing here and another elsewhere);
    ``scope``: which episodes the headline counts, when not all of the page's (a matrix's control tasks)."""
    low, high = success_interval(summary)
    interval = "" if summary.success_rate is None else f"95% CI {percent(low)} to {percent(high)}"
    graded = f'<p class="graded-by">Graded by {escape(graded_by)}.</p>' if graded_by else ""
    graded += f'<p class="scope">{escape(scope)}.</p>' if scope else ""
    # a rate over the few episodes that did not error must not read as the eval's result at a glance
    errored = f'<span class="errored-share">{summary.errored} of {summary.scheduled} errored</span>'
    rate = "rate few" if summary.errored >= summary.graded > 0 else "rate"
    return f"""<section id="summary">
<div class="headline"><span class="{rate}">{percent(summary.success_rate)}</span>
<span class="interval">{interval}</span>
<span class="denominator">success rate: {summary.succeeded} succeeded of {summary.graded} graded</span>
{errored if summary.errored else ""}</div>
{graded}<p class="counts">Scheduled <b>{summary.scheduled}</b> = succeeded <b>{summary.succeeded}</b> + failed
<b>{summary.failed}</b> + errored <b>{summary.errored}</b>{summary.not_run_text}
(error rate {percent(summary.error_rate)}; errors are not failures).</p>{_bounds(summary)}
<p>Mean score {number(summary.mean_score)}, mean return {number(summary.mean_return)} (graded episodes).</p>
</section>"""


def _bounds(summary: Summary) -> str:
    text = error_bounds_text(summary)
    return f'\n<p class="error-bounds">The rate leaves the errored episodes out; {escape(text)}.</p>' if text else ""


def graders_section(rows: Sequence[GradeRow]) -> str:
    """Each grader after the first: its success rate (interval, denominators) and mean score."""
    items = "".join(
        f"<li>{escape(name)}: {escape(rate_text(s))}, mean score {number(s.mean_score)}</li>"
        for name, s in other_graders(rows)
    )
    return f'<section id="graders"><h2>Other graders</h2><ul>{items}</ul></section>' if items else ""
