"""The HTML report, seen as its reader sees it: in a real headless Chromium, videos playing, plots drawn.

Also the report's written form (every episode marked, errored and interrupted ones included), the
report asset's link to it, and the defects of ``report.md`` it came with.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest
from PIL import Image

from hud_pipelines.cli.report_server import ReportRequestHandler
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.errors import Fault
from hud_pipelines.eval import steps
from hud_pipelines.eval.checks import verdicts
from hud_pipelines.eval.grades import GradeRow, no_html, summarize
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.report import ReportContext, plot_figure, render_markdown, success_interval
from hud_pipelines.eval.report_html import html_path
from hud_pipelines.recording import trace_reader, traces
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.recording.thumbnails import last_frame
from hud_pipelines.spec.loader import load_pipeline_text
from tests.dagster.support import REPO, SIMS, pipeline_text, sim_label
from tests.eval.test_report_server import serving

CAMERA = f"{REPO / 'envs' / 'camera_pendulum.py'}:camera_pendulum"
DEADLINE_MS = 15_000


def _spec(tmp_path: Path, spec: dict[str, Any]) -> Any:
    return load_pipeline_text(json.dumps(spec), source=tmp_path / f"{spec['name']}.yaml")


def _grades(outputs: EvalOutputs) -> list[GradeRow]:
    return [GradeRow.from_dict(r) for r in json.loads(outputs.grades_json.read_text())]


# -- a camera eval with video, in the browser -----------------------------------------------------------


@dataclass(frozen=True)
class CameraEval:
    outputs: EvalOutputs
    rows: list[GradeRow]
    names: dict[str, list[str]]
    """Trace id -> the plot captions its header's per-dimension names call for."""
    rate: float
    """The control rate the traces' videos are encoded at (frame k is step k)."""
    spec: Any


def _captions(header: dict[str, Any]) -> list[str]:
    states = [f"{feature} · {name}" for feature, names in header["state_names"].items() for name in names]
    return [*states, *header["action_names"], "reward"]


@pytest.fixture(scope="module")
def camera_eval(tmp_path_factory: pytest.TempPathFactory) -> CameraEval:
    """Two tasks x 2 slots of the camera pendulum, 30 steps each, every camera recorded as video."""
    tmp_path = tmp_path_factory.mktemp("camera")
    spec = _spec(
        tmp_path,
        {
            "name": "pendulum",
            "sim": {"factory": CAMERA, "num_envs": 2},
            "agent": {"policy": {"kind": "random", "seed": 1}},
            "tasks": [{"name": "near", "seed": 0}, {"name": "far", "seed": 100}],
            "group": 1,
            "max_steps": 30,
            "graders": [{"kind": "return", "threshold": -150}],
            "traces": {"video": "all"},
            "dataset": {"enabled": True, "repo_id": "local/pendulum_report", "video": False},
        },
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        evaluation = steps.evaluate(spec, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    written = [
        trace_reader.read_trace(path) for path in evaluation.outputs.base.rglob(f"traces/**/*{traces.TRACE_SUFFIX}")
    ]
    names = {t.trace_id: _captions(t.header) for t in written}
    (rate,) = {t.header["control_rate"] for t in written}
    return CameraEval(evaluation.outputs, evaluation.rows, names, rate, spec)


class Page:
    """A browser tab on one report, collecting every console error and uncaught exception."""

    def __init__(self, browser: Any, url: str) -> None:
        self.errors: list[str] = []
        self.tab = browser.new_page(viewport={"width": 1280, "height": 900})
        self.tab.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.tab.on("pageerror", lambda error: self.errors.append(str(error)))
        self.tab.goto(url)
        self.tab.wait_for_load_state("load")

    def visible(self) -> list[str]:
        return self.tab.eval_on_selector_all("article.episode:not([hidden])", "cs => cs.map(c => c.id)")

    def close(self) -> None:
        self.tab.close()


def _card_id(rows: list[GradeRow], row: GradeRow) -> str:
    return f"episode-{rows.index(row)}"


def test_the_report_plays_every_video_draws_every_plot_and_filters_and_sorts_its_cards(
    camera_eval: CameraEval, browser: Any, tmp_path: Path, record_property: Any
) -> None:
    rows = camera_eval.rows
    assert {r.status for r in rows} == {EpisodeStatus.SUCCEEDED, EpisodeStatus.FAILED}, "both outcomes to filter"
    page = Page(browser, html_path(camera_eval.outputs).as_uri())
    tab = page.tab

    # every video has a duration and plays
    tab.wait_for_function("[...document.querySelectorAll('video')].every(v => v.readyState >= 1)", timeout=DEADLINE_MS)
    durations = tab.eval_on_selector_all("video", "vs => vs.map(v => v.duration)")
    assert len(durations) == len(rows), "one camera, one video per episode"
    assert all(d > 0 for d in durations), durations
    played = tab.evaluate(
        """async () => Promise.all([...document.querySelectorAll('video')].map(v => new Promise((done, fail) => {
               v.addEventListener('timeupdate', function moved() {
                   if (v.currentTime === 0) return;
                   v.removeEventListener('timeupdate', moved);
                   v.pause();
                   done(v.currentTime);
               });
               v.play().catch(fail);
           })))"""
    )
    assert all(t > 0 for t in played), played

    # plots: one per state and action dimension plus the reward, captioned with the header's names
    for row in rows:
        card = tab.locator(f"#{_card_id(rows, row)}")
        expected = camera_eval.names[row.trace_id or ""]
        assert card.locator(".plot figcaption").all_inner_texts() == expected
        paths = card.locator("svg path.line").evaluate_all("ps => ps.map(p => p.getAttribute('d'))")
        assert len(paths) == len(expected)
        assert all(d.startswith("M") and d.count("L") >= row.steps - 1 for d in paths), paths

    # the cursor follows the video's time: frame k is step k
    first = tab.locator(f"#{_card_id(rows, rows[0])}")
    positions: list[float] = []
    for seconds in (0.2, 0.7):
        first.locator("video").evaluate(
            "(v, t) => new Promise(done => { v.addEventListener('seeked', done, {once: true}); v.currentTime = t; })",
            seconds,
        )
        assert first.locator(".plots").get_attribute("data-step") == str(int(seconds * camera_eval.rate))
        cursors = first.locator("line.cursor").evaluate_all("ls => ls.map(l => Number(l.getAttribute('x1')))")
        assert len(set(cursors)) == 1, "every plot of the card shows the same step"
        positions.append(cursors[0])
    assert positions[0] < positions[1], positions

    # filters: status and task
    everyone = [_card_id(rows, r) for r in rows]
    assert page.visible() == everyone
    tab.locator('input[name="status"][value="failed"]').uncheck()
    assert page.visible() == [_card_id(rows, r) for r in rows if r.status is not EpisodeStatus.FAILED]
    tab.locator('input[name="status"][value="failed"]').check()
    tab.select_option('select[name="task"]', "far")
    assert page.visible() == [_card_id(rows, r) for r in rows if r.task == "far"]
    tab.select_option('select[name="task"]', "")
    assert tab.locator("#shown").inner_text() == f"{len(rows)} of {len(rows)} episodes"

    # sorting by score and by return
    tab.select_option('select[name="sort"]', "score-desc")
    assert page.visible() == [_card_id(rows, r) for r in sorted(rows, key=lambda r: -r.score)]
    tab.select_option('select[name="sort"]', "return-asc")
    assert page.visible() == [_card_id(rows, r) for r in sorted(rows, key=lambda r: r.total_reward)]

    # each card links to its trace
    for row in rows:
        href = tab.locator(f"#{_card_id(rows, row)} .trace a").get_attribute("href")
        assert href is not None
        assert (camera_eval.outputs.base / href).name == f"{row.trace_id}.jsonl"
        assert (camera_eval.outputs.base / href).is_file()

    # and to its episode in the published dataset
    dataset = camera_eval.outputs.dataset
    indices = {r["trace_id"]: r["episode_index"] for r in read_episode_records(dataset)}
    assert set(indices) == {r.trace_id for r in rows}
    for row in rows:
        link = tab.locator(f"#{_card_id(rows, row)} .dataset a")
        assert link.inner_text() == f"dataset episode {indices[row.trace_id]}"
        assert (camera_eval.outputs.base / (link.get_attribute("href") or "")).resolve() == dataset.resolve()
        assert f"--repo-id local/pendulum_report --root {dataset} --episode-index {indices[row.trace_id]}" in (
            link.get_attribute("title") or ""
        )

    tab.select_option('select[name="sort"]', "")
    screenshot = tmp_path / "report.png"
    tab.screenshot(path=str(screenshot), full_page=True)
    record_property("screenshot", str(screenshot))
    print(f"screenshot of the report: {screenshot}")
    assert page.errors == []
    page.close()


def test_the_report_before_its_dataset_is_published_links_no_dataset_episode(
    camera_eval: CameraEval, browser: Any, tmp_path: Path
) -> None:
    outputs = EvalOutputs(tmp_path / "outputs", camera_eval.outputs.pipeline)
    shutil.copytree(camera_eval.outputs.base, outputs.base)  # the results and traces, no dataset
    steps.report_step(camera_eval.spec, outputs, dataset=outputs.dataset)
    page = Page(browser, html_path(outputs).as_uri())
    assert page.tab.locator("article.episode").count() == len(camera_eval.rows)
    assert page.tab.locator(".dataset a").count() == 0
    assert page.tab.locator(".dataset:not([hidden])").count() == 0
    assert page.errors == [], "the links file is there, empty: no missing script"
    page.close()


def test_a_sweeps_page_links_each_card_to_the_dataset_of_several_that_holds_its_episode(
    camera_eval: CameraEval, browser: Any, tmp_path: Path
) -> None:
    """A sweep's page shows every checkpoint's episodes, each in its checkpoint's own dataset: its links file is
    a list (before, it was ``null``: no card of a sweep's page linked to its dataset episode)."""
    from hud_pipelines.eval.report_html.dataset_links import dataset_links

    outputs = EvalOutputs(tmp_path / "outputs", camera_eval.outputs.pipeline)
    shutil.copytree(camera_eval.outputs.base, outputs.base)
    steps.report_step(camera_eval.spec, outputs, dataset=None)
    page_dir = html_path(outputs).parent
    dataset = camera_eval.outputs.dataset
    holding = dataset_links(dataset, "local/pendulum_report", page_dir)
    assert holding is not None
    other = {**holding, "root": "elsewhere", "href": "elsewhere", "episodes": {"another-trace": 0}}
    (page_dir / "report_files" / "dataset.js").write_text(f"window.HUD_DATASET = {json.dumps([other, holding])};\n")
    page = Page(browser, html_path(outputs).as_uri())
    links = page.tab.locator(".dataset a")
    assert links.count() == len(camera_eval.rows)
    indices = {r["trace_id"]: r["episode_index"] for r in read_episode_records(dataset)}
    for row in camera_eval.rows:
        link = page.tab.locator(f"#{_card_id(camera_eval.rows, row)} .dataset a")
        assert link.inner_text() == f"dataset episode {indices[row.trace_id]}"
        assert (page_dir / (link.get_attribute("href") or "")).resolve() == dataset.resolve()
    assert page.errors == []
    page.close()


def test_the_reports_show_the_pipelines_description_and_task_prompts_escaped(
    camera_eval: CameraEval, tmp_path: Path
) -> None:
    outputs = EvalOutputs(tmp_path / "outputs", camera_eval.outputs.pipeline)
    shutil.copytree(camera_eval.outputs.base, outputs.base)
    near, far = camera_eval.spec.tasks
    tasks = [near.model_copy(update={"prompt": 'swing "up" | <fast>'}), far]
    description = "Swing <up> & hold, `x < 5`, see <https://example.org/a>"
    described = camera_eval.spec.model_copy(update={"description": description, "tasks": tasks})
    steps.report_step(described, outputs)
    markdown = outputs.report_md.read_text()
    shown = "\n\nSwing &lt;up> & hold, `x < 5`, see <https://example.org/a>\n"
    assert shown in markdown, (
        "the YAML says reports show it, as text (a code span and a link as they are), never as HTML"
    )
    assert '- near: swing "up" \\| &lt;fast>' in markdown, "what the policy was told, in a table-safe cell"
    page = html_path(outputs).read_text()
    assert (
        '<p class="description">Swing &lt;up&gt; &amp; hold, `x &lt; 5`, see &lt;https://example.org/a&gt;</p>' in page
    )
    assert "<th>prompt</th>" in page
    assert "<td>swing &quot;up&quot; | &lt;fast&gt;</td>" in page
    assert page.count("<td></td></tr>") >= 1, "a task without a prompt has an empty cell"


def test_the_report_asset_thumbnails_show_how_episodes_ended_failures_first(camera_eval: CameraEval) -> None:
    written = steps.report_step(camera_eval.spec, camera_eval.outputs)
    assert written.thumbnails_png is not None
    strip = np.asarray(Image.open(io.BytesIO(written.thumbnails_png)).convert("RGB"))
    failed = [r for r in camera_eval.rows if r.status is not EpisodeStatus.SUCCEEDED]
    succeeded = [r for r in camera_eval.rows if r.status is EpisodeStatus.SUCCEEDED]
    assert failed
    assert succeeded
    tile = 96  # the camera is square: 96 px tiles, 2 px apart
    assert strip.shape[0] == 2 * tile, "a row of failures, a row of successes"
    assert strip.shape[1] == max(len(failed), len(succeeded)) * (tile + 2) - 2
    files = camera_eval.outputs.base.rglob(f"traces/**/*{traces.TRACE_SUFFIX}")
    videos = {t.trace_id: t.videos[0] for t in map(trace_reader.read_trace, files)}
    for row_index, group in enumerate((failed, succeeded)):
        for column, row in enumerate(group):
            frame = last_frame(videos[row.trace_id or ""])
            assert frame is not None
            shown = strip[row_index * tile : (row_index + 1) * tile, column * (tile + 2) : column * (tile + 2) + tile]
            assert np.abs(shown.astype(int) - frame.astype(int)).mean() < 8, "the tile is that episode's last frame"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def test_the_report_works_from_a_plain_static_file_server(camera_eval: CameraEval, browser: Any) -> None:
    with serving(camera_eval.outputs.root, _QuietHandler) as base:
        page = Page(browser, f"{base}/{camera_eval.outputs.pipeline}/report.html")
        page.tab.wait_for_function(
            "[...document.querySelectorAll('video')].every(v => v.readyState >= 1 && v.duration > 0)",
            timeout=DEADLINE_MS,
        )
        assert page.tab.locator("svg path.line").count() == sum(len(n) for n in camera_eval.names.values())
        assert page.errors == []
        page.close()


class _QuietReportHandler(ReportRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_served_reports_videos_can_be_seeked(camera_eval: CameraEval, browser: Any) -> None:
    """``report --serve`` answered every request with the whole file: the browser could play a video but not seek
    it (its time stayed at 0), so neither scrubbing an episode nor the cursor that follows playback worked."""
    with serving(camera_eval.outputs.root, _QuietReportHandler) as base:
        page = Page(browser, f"{base}/{camera_eval.outputs.pipeline}/report.html")
        video = page.tab.locator("video").first
        video.evaluate("v => v.readyState >= 1 || new Promise(done => v.addEventListener('loadedmetadata', done))")
        target = video.evaluate("v => { const at = v.duration / 2; v.currentTime = at; return at; }")
        page.tab.wait_for_function(
            "at => { const v = document.querySelector('video'); "
            "return !v.seeking && Math.abs(v.currentTime - at) < 0.05 }",
            arg=target,
            timeout=DEADLINE_MS,
        )
        assert target > 0
        assert page.errors == []
        page.close()


# -- errored and interrupted episodes --------------------------------------------------------------------


class Interrupt(BaseException):
    """A cancellation arriving after the first instance ended (as Ctrl-C or a Dagster termination would)."""


class _Cards(HTMLParser):
    """The episode cards of a page: each card's attributes and the text of its badges."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: list[dict[str, str]] = []
        self._badge: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "article" and "episode" in found.get("class", ""):
            self.cards.append({**found, "badges": ""})
        elif tag == "span" and self.cards and found.get("class", "").split()[0] in {"badge", "fault"}:
            self._badge = found["class"].split()[0]

    def handle_data(self, data: str) -> None:
        if self._badge is not None:
            self.cards[-1]["badges"] += f"{self._badge}:{data} "
            self._badge = None
        elif self.cards:
            self.cards[-1]["text"] = self.cards[-1].get("text", "") + data


@pytest.fixture(scope="module")
def faulty_eval(tmp_path_factory: pytest.TempPathFactory) -> tuple[EvalOutputs, list[GradeRow], str]:
    """Three instances of 2 slots: one slot's step raises in the first, then the run is cut short."""
    tmp_path = tmp_path_factory.mktemp("faulty")
    spec = _spec(
        tmp_path,
        {
            "name": "cut",
            "sim": {"factory": f"{SIMS}:faulty", "num_envs": 2, "args": {"fault": "raise_step", "fault_seed": 1}},
            "agent": {"policy": {"kind": "constant"}},
            "group": 3,
            "max_concurrent": 1,
            "max_steps": 20,
            "graders": [{"kind": "return", "threshold": 5}],
        },
    )
    seen: dict[str, Any] = {}
    original = steps.rollouts_step

    def cut_after_the_first(spec: Any, pool: Any, outputs: EvalOutputs, **kwargs: Any) -> Any:
        def interrupt(_: Any) -> None:
            raise Interrupt

        seen.update(spec=spec, outputs=outputs, run_id=kwargs["run_id"])
        return original(spec, pool, outputs, **kwargs, on_result=interrupt)

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        patch.setattr(steps, "rollouts_step", cut_after_the_first)
        with pytest.raises(Interrupt):
            steps.evaluate(spec, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    outputs: EvalOutputs = seen["outputs"]
    steps.grades_step(seen["spec"], outputs)
    steps.report_step(seen["spec"], outputs, run_id=seen["run_id"])  # the report asset runs after a failed run
    return outputs, _grades(outputs), seen["run_id"]


def test_errored_and_interrupted_episodes_are_marked_with_their_fault_and_reason(
    faulty_eval: tuple[EvalOutputs, list[GradeRow], str],
) -> None:
    outputs, rows, run_id = faulty_eval
    faults = {r.fault.value for r in rows if r.fault is not None}
    assert faults == {"env", "interrupted"}, [(r.seed, r.fault, r.error) for r in rows]
    assert any(r.status is EpisodeStatus.SUCCEEDED for r in rows)
    parser = _Cards()
    parser.feed(html_path(outputs).read_text())
    assert len(parser.cards) == len(rows)
    for row, card in zip(rows, parser.cards, strict=True):
        assert card["data-status"] == row.status.value
        assert f"badge:{row.status.value}" in card["badges"]
        if row.fault is not None:
            assert f"fault:{row.fault.value}" in card["badges"], card
            headline = (row.error or "").strip().splitlines()[0]
            assert headline in card["text"], (headline, card["text"])
        else:
            assert "fault:" not in card["badges"]
    cards = zip(parser.cards, rows, strict=True)
    interrupted = [(c, r) for c, r in cards if r.fault is not None and r.fault.value == "interrupted"]
    assert interrupted, "the cut instances are in the page"
    never_started = [c for c, r in interrupted if r.trace_id is None]
    assert all("no trace" in c["text"] for c in never_started), "an instance that never started has no trace to link"
    cut_short = [c for c, r in interrupted if r.trace_id is not None]  # under load the next one may have begun
    assert not any("no trace" in c["text"] for c in cut_short), "one cut mid-way links the traces it began"
    assert f"<code>{run_id}</code> (this run)" in html_path(outputs).read_text()


def test_a_report_with_errored_episodes_renders_and_filters_to_them(
    faulty_eval: tuple[EvalOutputs, list[GradeRow], str], browser: Any
) -> None:
    outputs, rows, _ = faulty_eval
    page = Page(browser, html_path(outputs).as_uri())
    for status in ("succeeded", "failed"):
        page.tab.locator(f'input[name="status"][value="{status}"]').uncheck()
    errored = [f"episode-{i}" for i, r in enumerate(rows) if r.status is EpisodeStatus.ERRORED]
    assert page.visible() == errored
    assert page.tab.locator("article.episode:not([hidden]) .fault").count() == len(errored)
    assert page.errors == []
    page.close()


# -- the report asset and report.md ----------------------------------------------------------------------


def test_the_report_asset_links_to_the_page_and_shows_the_key_figures(tmp_path: Path) -> None:
    from hud_pipelines.dagster.definitions import definitions_for_file

    # 5 steps never reach the threshold: 0 of 6, where the interval's low end used to print as 2.8e-17
    path = tmp_path / "nought.yaml"
    path.write_text(pipeline_text("nought", sim_label(tmp_path), group=3, max_steps=5))
    defs = definitions_for_file(path, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nought").execute_in_process(instance=instance, raise_on_error=False)
        assert result.success
        metadata = {
            name: instance.get_latest_materialization_event(
                dg.AssetKey(["nought", name])
            ).asset_materialization.metadata  # type: ignore[union-attr]
            for name in ("grades", "report")
        }
    outputs = EvalOutputs(tmp_path / "outputs", "nought")
    report = metadata["report"]
    assert report["report_html"] == dg.MetadataValue.path(str(html_path(outputs)))
    assert html_path(outputs).is_file()
    assert report["report_url"] == dg.MetadataValue.url(html_path(outputs).as_uri())
    assert "![per-slot outcomes](data:image/png;base64," in str(report["report"].value), "the UI has no folder"
    summary = summarize(_grades(outputs))
    assert (summary.scheduled, summary.succeeded, summary.failed) == (6, 0, 6)
    assert report["scheduled"].value == 6
    assert report["failed"].value == 6
    assert report["success_rate"].value == 0.0
    assert report["success"].value.startswith("0.0% (95% CI 0.0%-")
    assert summary.success_interval[0] != 0.0, "the arithmetic leaves a residue, which the figures must not show"
    assert metadata["grades"]["success_rate_ci95_low"].value == 0.0


def _row(seed: int, status: EpisodeStatus, error: str | None = None) -> GradeRow:
    return GradeRow("p", "t", 0, seed // 2, f"t-i{seed // 2}", seed % 2, seed, status, 0.0, False, 1.0, 3, error=error)


def test_a_rate_over_the_few_episodes_that_did_not_error_does_not_read_as_the_result() -> None:
    """A policy server lost mid-run: 1 graded, 11 errored, and the page's largest figure read "100.0%"."""
    from hud_pipelines.eval.report_html.summary import summary_section

    errored = [_row(seed, EpisodeStatus.ERRORED, "went away") for seed in range(1, 12)]
    few = summary_section(summarize([_row(0, EpisodeStatus.SUCCEEDED), *errored]))
    assert '<span class="rate few">100.0%</span>' in few
    assert '<span class="errored-share">11 of 12 errored</span>' in few
    most = summary_section(summarize([*(_row(s, EpisodeStatus.SUCCEEDED) for s in range(10)), *errored[:2]]))
    assert '<span class="rate">100.0%</span>' in most
    assert "2 of 12 errored" in most
    clean = summary_section(summarize([_row(s, EpisodeStatus.SUCCEEDED) for s in range(4)]))
    assert "errored-share" not in clean


def test_an_interval_at_zero_or_one_reads_zero_or_one() -> None:
    nought = summarize([_row(seed, EpisodeStatus.FAILED) for seed in range(6)])
    everything = summarize([_row(seed, EpisodeStatus.SUCCEEDED) for seed in range(10)])
    assert nought.success_interval[0] != 0.0, "residue to round off"
    assert everything.success_interval[1] != 1.0, "residue to round off"
    assert success_interval(nought)[0] == 0.0
    assert success_interval(everything)[1] == 1.0


def test_report_md_lists_each_errored_episode_on_one_line() -> None:
    traceback = (
        "step failed on purpose\n--- sim traceback ---\nTraceback (most recent call last):\n  File x\nValueError"
    )
    rows = [
        _row(0, EpisodeStatus.ERRORED, traceback),
        _row(1, EpisodeStatus.ERRORED, "plain reason <script>alert(2)</script> & more"),
        _row(2, EpisodeStatus.FAILED),
    ]
    markdown = render_markdown("p", rows)
    listed = markdown.split("## Errored episodes\n\n", 1)[1].strip().splitlines()
    assert len(listed) == 2, listed
    assert all(line.startswith("- ") for line in listed)
    assert listed[1].startswith("- t seed 1 (instance 0 slot 1): "), "named by its seed, which no split of slots moves"
    assert "step failed on purpose" in listed[0]
    assert "plain reason &lt;script>alert(2)&lt;/script> & more" in listed[1], "an env's text is data, never markup"
    assert "<script>" not in markdown


def test_report_md_shows_html_in_its_title_warnings_and_check_details_as_text() -> None:
    """An env's error reaches the warnings and the checks' details as well as the list of errored episodes."""
    reason = "RuntimeError: <img src=x onerror=alert(9)> | pipe"
    rows = [_row(0, EpisodeStatus.ERRORED, reason), _row(1, EpisodeStatus.SUCCEEDED)]
    context = ReportContext(
        warnings=[f"1 of 2 episode(s) errored (the first: {reason})"],
        checks=[dataclasses.replace(verdicts([], rows)[0], description=f"it failed: {reason}")],
    )
    markdown = render_markdown("p <i>x</i>", rows, context=context)
    assert "<img" not in markdown, markdown
    assert "<i>" not in markdown, markdown
    assert markdown.startswith("# p &lt;i>x&lt;/i>\n")
    assert (
        "**Warning:** 1 of 2 episode(s) errored (the first: RuntimeError: &lt;img src=x onerror=alert(9)> | pipe)."
        in (markdown)
    )
    assert "| it failed: RuntimeError: &lt;img src=x onerror=alert(9)> \\| pipe |" in markdown, "one cell, as text"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("`x < 5` and <b>", "`x < 5` and &lt;b>"),  # a code span shows its text as is
        ("``a ` <b> ``", "``a ` <b> ``"),  # a shorter run of backticks inside a longer span
        ("``<img src=x>`", "``&lt;img src=x>`"),  # runs of other lengths open no span
        ("\\`<img src=x>\\`", "\\`&lt;img src=x>\\`"),  # an escaped backtick opens none either
        ("see <https://example.org/a>", "see <https://example.org/a>"),  # an autolink
        ("bad key \\`` in `<img src=x>`", "bad key \\`` in `&lt;img src=x>`"),  # the run's second backtick opens
        ("`x\n`<img src=x>`", "`x\n`&lt;img src=x>`"),  # CommonMark pairs the first two, across the line
        ("`a\n<script>x</script>\n`", "`a\n&lt;script>x&lt;/script>\n`"),  # an HTML block ends the paragraph
    ],
)
def test_text_shown_in_markdown_escapes_every_tag_outside_a_code_span_as_commonmark_reads_one(
    text: str, shown: str
) -> None:
    assert no_html(text) == shown


def test_report_md_keeps_one_table_row_per_check_when_a_reason_spans_lines() -> None:
    hung = "the sim did not answer step within 5 s\nstderr tail:\n  | serving ws://x | 4 slot(s)\n  | Thread 0x7f"
    rows = [
        dataclasses.replace(_row(0, EpisodeStatus.ERRORED, hung), fault=Fault.SIM_HUNG),
        _row(2, EpisodeStatus.FAILED),
    ]
    checks = verdicts([], rows)
    markdown = render_markdown("p", rows, context=ReportContext(checks=checks))
    table = markdown.split("## Checks\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(table) == 2 + len(checks), table  # header, rule, a row per check
    assert all(line.startswith("|") and line.endswith("|") for line in table)
    instances = next(line for line in table if line.startswith("| instances_completed |"))
    cells = [cell for cell in re.split(r"(?<!\\)\|", instances)[1:-1]]
    assert len(cells) == 4, cells  # a pipe inside the reason is escaped, not a column
    assert "the sim did not answer step within 5 s (full reason in grades.json)" in instances
    assert "re-run them with: hud-pipelines run p --partition t-i0" in instances


def test_the_plot_title_fits_inside_the_figure() -> None:
    import matplotlib.pyplot as plt

    rows = [_row(seed, EpisodeStatus.FAILED) for seed in range(2)]
    figure = plot_figure("a_pipeline_with_a_rather_long_descriptive_name", rows)
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    title = figure.axes[0].title.get_window_extent(renderer)
    assert title.x0 >= 0, (title, figure.bbox)
    assert title.x1 <= figure.bbox.x1, (title, figure.bbox)
    assert title.y1 <= figure.bbox.y1
    plt.close(figure)


# -- the page's parts on literal data --------------------------------------------------------------------


def test_the_page_names_every_run_and_override_and_escapes_what_runs_wrote(tmp_path: Path) -> None:
    from hud_pipelines.eval.report_html import write_html_report

    hostile = "<script>alert(1)</script>"
    rows = [
        _row(0, EpisodeStatus.SUCCEEDED),
        _row(1, EpisodeStatus.ERRORED, f"reset failed: {hostile}"),
        _row(2, EpisodeStatus.FAILED),
    ]
    rows = [
        GradeRow.from_dict({**row.as_dict(), "run_id": run})
        for row, run in zip(rows, ["run-new", "run-new", "run-old"], strict=True)
    ]
    outputs = EvalOutputs(tmp_path, "literal")
    context = ReportContext(run_id="run-new", overrides={"max_steps": 7, "agent.policy.seed": hostile})
    page = write_html_report("literal", rows, outputs, context).path
    text = page.read_text()
    assert "<code>run-new</code> (this run): 2 of 3 rows" in text
    assert "<code>run-old</code>: 1 of 3 rows" in text
    assert "<code>max_steps</code> = <code>7</code>" in text
    assert hostile not in text, "text from a run is escaped"
    assert "reset failed: &lt;script&gt;" in text
    assert (page.parent / "report_files" / "report.js").is_file()
    assert (page.parent / "report_files" / "report.css").is_file()


def test_long_episodes_are_sampled_down_and_non_finite_values_become_gaps(tmp_path: Path) -> None:
    from hud_pipelines.eval.report_html.episodes import MAX_POINTS, sampled_series

    steps_count = 1000
    lines: list[dict[str, Any]] = [
        {"type": "trace", "trace_id": "t", "action_names": ["torque"], "state_names": {"state": ["angle"]}}
    ]
    for step in range(steps_count):
        angle = float("nan") if step == 0 else step / 10
        lines += [
            {"type": "observation", "step": step, "state": {"state": {"angle": angle}}},
            {"type": "action", "step": step, "action": {"torque": 1.0}},
            {"type": "reward", "step": step, "reward": -1.0, "terminated": False, "truncated": False},
        ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    steps_kept, series = sampled_series(trace_reader.read_trace(path))
    assert len(steps_kept) <= MAX_POINTS
    assert (steps_kept[0], steps_kept[-1]) == (0, steps_count - 1), "the first and last steps stay"
    assert [(s.group, s.name) for s in series] == [("state", "angle"), ("action", "torque"), ("reward", "reward")]
    angle = series[0].values
    assert angle[0] is None, "NaN in the trace is a gap, not invalid JSON"
    assert angle[-1] == (steps_count - 1) / 10

    path.write_text(json.dumps(lines[0]))  # errored at reset: a header and no step
    assert sampled_series(trace_reader.read_trace(path)) == ([], []), "no empty plot per dimension on its card"


def test_a_plots_axis_labels_are_the_values_at_its_top_and_bottom(browser: Any, tmp_path: Path) -> None:
    """Each plot's two labels read as numbers place every drawn point where it is: before, a constant 101 drawn
    halfway between 100.5 and 101.5 showed the labels 102 and 101 (three significant digits), so it read as 101.5."""
    from importlib import resources

    series = {
        "constant": [101.0, 101.0, 101.0],
        "narrow": [1000.2, 1000.9, 1000.5],
        "around zero": [-0.5, 0.25, 0.75],
        "large": [12345.0, 12346.0, 12350.0],
        "large and narrow": [12345.1, 12345.9, 12345.5],
        "small": [0.00123, 0.00124, 0.00121],
        "negative": [-101.4, -99.6, -100.0],
        "float noise": [0.1 + 0.2, 0.3, 0.3],
        "huge constant": [2.5e6, 2.5e6, 2.5e6],
    }
    data = {
        "0": {
            "steps": [0, 1, 2],
            "rate": 10,
            "series": [{"group": "reward", "feature": "", "name": n, "values": v} for n, v in series.items()],
        }
    }
    script = resources.files("hud_pipelines.eval.report_html").joinpath("static", "report.js").read_text()
    (tmp_path / "report.js").write_text(script)
    page = tmp_path / "plots.html"
    page.write_text(
        f'<script id="episode-data" type="application/json">{json.dumps(data)}</script>'
        '<article class="episode" data-index="0"><div class="plots"></div></article><script src="report.js"></script>'
    )
    tab = Page(browser, page.as_uri())
    drawn = tab.tab.eval_on_selector_all(
        "figure.plot",
        """fs => fs.map(f => ({
            name: f.querySelector('figcaption').textContent,
            ticks: [...f.querySelectorAll('text.tick')].slice(0, 2).map(t => t.textContent),
            top: Number(f.querySelector('rect.frame').getAttribute('y')),
            height: Number(f.querySelector('rect.frame').getAttribute('height')),
            ys: f.querySelector('path.line').getAttribute('d').split(/[ML]/).filter(Boolean)
                .map(p => Number(p.trim().split(' ')[1])),
        }))""",
    )
    assert tab.errors == []
    assert [plot["name"] for plot in drawn] == list(series)
    for plot in drawn:
        high, low = (float(tick) for tick in plot["ticks"])
        assert high > low, plot
        for value, y in zip(series[plot["name"]], plot["ys"], strict=True):  # within a pixel of where it reads
            assert y == pytest.approx(plot["top"] + (high - value) / (high - low) * plot["height"], abs=1.0), plot
        values = series[plot["name"]]
        if max(values) - min(values) > 1e-9 * max(values):  # a line that varies spans the plot's height
            assert max(plot["ys"]) - min(plot["ys"]) == pytest.approx(plot["height"], abs=0.2), plot
    tab.close()
