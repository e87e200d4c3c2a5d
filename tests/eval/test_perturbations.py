"""Matrix tasks: each value against the unperturbed task on the same seeds, in a per-axis table."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import scipy.stats

from hud_pipelines.eval.steps import evaluate
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import PipelineSpec
from tests.dagster.support import REPO


def _spec(tmp_path: Path, **fields: Any) -> PipelineSpec:
    spec: dict[str, Any] = {
        "name": "reach_matrix",
        "sim": {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 4},
        "agent": {"policy": {"kind": "constant", "value": [0.0, 0.0]}},
        "tasks": [{"name": "reach", "seed": 7, "matrix": {"reach": [0.05, 1.5]}}],
        "group": 4,
        "max_steps": 3,
        **fields,
    }
    return load_pipeline_text(json.dumps(spec), source=tmp_path / "reach_matrix.yaml")


def test_a_matrix_adds_one_task_per_value_with_the_controls_seeds(tmp_path: Path) -> None:
    spec = _spec(tmp_path, tasks=[{"name": "reach", "seed": 7, "args": {"x": 1}, "matrix": {"reach": [0.05, 1.5]}}])
    assert [t.name for t in spec.tasks] == ["reach", "reach-reach-0.05", "reach-reach-1.5"]
    control, small, large = spec.tasks
    assert small.args == {"x": 1, "reach": 0.05}
    assert large.variant_of is not None
    assert (large.variant_of.control, large.variant_of.axis, large.variant_of.value) == ("reach", "reach", 1.5)
    assert spec.seeds_for(1, 2) == spec.seeds_for(0, 2), "every value meets the control's seeds"
    again = spec.with_sections(group=2)  # re-validated: the matrix is not expanded twice
    assert [t.name for t in again.tasks] == [t.name for t in spec.tasks]
    assert control.variant_of is None
    capital = _spec(tmp_path, tasks=[{"name": "reach", "seed": 7, "matrix": {"maxReach": [2]}}])
    assert [t.name for t in capital.tasks] == ["reach", "reach-maxreach-2"], "an axis spelled in capitals names a task"
    assert capital.tasks[1].args == {"maxReach": 2}


def test_the_per_axis_table_pairs_each_value_with_the_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    evaluation = evaluate(_spec(tmp_path), outputs_dir=tmp_path / "out")
    base = tmp_path / "out" / "reach_matrix"
    table = list(csv.DictReader((base / "perturbations.csv").read_text().splitlines()))
    assert [(r["task"], r["axis"], r["value"]) for r in table] == [
        ("reach", "", "control"),
        ("reach-reach-0.05", "reach", "0.05"),
        ("reach-reach-1.5", "reach", "1.5"),
    ]
    by_task = {task: [r for r in evaluation.rows if r.task == task] for task in ("reach", "reach-reach-1.5")}
    control = {(r.instance, r.slot, r.seed): r.success for r in by_task["reach"]}
    large = {(r.instance, r.slot, r.seed): r.success for r in by_task["reach-reach-1.5"]}
    assert control.keys() == large.keys()
    only_large = sum(large[k] and not control[k] for k in control)
    only_control = sum(control[k] and not large[k] for k in control)
    expected_p = scipy.stats.binomtest(only_large, only_large + only_control, 0.5).pvalue
    row = table[2]
    assert int(row["pairs"]) == 16
    assert float(row["p"]) == pytest.approx(expected_p)
    assert row["vs_control"] == "better", "a reach of 1.5 from the origin succeeds where 0.6 mostly does not"
    assert float(table[1]["diff"]) <= 0
    on_pairs = sum(control.values()) / len(control)
    assert float(row["control_on_pairs"]) == pytest.approx(on_pairs), "the control's rate on the twins"
    assert float(row["diff"]) == pytest.approx(sum(large.values()) / len(large) - on_pairs)
    assert table[0]["control_on_pairs"] == "", "the control's own row pairs with nothing"
    assert "## Perturbations" in (base / "report.md").read_text()
    page = (base / "report.html").read_text()
    section = page[page.index('<section id="perturbations">') :].split("</section>", 1)[0]
    html_rows = re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[1])
    assert [re.findall(r"<td>(.*?)</td>", r)[:3] for r in html_rows] == [
        ["reach", "-", "control"],
        ["reach", "reach", "0.05"],
        ["reach", "reach", "1.5"],
    ], "the page has the table of report.md, each value against its control"
    versus = f"better +{float(row['diff']):.1%} vs control {on_pairs:.1%} on 16 pairs (p={float(row['p']):.3g})"
    assert versus in html_rows[2]


def test_checks_and_the_headline_judge_the_control_tasks_never_the_pooled_arms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main
    from hud_pipelines.eval.grades import summarize

    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, checks=[{"kind": "min_success_rate", "value": 0.0}])
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    control = [row for row in evaluation.rows if row.task == "reach"]
    assert summarize(control).success_rate != summarize(evaluation.rows).success_rate, "the arms differ: pooling shows"
    [check] = [c for c in evaluation.checks if c.name == "min_success_rate"]
    assert check.observed == summarize(control).success_rate
    assert check.description.startswith("control tasks: ")
    assert evaluation.summary == summarize(control), "evaluate()'s headline is the control's"
    assert "reach_matrix (control tasks;" in (tmp_path / "out" / "reach_matrix" / "report.md").read_text()
    folder = str(tmp_path / "out" / "reach_matrix")
    capsys.readouterr()
    assert main(["compare", folder, folder, "--json"]) == 0  # compare's sides are what no_regression judges
    compared = json.loads(capsys.readouterr().out)
    assert compared["pairs"] == len(control)
    assert compared["candidate"] == f"{folder} (control tasks; 2 perturbed task(s) left out)"
    page = (tmp_path / "out" / "reach_matrix" / "report.html").read_text()
    headline = page[page.index('<section id="summary">') :].split("</section>", 1)[0]
    assert f"{check.observed:.1%}" in headline, "the page's headline is report.md's: the control tasks"
    assert f"{summarize(control).succeeded} succeeded of {summarize(control).graded} graded" in headline
    assert "Control tasks only" in headline
    tasks = page[page.index('<section id="tasks">') :].split("</section>", 1)[0]
    assert tasks.count("<tr><td>") == 1, "the task table lists the control task, as report.md does"
    assert "<td>reach</td>" in tasks

    home = tmp_path / "home"  # the Dagster asset check judges the same rows
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    path = tmp_path / "reach_matrix.yaml"
    fields = {"name": "reach_matrix", "sim": {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 4}}
    fields |= {"agent": {"policy": {"kind": "constant", "value": [0.0, 0.0]}}, "group": 4, "max_steps": 3}
    fields |= {"tasks": [{"name": "reach", "seed": 7, "matrix": {"reach": [0.05, 1.5]}}]}
    path.write_text(json.dumps({**fields, "checks": [{"kind": "min_success_rate", "value": 0.0}]}))
    assert main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "cli")]) == 0
    checks = json.loads((tmp_path / "cli" / "reach_matrix" / "checks.json").read_text())
    assert [c["observed"] for c in checks if c["name"] == "min_success_rate"] == [check.observed]
    assert f"this run, control tasks: success rate {check.observed:.1%}" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:  # the UI's grades figures: the same headline
        event = instance.get_latest_materialization_event(dg.AssetKey(["reach_matrix", "grades"]))
    assert event is not None
    assert event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["success_rate"].value == check.observed
    assert metadata["scheduled"].value == len(control)
    assert str(metadata["counted"].value).startswith("control tasks")

    partition = ["--partition", "reach-i0"]  # a partial run: its line over every row is the control tasks' too
    assert main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "cli"), *partition]) == 0
    out = capsys.readouterr().out
    assert f"from other runs, control tasks: success rate {check.observed:.1%}" in out, out
    arm = ["--partition", "reach-reach-1.5-i0"]  # a matrix value alone: no control task ran, none to figure
    assert main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "cli"), *arm]) == 0
    out = capsys.readouterr().out
    assert "this run ran no control task" in out, out
    assert "scheduled 0" not in out

    fresh = ["--outputs", str(tmp_path / "fresh")]  # a partial first run: the others are not run, not earlier runs'
    assert main(["run", str(path), "--quiet", *fresh, *partition]) == 0
    rows = json.loads((tmp_path / "fresh" / "reach_matrix" / "grades.json").read_text())
    never = sum(1 for row in rows if row["fault"] == "not_run")
    assert 0 < never < len(rows)
    assert f"all {len(rows)} rows, with 0 from other runs and {never} not run yet" in capsys.readouterr().out
    report = (tmp_path / "fresh" / "reach_matrix" / "report.md").read_text()
    assert f"produced {len(rows) - never} of the {len(rows)} rows; {never} row(s) not run yet." in report, (
        "which runs produced the rows is said of every task's, the perturbed ones too (as the page says it)"
    )
    assert "earlier runs" not in report
    page = (tmp_path / "fresh" / "reach_matrix" / "report.html").read_text()
    assert f"<li>{never} of {len(rows)} rows not run yet</li>" in page, "the page says what report.md says"

    path.write_text(json.dumps({**fields, "max_steps": 4}))  # an edit: the earlier full run's rows are stale now
    assert main(["run", str(path), "--quiet", "--outputs", str(tmp_path / "cli"), *partition]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "cli" / "reach_matrix" / "grades.json").read_text())
    stale = sum(1 for row in rows if row["fault"] == "not_run")
    assert stale == len(rows) - 4, "every instance but the one this run ran again (its 4 slots)"
    assert f"all {len(rows)} rows, with 0 from other runs and {stale} stale (run before the configuration" in out
    report = (tmp_path / "cli" / "reach_matrix" / "report.md").read_text()
    assert "row(s) stale (run before the configuration changed)." in report
    assert "earlier runs produced" not in report, "a stale row is not an earlier run's result"


def test_a_matrix_value_in_report_md_is_one_cell_of_text() -> None:
    """A value is the user's text: ``p|q`` split its row into one more column and ``<b>`` was markup."""
    from hud_pipelines.eval.perturbations import AxisRow, markdown

    figures = {"episodes": 2, "succeeded": 1, "failed": 1, "errored": 0, "success_rate": 0.5}
    rows = [
        AxisRow(**figures, ci_low=0.1, ci_high=0.9, control="r", task=f"r-{n}", axis="mode", value=value)
        for n, value in enumerate(("p|q", "<b>bold</b>"))
    ]
    lines = markdown(rows).splitlines()[2:]
    assert [line.replace("\\|", "").count("|") for line in lines] == [7, 7], lines
    assert "| p\\|q |" in lines[0]
    assert "| &lt;b>bold&lt;/b> |" in lines[1]


def test_a_matrix_values_errors_are_counted_and_listed_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, tasks=[{"name": "reach", "seed": 7, "matrix": {"reach": [1.5, "far"]}}], group=1)
    evaluate(spec, outputs_dir=tmp_path / "out")  # a reach of "far" cannot be compared with: its env raises
    report = (tmp_path / "out" / "reach_matrix" / "report.md").read_text()
    section = report[report.index("## Perturbations") :]
    assert "| task | axis | value | success (95% CI, n) | errored | vs control |" in section
    assert "| reach | reach | far | n/a | 4/4 |" in section, "every episode of the value errored, and says so"
    assert "| reach | reach | 1.5 | " in section
    errored = section[section.index("## Errored episodes of the perturbations") :].split("\n## ", 1)[0]
    said = "- reach-reach-far seed {0} (instance 0 slot {1}) (env): TypeError: '&lt;' not supported between "
    assert all(said.format(7 + slot, slot) in errored for slot in range(4)), "each episode's own error, its seed"
    assert "reach-reach-1.5" not in errored
