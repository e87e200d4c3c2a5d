"""Building ``report.html``: the summary, the checks, provenance, the per-task table and the episode cards.

Everything a reader needs is server-rendered HTML here; the script only adds the plots (drawn from
the JSON in ``<script id="episode-data">``), the video cursor, filters and sorting. Every text that
comes from a run (task names, reasons, overrides) is escaped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from hud_pipelines.eval.checks import CheckVerdict
from hud_pipelines.eval.grades import GradeRow, not_run_parts, summarize, summarize_by_task
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.eval.perturbations import CONTROL_NOTE, EXPLANATION, HEADERS, AxisRow, cells
from hud_pipelines.eval.report import ReportContext, rate_text, rows_by_run
from hud_pipelines.eval.report_html.dataset_links import DATASET_SCRIPT, write_dataset_links
from hud_pipelines.eval.report_html.episodes import EpisodeView, episode_views
from hud_pipelines.eval.report_html.summary import graders_section, number, summary_section
from hud_pipelines.eval.sweep_table import UNDECIDED, SweepComparison, SweepRow, Versus
from hud_pipelines.recording.events import EpisodeStatus

HTML_NAME = "report.html"
ASSETS_DIR = "report_files"
"""Beside the page: its script and style sheet (copied from the package on every write)."""
CONTROL_SCOPE = "Control tasks only: each perturbation is compared with its control under Perturbations"
ASSETS = ("report.js", "report.css")
DATA_ID = "episode-data"


def html_path(outputs: EvalOutputs) -> Path:
    return outputs.base / HTML_NAME


@dataclass(frozen=True)
class HtmlReport:
    """A written page and the episodes it shows (their videos make the report asset's thumbnails)."""

    path: Path
    views: list[EpisodeView]


def write_html_report(
    pipeline: str,
    rows: Sequence[GradeRow],
    outputs: EvalOutputs,
    context: ReportContext | None = None,
    *,
    sweep: SweepComparison | None = None,
    dataset: Path | None = None,
    repo_id: str = "",
    perturbations: tuple[Sequence[AxisRow], str] | None = None,
    members: Mapping[str, EvalOutputs] | None = None,
    not_evaluated: Sequence[str] = (),
    headline: Sequence[GradeRow] | None = None,
) -> HtmlReport:
    """Write ``report.html`` and its assets under ``outputs/<name>/``; ``context`` is what report.md says too.

    A sweep's page shows its checkpoints side by side (the comparison and its plot), each linked to
    its own page, and every checkpoint's episodes with a checkpoint filter (``members``: each
    checkpoint's outputs, where its traces are). ``dataset`` is where the dataset of these episodes is
    published (the cards link to their dataset episodes once it is). ``not_evaluated``: the sweep's
    checkpoints found with no results yet, each with why. ``headline``: the rows the headline rate
    counts, when not all of them (a matrix's control tasks, as the checks judge them).
    """
    page = html_path(outputs)
    page.parent.mkdir(parents=True, exist_ok=True)
    _copy_assets(page.parent / ASSETS_DIR)
    write_dataset_links(page.parent / ASSETS_DIR, dataset, repo_id, members=list(members or ()))
    views = episode_views(rows, outputs, page.parent, members=members)
    text = render_page(
        pipeline,
        rows,
        views,
        context or ReportContext(),
        sweep=sweep,
        perturbations=perturbations,
        not_evaluated=not_evaluated,
        headline=headline,
    )
    write_atomically(page, text)
    return HtmlReport(page, views)


def _copy_assets(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    static = resources.files("hud_pipelines.eval.report_html") / "static"
    for name in ASSETS:
        (folder / name).write_bytes((static / name).read_bytes())


def render_page(
    pipeline: str,
    rows: Sequence[GradeRow],
    views: Sequence[EpisodeView],
    context: ReportContext,
    *,
    sweep: SweepComparison | None = None,
    perturbations: tuple[Sequence[AxisRow], str] | None = None,
    not_evaluated: Sequence[str] = (),
    headline: Sequence[GradeRow] | None = None,
) -> str:
    description = context.description
    judged = rows if headline is None else headline
    scope = "" if len(judged) == len(rows) else CONTROL_SCOPE
    title = escape(f"{pipeline}: eval report")
    body = "\n".join(
        [
            f"<header><h1>{escape(pipeline)}</h1>"
            + (f'<p class="description">{escape(description.strip())}</p>' if description.strip() else "")
            + "</header>",
            *(f'<p class="warning"><strong>Warning:</strong> {escape(warning)}.</p>' for warning in context.warnings),
            summary_section(summarize(judged), context.graded_by, scope)
            if sweep is None
            else _checkpoints(sweep, not_evaluated, perturbations is not None),
            graders_section(judged) if sweep is None else "",  # a sweep's checkpoints each have their own page
            _checks(context.checks),
            _provenance(rows, context.run_id, context.overrides),
            _task_table(rows, [row.checkpoint for row in sweep.overall], context.prompts)
            if sweep is not None
            else _task_table(judged, (), context.prompts),  # a matrix's values are under Perturbations, as in report.md
            _perturbations(*perturbations) if perturbations is not None else "",
            _episodes(views),
        ]
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{ASSETS_DIR}/report.css">
</head>
<body>
{body}
<script type="application/json" id="{DATA_ID}">{_episode_json(views)}</script>
<script src="{ASSETS_DIR}/{DATASET_SCRIPT}"></script>
<script src="{ASSETS_DIR}/report.js"></script>
</body>
</html>
"""


def _checks(checks: Sequence[CheckVerdict]) -> str:
    if not checks:
        return ""
    rows = "\n".join(
        f'<tr class="{"passed" if c.passed else "failed"}"><td>{escape(c.name)}</td>'
        f"<td>{'passed' if c.passed else 'FAILED'}</td><td>{'yes' if c.blocking else 'no'}</td>"
        f"<td>{escape(c.description)}</td></tr>"
        for c in checks
    )
    return f"""<section id="checks"><h2>Checks</h2>
<table><thead><tr><th>check</th><th>verdict</th><th>blocking</th><th>details</th></tr></thead>
<tbody>
{rows}
</tbody></table></section>"""


def _provenance(rows: Sequence[GradeRow], run_id: str | None, overrides: Mapping[str, object]) -> str:
    """Which run produced how many rows (this run first), and what the run configuration overrode."""
    ordered = sorted(rows_by_run(rows).items(), key=lambda item: (item[0] != run_id, item[0]))
    of_all = f" of {len(rows)} rows"
    runs = [f"<code>{escape(run)}</code>{' (this run)' if run == run_id else ''}: {n}{of_all}" for run, n in ordered]
    items = "\n".join(f"<li>{item}</li>" for item in [*runs, *not_run_parts(rows, unit=of_all)])  # and not run yet
    overridden = (
        '<p>Run configuration overrides the YAML:</p><ul class="overrides">'
        + "".join(
            f"<li><code>{escape(str(key))}</code> = <code>{escape(json.dumps(value, default=str))}</code></li>"
            for key, value in sorted(overrides.items())
        )
        + "</ul>"
        if overrides
        else "<p>No run configuration overrides: the YAML as written.</p>"
    )
    return f"""<section id="provenance"><h2>Provenance</h2>
<ul class="runs">
{items}
</ul>
{overridden}
</section>"""


def _task_table(rows: Sequence[GradeRow], checkpoints: Sequence[str], prompts: Mapping[str, str]) -> str:
    """Each task's figures (and its prompt, where one was given); in a sweep each checkpoint's (a rate over
    several weights would mean nothing)."""
    groups = [(label, [r for r in rows if r.checkpoint == label]) for label in checkpoints] or [("", rows)]
    told = any(prompts.get(row.task) for row in rows)
    lines = "\n".join(
        f"<tr>{f'<td>{escape(label)}</td>' if label else ''}<td>{escape(task)}</td><td>{s.scheduled}</td>"
        f"<td>{s.succeeded}</td><td>{s.failed}</td><td>{s.errored}</td><td>{escape(rate_text(s))}</td>"
        f"<td>{number(s.mean_score)}</td><td>{number(s.mean_return)}</td>"
        + (f"<td>{escape(prompts.get(task, ''))}</td>" if told else "")
        + "</tr>"
        for label, group in groups
        for task, s in summarize_by_task(group).items()
    )
    title, first = ("Per checkpoint and task", "<th>checkpoint</th>") if checkpoints else ("Per task", "")
    return f"""<section id="tasks"><h2>{title}</h2>
<table><thead><tr>{first}<th>task</th><th>scheduled</th><th>succeeded</th><th>failed</th><th>errored</th>
<th>success rate (95% CI)</th><th>mean score</th><th>mean return</th>{"<th>prompt</th>" if told else ""}</tr></thead>
<tbody>
{lines}
</tbody></table></section>"""


def _perturbations(table: Sequence[AxisRow], whose: str) -> str:
    """Each matrix value of a task against its control, as in ``perturbations.csv``."""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
    body = "\n".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells(row)) + "</tr>" for row in table)
    return f"""<section id="perturbations"><h2>Perturbations{escape(whose)}</h2>
<p>{escape(EXPLANATION)}</p>
<table><thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table></section>"""


def _checkpoints(table: SweepComparison, not_evaluated: Sequence[str], matrix: bool) -> str:
    """A sweep: each checkpoint's overall figures and verdicts, linked to its own page, and the plot."""
    waiting = f"<p>Not evaluated yet: {escape('; '.join(not_evaluated))}.</p>" if not_evaluated else ""
    waiting += f"<p>{escape(CONTROL_NOTE.strip().replace('`', ''))}</p>" if matrix else ""
    baseline = f" and baseline {escape(table.baseline)}" if table.baseline else ""
    lines = "\n".join(_checkpoint_row(table, row) for row in table.overall)
    versus_baseline = "<th>vs baseline</th>" if table.baseline is not None else ""  # no baseline: no column
    best = f'<p class="best">{escape(table.conclusion())}</p>' if table.best else ""
    return f"""<section id="checkpoints"><h2>Checkpoints</h2>
<p>Every checkpoint on the same episodes; each compared with the previous one{baseline} by McNemar's exact
test on the paired successes. Each checkpoint's page shows its episodes.</p>
{best}
<table><thead><tr><th>checkpoint</th><th>step</th><th>episodes</th><th>succeeded</th><th>failed</th>
<th>errored</th><th>success rate (95% CI)</th><th>vs previous</th>{versus_baseline}</tr></thead>
<tbody>
{lines}
</tbody></table>
{waiting}
<figure><img src="comparison.png" alt="success rate by training step with its 95% interval"></figure>
</section>"""


def _checkpoint_row(table: SweepComparison, row: SweepRow) -> str:
    """A checkpoint's cells (its ``vs previous`` names the checkpoint it is with where that is not the row above)."""
    cells = [
        f'<a href="checkpoints/{escape(quote(row.checkpoint))}/{HTML_NAME}">{escape(row.checkpoint)}</a>',
        "" if row.step is None else str(row.step),
        str(row.episodes),
        str(row.succeeded),
        str(row.failed),
        str(row.errored),
        escape(_rate(row.success_rate, row.ci_low, row.ci_high)),
        escape(_verdict(row.versus_previous, table.named_previous(row))),
        *([escape(_verdict(row.versus_baseline))] if table.baseline is not None else []),
    ]
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _rate(rate: float | None, low: float | None, high: float | None) -> str:
    return "n/a" if rate is None or low is None or high is None else f"{rate:.1%} ({low:.1%}-{high:.1%})"


def _verdict(versus: Versus, named: str | None = None) -> str:
    with_named = "" if named is None else f" with {named}"
    if not versus.pairs or versus.diff is None or versus.p is None:
        return versus.outcome + with_named
    interval = (  # the difference's exact interval, as comparison.csv has it
        f"95% CI {versus.diff_low:+.1%} to {versus.diff_high:+.1%}, "
        if versus.diff_low is not None and versus.diff_high is not None
        else ""
    )
    undecided = UNDECIDED.format(versus.undecided_by_errors) if versus.undecided_by_errors else ""
    return (
        f"{versus.outcome} {versus.diff:+.1%} ({interval}p={versus.p:.3g}, {versus.pairs} pairs{with_named}{undecided})"
    )


# -- episodes --------------------------------------------------------------------------------------------


def _episodes(views: Sequence[EpisodeView]) -> str:
    tasks = sorted({v.row.task for v in views})
    statuses = "".join(
        f'<label><input type="checkbox" name="status" value="{s.value}" checked> {s.value}</label>'
        for s in EpisodeStatus
    )
    options = "".join(f'<option value="{escape(t)}">{escape(t)}</option>' for t in tasks)
    labels = list(dict.fromkeys(v.row.checkpoint for v in views if v.row.checkpoint))
    checkpoints = (
        '<label>checkpoint <select name="checkpoint"><option value="">all checkpoints</option>'
        + "".join(f'<option value="{escape(c)}">{escape(c)}</option>' for c in labels)
        + '</select></label> <label><input type="checkbox" name="differs"> only episodes whose outcome differs '
        "between checkpoints</label>"
        if labels
        else ""
    )
    differs = _differing(views)
    cards = "\n".join(_card(v, (v.row.task, v.row.seed) in differs) for v in views)
    return f"""<section id="episodes"><h2>Episodes</h2>
<form id="controls" onsubmit="return false">
<fieldset class="statuses"><legend>status</legend>{statuses}</fieldset>
<label>task <select name="task"><option value="">all tasks</option>{options}</select></label>
<label>seed <input name="seed" type="number" min="0" placeholder="any" size="8"></label>{checkpoints}
<label>sort <select name="sort">
<option value="">schedule order</option>
<option value="score-desc">score, highest first</option><option value="score-asc">score, lowest first</option>
<option value="return-desc">return, highest first</option><option value="return-asc">return, lowest first</option>
</select></label>
<output id="shown">{len(views)} of {len(views)} episodes</output>
</form>
<div id="cards">
{cards}
</div></section>"""


def _differing(views: Sequence[EpisodeView]) -> set[tuple[str, int | None]]:
    """The episodes (task, seed) that succeed under some checkpoints and fail under others: where they part."""
    outcomes: dict[tuple[str, int | None], set[EpisodeStatus]] = {}
    for view in views:
        if view.row.checkpoint is not None and view.row.status is not EpisodeStatus.ERRORED:
            outcomes.setdefault((view.row.task, view.row.seed), set()).add(view.row.status)
    return {episode for episode, seen in outcomes.items() if len(seen) > 1}


def _card(view: EpisodeView, differs: bool = False) -> str:
    row = view.row
    status = row.status.value
    fault = f'<span class="fault">{escape(row.fault.value)}</span>' if row.fault is not None else ""
    graded = row.status is not EpisodeStatus.ERRORED
    facts = [
        ("status", status + (f" ({row.fault.value})" if row.fault is not None else "")),
        ("score", number(row.score) if graded else "n/a"),
        ("return", number(row.total_reward)),
        ("steps", str(row.steps)),
        ("seed", "n/a" if row.seed is None else str(row.seed)),
        ("run", row.run_id or "unknown"),
    ]
    listed = "".join(f"<dt>{name}</dt><dd>{escape(value)}</dd>" for name, value in facts)
    return f"""<article class="episode {status}" id="episode-{view.index}" data-index="{view.index}"
 data-status="{status}" data-task="{escape(row.task)}" data-checkpoint="{escape(row.checkpoint or "")}"
 data-seed="{"" if row.seed is None else row.seed}" data-differs="{int(differs)}"
 data-score="{_sortable(row.score if graded else None)}" data-return="{_sortable(row.total_reward)}">
<h3><span class="badge {status}">{status}</span>{fault} {_where(row)}</h3>
<dl>{listed}</dl>
{_error(row)}{_videos(view)}<div class="plots" data-episode="{view.index}"></div>
{_trace_link(view)}{_dataset_link(view)}
</article>"""


def _where(row: GradeRow) -> str:
    checkpoint = f"checkpoint {escape(row.checkpoint)} · " if row.checkpoint else ""
    return f"{checkpoint}{escape(row.task)} · instance {row.instance} · slot {row.slot}"


def _error(row: GradeRow) -> str:
    if row.error is None:
        return ""
    headline, _, rest = row.error.strip().partition("\n")
    details = f"<details><summary>full reason</summary><pre>{escape(rest)}</pre></details>" if rest.strip() else ""
    return f'<div class="error"><p>{escape(headline)}</p>{details}</div>\n'


def _videos(view: EpisodeView) -> str:
    if not view.videos:
        return ""
    figures = "".join(
        f'<figure><video src="{escape(v.href)}" controls muted playsinline preload="metadata"></video>'
        f"<figcaption>{escape(v.camera)}</figcaption></figure>"
        for v in view.videos
    )
    return f'<div class="videos">{figures}</div>\n'


def _trace_link(view: EpisodeView) -> str:
    if view.trace_href is None:
        return '<p class="trace">no trace (the episode never started)</p>'
    return f'<p class="trace"><a href="{escape(view.trace_href)}">trace</a></p>'


def _dataset_link(view: EpisodeView) -> str:
    """Filled by the script from ``dataset.js`` once the episode is in a published dataset."""
    if not view.row.trace_id:
        return ""
    return f'<p class="dataset" data-trace="{escape(view.row.trace_id)}" hidden></p>'


def _sortable(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else repr(float(value))


def _episode_json(views: Sequence[EpisodeView]) -> str:
    """The plots' data; ``</`` is escaped so no value can end the script element."""
    data = {str(v.index): v.plot_data() for v in views if v.series}
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
