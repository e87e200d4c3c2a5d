"""Sweeps: every checkpoint of a real lerobot-train run, evaluated on the same episodes, resumably."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.errors import CheckpointError
from hud_pipelines.eval.comparison import compare
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.result_sets import read_result_set
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import display_path
from tests.agent.checkpoint_runs import (
    LeRobotRun,
    age,
    copy_run,
    lerobot_run_fixture,  # noqa: F401 - the session's run, shared with the checkpoint tests
    write_lerobot_run,
)
from tests.dagster.support import REPO
from tests.eval.sweep_sims import sweep_pipeline

pytestmark = pytest.mark.slow


def sweep_spec(tmp_path: Path, checkpoints: Any, **fields: Any) -> PipelineSpec:
    spec = sweep_pipeline(checkpoints, **fields)
    return load_pipeline_text(json.dumps(spec), source=tmp_path / "reach_sweep.yaml")


@pytest.fixture(name="run")
def run_fixture(lerobot_run: LeRobotRun, tmp_path: Path) -> LeRobotRun:
    """A private, settled copy of the session's three-checkpoint run."""
    run = copy_run(lerobot_run, tmp_path / "train")
    age(run.output_dir, 60)
    return run


def _episode(row: Any) -> tuple[str, int, int, int | None]:
    return (row.task, row.instance, row.slot, row.seed)


def test_a_sweep_evaluates_every_checkpoint_on_the_same_episodes(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    evaluation = evaluate(sweep_spec(tmp_path, str(run.output_dir)), outputs_dir=tmp_path / "out")
    labels = ["000500", "001000", "001500"]
    assert [row.checkpoint for row in evaluation.rows] == [label for label in labels for _ in range(8)]
    by_label = {label: [row for row in evaluation.rows if row.checkpoint == label] for label in labels}
    episodes = {label: [_episode(row) for row in rows] for label, rows in by_label.items()}
    assert episodes["000500"] == episodes["001000"] == episodes["001500"], "paired episodes"
    ids = [row.trace_id for row in evaluation.rows]
    assert len(set(ids)) == len(ids), "one instance of two checkpoints in one run: two episodes, two trace ids"
    page = (tmp_path / "out" / "reach_sweep" / "report.html").read_text()
    linked = re.findall(r'<a href="checkpoints/(\w+)/traces/[^"]*?([0-9a-f]{32})\.jsonl">trace</a>', page)
    assert sorted(linked) == sorted((row.checkpoint, row.trace_id) for row in evaluation.rows), "each its own trace"
    assert len(set(episodes["000500"])) == 8
    returns = {label: tuple(round(row.total_reward, 6) for row in rows) for label, rows in by_label.items()}
    assert len(set(returns.values())) == 3, "different weights act differently on the same episodes"
    assert {row.status.value for row in evaluation.rows} <= {"succeeded", "failed"}
    assert evaluation.passed
    grades = list(csv.DictReader((tmp_path / "out" / "reach_sweep" / "grades.csv").read_text().splitlines()))
    assert [g["checkpoint"] for g in grades] == [row.checkpoint for row in evaluation.rows]
    member = tmp_path / "out" / "reach_sweep" / "checkpoints" / "001000"
    recorded = json.loads((member / "checkpoint.json").read_text())
    assert recorded["step"] == 1000
    assert Path(recorded["path"]) == run.pretrained(1000)
    assert (member / "report.md").is_file(), "each checkpoint gets its own report"
    own = [GradeRow.from_dict(r) for r in json.loads((member / "grades.json").read_text())]
    assert [(r.seed, r.status, r.total_reward) for r in own] == [
        (r.seed, r.status, r.total_reward) for r in by_label["001000"]
    ], "and its own grades"
    first = tmp_path / "out" / "reach_sweep" / "checkpoints" / "000500"
    assert compare(read_result_set(str(member)).rows, read_result_set(str(first)).rows).pairs == 8, "two compare"


def test_a_sweep_resumes_runs_only_new_checkpoints_and_reruns_changed_weights(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1)
    out = tmp_path / "out"
    first = evaluate(spec, outputs_dir=out, checkpoints=["000500", "001000"])
    assert {row.checkpoint for row in first.rows} == {"000500", "001000"}
    assert {row.run_id for row in first.rows} == {first.run_id}

    again = evaluate(spec, outputs_dir=out)  # only 001500 is missing
    ran = {row.checkpoint for row in again.rows if row.run_id == again.run_id}
    assert ran == {"001500"}
    kept = [row for row in again.rows if row.checkpoint != "001500"]
    assert kept == [row for row in first.rows], "earlier results are kept as they were"

    write_lerobot_run(tmp_path / "retrained" / run.output_dir.name, [1000])  # other weights under one label
    shutil.rmtree(run.step_dirs[1000])
    shutil.copytree(tmp_path / "retrained" / run.output_dir.name / "checkpoints" / "001000", run.step_dirs[1000])
    (tmp_path / "extra").mkdir()
    write_lerobot_run(tmp_path / "extra" / run.output_dir.name, [2000])
    shutil.copytree(tmp_path / "extra" / run.output_dir.name / "checkpoints" / "002000", run.checkpoints_dir / "002000")
    age(run.output_dir, 60)
    third = evaluate(spec, outputs_dir=out)
    ran = {row.checkpoint for row in third.rows if row.run_id == third.run_id}
    assert ran == {"001000", "002000"}, "a new checkpoint runs, and so does one whose files changed"

    moved = copy_run(run, tmp_path / "moved")  # the same bytes elsewhere: the same checkpoints
    fourth = evaluate(
        sweep_spec(tmp_path, str(moved.output_dir), tasks=[{"name": "near", "seed": 10}], group=1), outputs_dir=out
    )
    assert not [row for row in fourth.rows if row.run_id == fourth.run_id], "a moved run keeps its results"
    assert len(fourth.rows) == 4 * 2, "four checkpoints of one instance of two slots"

    near = [{"name": "near", "seed": 10}]
    shorter = sweep_spec(tmp_path, str(moved.output_dir), tasks=near, group=1, max_steps=4, dataset={"enabled": True})
    fifth = evaluate(shorter, outputs_dir=out, checkpoints=["002000"])  # the others are of the old max_steps now
    assert {row.checkpoint for row in fifth.rows if row.status.value != "errored"} == {"002000"}
    assert fifth.dataset is not None, "the current checkpoint is published; the stale ones are left out"
    assert fifth.dataset.path.name == "002000"
    stale = {row.checkpoint: row.error or "" for row in fifth.rows if row.status.value == "errored"}
    named = display_path(tmp_path / "reach_sweep.yaml")  # not in the pipelines directory: named by its path
    rerun = (
        f"run it with: hud-pipelines run {named} --outputs {display_path(out)} --checkpoint 000500 --partition near-i0"
    )
    assert rerun in stale["000500"]

    shutil.rmtree(moved.step_dirs[1500])  # where the YAML and its results say it is: a stale checkpoint, gone
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.rows import collect_rows

    gone = [row for row in collect_rows(shorter, EvalOutputs(out, "reach_sweep")) if row.checkpoint == "001500"]
    assert gone
    assert all("checkpoint 001500's files at" in (row.error or "") for row in gone)
    assert all("are gone: restore them to run it again" in (row.error or "") for row in gone)

    from hud_pipelines.eval import sweep_warnings

    table = collect_rows(shorter, EvalOutputs(out, "reach_sweep"))
    warned = sweep_warnings.gone_warning(shorter, EvalOutputs(out, "reach_sweep"), table) or ""
    assert warned.startswith("the files of checkpoint(s) 001500 are gone: their results are kept as evaluated (")
    without_last = [row for row in table if row.checkpoint != "002000"]  # 001500 the candidate
    said = sweep_warnings.gone_warning(shorter, EvalOutputs(out, "reach_sweep"), without_last) or ""
    assert "; the candidate 001500 is one of them" in said


def test_new_weights_under_an_evaluated_label_show_its_results_as_stale_until_it_runs_again(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the report judged a checkpoint by the hash it recorded: other weights copied under its label
    kept the old rates on show (and ``compare`` found a difference between two identical weight files)."""
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.rows import collect_rows

    monkeypatch.chdir(REPO)
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1)
    out = tmp_path / "out"
    first = evaluate(spec, outputs_dir=out, checkpoints=["000500", "001000"])
    shutil.copyfile(run.pretrained(500) / "model.safetensors", run.pretrained(1000) / "model.safetensors")
    age(run.output_dir, 60)

    rows = collect_rows(spec, EvalOutputs(out, "reach_sweep"))
    kept = [row for row in rows if row.checkpoint == "000500"]
    assert kept == [row for row in first.rows if row.checkpoint == "000500"], "untouched weights keep their results"
    stale = [row for row in rows if row.checkpoint == "001000"]
    assert stale
    assert {row.status.value for row in stale} == {"errored"}
    assert all("checkpoint 001000's files changed since it ran" in (row.error or "") for row in stale)
    from hud_pipelines.eval.steps import report_step

    warned = "checkpoint(s) with episodes no current run produced, counted errored in the table until a run evaluates"
    markdown = report_step(spec, EvalOutputs(out, "reach_sweep")).markdown  # the table read n/a (1 errored) alone
    assert f"{warned} them: 001000: 2 episode(s) stale (run before the configuration changed) (the first says: " in (
        " ".join(markdown.split())
    )

    again = evaluate(spec, outputs_dir=out, checkpoints=["000500", "001000"])
    ran = {row.checkpoint for row in again.rows if row.run_id == again.run_id}
    assert ran == {"001000"}, "the next run evaluates the changed weights again, and only them"
    same = {
        row.checkpoint: [(r.seed, r.total_reward) for r in again.rows if r.checkpoint == row.checkpoint]
        for row in again.rows
    }
    assert same["001000"] == same["000500"], "the same weights act the same on the same episodes"


def test_checkpoints_of_several_policy_types_are_named_in_a_warning_of_the_report(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a diffusion folder copied into an ACT run read as the run's next step, its type named nowhere."""
    from hud_pipelines.eval import sweep_warnings
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.steps import report_step

    monkeypatch.chdir(REPO)
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1)
    outputs = EvalOutputs(tmp_path / "out", "reach_sweep")
    evaluate(spec, outputs_dir=tmp_path / "out", checkpoints=["000500", "001000"])
    assert sweep_warnings.mixed_policy_types(spec, outputs) is None, "one type: nothing to say"
    config = run.pretrained(1000) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "type": "diffusion"}))
    said = "the checkpoints are of 2 policy types, compared as one training run: act (000500); diffusion (001000)"
    assert sweep_warnings.mixed_policy_types(spec, outputs) == said
    assert f"**Warning:** {said}." in report_step(spec, outputs).markdown


def test_a_half_written_checkpoint_waits_and_an_unknown_label_is_refused(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    (run.pretrained(1500) / "model.safetensors").unlink()
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1)
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.checkpoint for row in evaluation.rows} == {"000500", "001000"}
    with pytest.raises(CheckpointError, match=r"'001500'.*known: 000500, 001000"):
        evaluate(spec, outputs_dir=tmp_path / "out", checkpoints=["001500"])
    # a save that never finished, after the candidate: the report says the checks judge an older checkpoint
    said = (
        "checkpoint(s) after the candidate are not evaluated, so the checks judge 001000: 001500 (missing "
        "model.safetensors)"
    )
    assert said in evaluation.outputs.report_md.read_text()
    from hud_pipelines.eval.sweep_warnings import unevaluated_warning

    first = evaluate(spec, outputs_dir=tmp_path / "first", checkpoints=["000500"])  # 001000 is complete: not run
    warned = unevaluated_warning(spec, first.outputs, first.rows) or ""
    assert "so the checks judge 000500: 001000 (complete, not run yet); 001500 (missing model.safetensors)" in warned
    (run.pretrained(500) / "model.safetensors").unlink()  # before the candidate: the table shows its results
    warned = unevaluated_warning(spec, evaluation.outputs, evaluation.rows) or ""
    assert said in warned
    assert "000500" not in warned
    (run.pretrained(1000) / "model.safetensors").unlink()  # the candidate's own files since: placed by its results
    assert "000500" not in (unevaluated_warning(spec, evaluation.outputs, evaluation.rows) or "")
    shutil.rmtree(run.output_dir)  # a pruned run: nothing to list, and the report is still written (it raised)
    assert unevaluated_warning(spec, evaluation.outputs, evaluation.rows) is None


def test_validate_finds_a_missing_or_empty_checkpoints_directory_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    (tmp_path / "empty").mkdir()
    path = tmp_path / "reach_sweep.yaml"
    for target, expected in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "empty", "no checkpoint")):
        written = sweep_spec(tmp_path, str(target)).model_dump(mode="json", exclude_unset=True)
        path.write_text(json.dumps(written, indent=1))
        line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"checkpoints"' in text)
        capsys.readouterr()
        assert main(["validate", str(path)]) == 1
        out = capsys.readouterr().out
        assert f"reach_sweep.yaml:{line}:" in out
        assert "agent.policy.checkpoints" in out
        assert expected in out.lower()
        assert main(["run", str(path), "--quiet"]) == 2, "refused before anything starts, at the line, as validate"
        err = capsys.readouterr().err
        assert f"reach_sweep.yaml:{line}:" in err
        assert expected in err.lower()


def test_checkpoints_exclude_a_single_policy_and_labels_must_differ(tmp_path: Path) -> None:
    from hud_pipelines.errors import HudPipelinesError

    with pytest.raises(HudPipelinesError, match=r"give 'checkpoints' .* or 'path' / 'type'"):
        load_pipeline_text(
            json.dumps(
                {
                    "name": "both",
                    "sim": {"factory": "CartPole-v1"},
                    "agent": {"policy": {"kind": "lerobot", "path": "a", "checkpoints": "b"}},
                }
            ),
            source=tmp_path / "both.yaml",
        )
    twice = [{"label": "x", "path": str(tmp_path)}, {"label": "x", "path": str(tmp_path)}]
    spec = sweep_spec(tmp_path, twice)
    with pytest.raises(CheckpointError, match="'x'"):
        evaluate(spec, outputs_dir=tmp_path / "out")


def test_the_sweep_page_shows_every_checkpoint_linked_to_its_own_page(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any
) -> None:
    monkeypatch.chdir(REPO)
    gate = [{"kind": "no_regression", "baseline": "000500"}]
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1, checks=gate)
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    assert evaluation.summary.scheduled == 2, "evaluate()'s headline is the candidate's, as the report's"
    [judged] = [check for check in evaluation.checks if check.name == "no_regression"]
    assert "cannot be read" not in judged.description, judged.description
    for label in ("000500", "001500"):  # a checkpoint's own page: the sweep's gate is judged on the sweep's page
        own = (tmp_path / "out" / "reach_sweep" / "checkpoints" / label / "report.md").read_text()
        assert "no_regression" not in own
        assert "instances_completed" in own
        assert own.startswith(f"# reach_sweep: checkpoint {label}\n"), "a checkpoint's page says which it is"
        assert f"Checkpoint {label} (step {int(label)}) of the sweep reach_sweep: weights at " in own
    page = browser.new_page()
    try:
        page.goto((tmp_path / "out" / "reach_sweep" / "report.html").as_uri())
        rows = page.locator("#checkpoints tbody tr")
        assert rows.count() == 3
        assert [rows.nth(i).locator("td").first.inner_text() for i in range(3)] == ["000500", "001000", "001500"]
        assert "2 pairs)" in rows.nth(1).inner_text(), "a verdict says how many paired episodes it stands on"
        assert "(95% CI " in rows.nth(1).locator("td").nth(7).inner_text(), "and its difference's interval"
        plot_width = page.eval_on_selector("#checkpoints img", "img => img.complete ? img.naturalWidth : 0")
        assert plot_width > 0, "the success-by-step plot loads"
        markdown = (tmp_path / "out" / "reach_sweep" / "report.md").read_text()
        assert markdown.startswith("# reach_sweep (candidate checkpoint 001500)")
        assert "Scheduled 2 = " in markdown, "the headline counts the candidate's two episodes, not all six"
        cards = page.locator("article.episode")
        assert cards.count() == 6, "every checkpoint's episodes, each also on its checkpoint's page"
        page.select_option('select[name="checkpoint"]', "001000")
        shown = page.locator("article.episode:not([hidden])")
        assert shown.count() == 2
        assert shown.evaluate_all("cs => cs.map(c => c.dataset.checkpoint)") == ["001000", "001000"]
        assert page.locator("article.episode:not([hidden]) .trace a").count() == 2, "each links to its trace"
        page.select_option('select[name="checkpoint"]', "")
        seed = next(row.seed for row in evaluation.rows)
        page.fill('input[name="seed"]', str(seed))  # one episode followed across the checkpoints
        assert shown.evaluate_all("cs => cs.map(c => c.dataset.checkpoint)") == ["000500", "001000", "001500"]
        assert set(shown.evaluate_all("cs => cs.map(c => c.dataset.seed)")) == {str(seed)}
        page.fill('input[name="seed"]', "")
        outcomes: dict[tuple[str, int | None], set[str]] = {}
        for row in evaluation.rows:
            if row.status.value != "errored":
                outcomes.setdefault((row.task, row.seed), set()).add(row.status.value)
        parting = sum(len(seen) > 1 for seen in outcomes.values())
        page.check('input[name="differs"]')  # where the checkpoints part: succeeded under one, failed under another
        assert shown.count() == 3 * parting
        page.uncheck('input[name="differs"]')
        assert shown.count() == 6
        per_task = page.locator("#tasks tbody tr")  # never one rate pooled over several weights
        assert [per_task.nth(i).locator("td").nth(0).inner_text() for i in range(per_task.count())] == [
            "000500",
            "001000",
            "001500",
        ]
        rows.nth(1).locator("a").click()
        page.wait_for_load_state()
        assert page.url.endswith("/checkpoints/001000/report.html")
        assert page.locator("#episodes article.episode").count() == 2
        assert page.title() == "reach_sweep: checkpoint 001000: eval report"
    finally:
        page.close()


def test_a_sweep_gate_judges_the_latest_checkpoint_against_a_baseline_label(tmp_path: Path) -> None:
    from hud_pipelines.eval import sweep
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.recording.events import EpisodeStatus

    def rows(label: str, succeeded: bool) -> list[GradeRow]:
        status = EpisodeStatus.SUCCEEDED if succeeded else EpisodeStatus.FAILED
        return [
            GradeRow(
                "s",
                "near",
                0,
                i,
                f"{label}|near-i{i}",
                0,
                10 + i,
                status,
                float(succeeded),
                succeeded,
                0.0,
                5,
                checkpoint=label,
            )
            for i in range(20)
        ]

    gate = [{"kind": "no_regression", "baseline": "000500", "max_drop": 0.05}]
    spec = sweep_spec(tmp_path, str(tmp_path), checks=gate)
    table = rows("000500", True) + rows("001000", False)
    (check,) = spec.resolved_checks()
    verdict = sweep.verdict(spec, check, table)
    assert not verdict.passed
    assert verdict.description.startswith("001000: no_regression: worse than the baseline")
    assert "checkpoint 000500" in verdict.description
    better = sweep.verdict(spec, check, rows("000500", False) + rows("001000", True))
    assert better.passed
    mistyped = sweep_spec(tmp_path, str(tmp_path), checks=[{**gate[0], "baseline": "00500"}])
    (check,) = mistyped.resolved_checks()
    verdict = sweep.verdict(mistyped, check, table)
    assert not verdict.passed
    assert verdict.description.startswith(
        "no_regression: the baseline '00500' is no checkpoint of this sweep (did you mean '000500'?) "
        "(evaluated: 000500, 001000) and no grades file"
    ), verdict.description


def test_validate_finds_a_baseline_label_one_typo_from_a_checkpoints_and_leaves_others_to_the_run(
    run: LeRobotRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    path = tmp_path / "reach_sweep.yaml"
    labels = [c.name for c in sorted((run.output_dir / "checkpoints").iterdir()) if c.name != "last"]
    cases = [
        (labels[0], True),
        (labels[0][:-1] + "O", False),  # one edit away: a misspelled label
        (labels[0][:-1] + "1", False),  # a digit off, before the last saved step: misspelled too
        ("final", True),  # not saved yet, maybe: the run's check says so if it never comes
        (f"{int(labels[-1]) + 1:0{len(labels[-1])}d}", True),  # a later step: one edit away, but not saved yet
        (str(tmp_path / "baseline.json"), True),  # grades an earlier step may write
    ]
    for baseline, valid in cases:
        gate = [{"kind": "no_regression", "baseline": baseline}]
        written = sweep_spec(tmp_path, str(run.output_dir), checks=gate).model_dump(mode="json", exclude_unset=True)
        path.write_text(json.dumps(written, indent=1))
        capsys.readouterr()
        assert main(["validate", str(path)]) == (0 if valid else 1), (baseline, capsys.readouterr().out)
        if not valid:
            out = capsys.readouterr().out
            assert "checks[0].baseline" in out
            assert f"is no checkpoint of the sweep (did you mean '{labels[0]}'?); found now: {', '.join(labels)}" in out
            assert main(["run", str(path), "--quiet"]) == 2, "refused before any checkpoint is evaluated"
            assert "checks[0].baseline" in capsys.readouterr().err


def test_a_baseline_whose_files_are_gone_since_it_was_evaluated_is_no_typo_to_a_run(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a run (and ``validate``) refused the sweep once training deleted the baseline's folder: its label,
    one edit from a label found now, was taken for a typo, though its results were kept and ``report`` judged
    against them."""
    from hud_pipelines.cli.selection import refuse_misconfigured
    from hud_pipelines.errors import HudPipelinesError
    from hud_pipelines.eval.outputs import EvalOutputs

    monkeypatch.chdir(REPO)
    gate = [{"kind": "no_regression", "baseline": "001000"}]
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1, checks=gate)
    evaluate(spec, outputs_dir=tmp_path / "out", checkpoints=["001000"])
    shutil.rmtree(run.step_dirs[1000])  # 000500 and 001500 remain: 001000 is one edit from 001500
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    path = tmp_path / "reach_sweep.yaml"
    refuse_misconfigured(path, spec, outputs)  # evaluated, so a baseline still
    mistyped = sweep_spec(tmp_path, str(run.output_dir), checks=[{**gate[0], "baseline": "001100"}])
    with pytest.raises(HudPipelinesError, match=r"checks\[0\]\.baseline: '001100' is no checkpoint of the sweep"):
        refuse_misconfigured(path, mistyped, outputs)

    from hud_pipelines.cli.main import main

    monkeypatch.setenv("HUD_PIPELINES_OUTPUTS", str(tmp_path / "out"))  # where validate looks for results, as run
    path.write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True)))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 0, capsys.readouterr().out
    assert "1 pipeline valid (deep check)" in capsys.readouterr().out
    path.write_text(json.dumps(mistyped.model_dump(mode="json", exclude_unset=True)))
    assert main(["validate", str(path)]) == 1
    assert "checks[0].baseline: '001100' is no checkpoint of the sweep" in capsys.readouterr().out


def test_a_checkpoint_the_sim_cannot_feed_errors_its_rows_with_the_features_named(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1)
    policy = spec.agent.policy.model_copy(update={"rename": {}})  # the goal no longer reaches environment_state
    broken = spec.with_sections(agent=spec.agent.model_copy(update={"policy": policy}))
    evaluation = evaluate(broken, outputs_dir=tmp_path / "out", checkpoints=["000500"])
    assert {row.fault.value if row.fault else None for row in evaluation.rows} == {"setup"}
    assert all("observation.environment_state" in (row.error or "") for row in evaluation.rows)
    assert not evaluation.passed


def test_a_checkpoint_that_never_loaded_leaves_the_table_once_its_files_are_deleted(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, its errored rows stayed the candidate's after the folder was deleted, failing every later run."""
    monkeypatch.chdir(REPO)
    config = run.pretrained(1500) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dim_model": 8}))  # weights of another shape
    age(run.output_dir, 60)
    published = tmp_path / "datasets"
    spec = sweep_spec(
        tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1, dataset={"root": str(published)}
    )
    broken = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.status.value for row in broken.rows if row.checkpoint == "001500"} == {"errored"}
    assert not broken.passed, "the latest checkpoint could not be evaluated"
    completed = next(check for check in broken.checks if check.name == "instances_completed")
    assert "checkpoint(s) 001500 could not be loaded where others were, and fail this check" in completed.description
    assert "(its errored results leave the table with it); re-run them with: " in completed.description

    shutil.rmtree(run.step_dirs[1500])
    after = evaluate(spec, outputs_dir=tmp_path / "out")
    assert [row.checkpoint for row in after.rows] == ["000500"] * 2 + ["001000"] * 2
    assert after.passed, "the candidate is 001000 again"
    assert after.rows == [row for row in broken.rows if row.checkpoint != "001500"], "the others are kept as they were"
    compared = (tmp_path / "out" / "reach_sweep" / "comparison.csv").read_text()
    assert "001500" not in compared, "nor is it compared"
    assert "001500" not in (tmp_path / "out" / "reach_sweep" / "report.md").read_text().split("## Checkpoints")[1]
    assert after.dataset is not None, (
        "the checkpoints that ran publish their datasets; the one that never loaded has none"
    )
    assert sorted(p.name for p in published.iterdir()) == ["000500", "001000"]
    script = (tmp_path / "out" / "reach_sweep" / "report_files" / "dataset.js").read_text()
    links = json.loads(script.removeprefix("window.HUD_DATASET = ").removesuffix(";\n"))
    assert [link["root"] for link in links] == [str(published / "000500"), str(published / "001000")], (
        "the sweep's page links each card to its checkpoint's own dataset"
    )
    for link in links:
        label = Path(link["root"]).name
        assert set(link["episodes"]) == {row.trace_id for row in after.rows if row.checkpoint == label}


def test_a_deleted_checkpoint_that_never_loaded_leaves_the_table_though_its_results_went_stale(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, an edit made its errored rows stale (``not_run``), which kept them in the table: at the highest step
    it stayed the candidate, and every later run failed, saying to restore files that never loaded."""
    monkeypatch.chdir(REPO)
    config = run.pretrained(1500) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dim_model": 8}))  # weights of another shape
    age(run.output_dir, 60)
    near = [{"name": "near", "seed": 10}]
    first = evaluate(sweep_spec(tmp_path, str(run.output_dir), tasks=near, group=1), outputs_dir=tmp_path / "out")
    assert {row.status.value for row in first.rows if row.checkpoint == "001500"} == {"errored"}
    shutil.rmtree(run.step_dirs[1500])
    edited = sweep_spec(tmp_path, str(run.output_dir), tasks=near, group=1, max_steps=5)  # every result is stale
    after = evaluate(edited, outputs_dir=tmp_path / "out")
    assert [row.checkpoint for row in after.rows] == ["000500"] * 2 + ["001000"] * 2
    assert after.passed, "the candidate is 001000, evaluated again"


def test_report_after_the_group_was_lowered_names_each_checkpoints_dataset_that_holds_more(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    monkeypatch.chdir(REPO)
    published = tmp_path / "datasets"
    fields: dict[str, Any] = {"tasks": [{"name": "near", "seed": 10}], "dataset": {"root": str(published)}}
    spec = sweep_spec(tmp_path, str(run.output_dir), group=2, **fields)
    evaluate(spec, outputs_dir=tmp_path / "out")
    path = tmp_path / "reach_sweep.yaml"
    lowered = sweep_spec(tmp_path, str(run.output_dir), group=1, **fields)
    path.write_text(json.dumps(lowered.model_dump(mode="json", exclude_unset=True)))
    capsys.readouterr()
    assert main(["report", str(path), "--outputs", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    for label in ("000500", "001000", "001500"):
        assert f"{published / label} holds 2 of its 4 episode(s)" in said, said
    report = (tmp_path / "out" / "reach_sweep" / "report.md").read_text()
    assert "from results these grades no longer count" in report


def test_a_checkpoint_whose_dataset_writer_failed_holds_back_only_its_own_dataset_until_it_runs_again(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dataset.part import FinishedEpisode, PartWriter
    from hud_pipelines.errors import DatasetWriteError

    monkeypatch.chdir(REPO)
    published = tmp_path / "datasets"
    spec = sweep_spec(
        tmp_path, str(run.output_dir), tasks=[{"name": "near", "seed": 10}], group=1, dataset={"root": str(published)}
    )
    write = PartWriter.write

    def full_disk_for_001000(self: PartWriter, item: FinishedEpisode, layout: Any) -> None:
        if "/001000/" in item.key.job:
            raise OSError(28, "No space left on device")
        write(self, item, layout)

    monkeypatch.setattr(PartWriter, "write", full_disk_for_001000)
    with pytest.raises(DatasetWriteError) as raised:
        evaluate(spec, outputs_dir=tmp_path / "out")
    said = str(raised.value)
    assert said.startswith("checkpoint 001000: reach_sweep: the dataset writer of 1 instance(s) failed"), said
    command = f"hud-pipelines run {tmp_path / 'reach_sweep.yaml'} --outputs {tmp_path / 'out'}"
    rerun = f"run them again: {command} --rerun --partition '001000|near-i0'"
    assert said.endswith(rerun), said
    assert sorted(p.name for p in published.iterdir()) == ["000500", "001500"], "the others are published"

    monkeypatch.setattr(PartWriter, "write", write)
    again = evaluate(spec, outputs_dir=tmp_path / "out", checkpoints=["001000"], rerun=True)
    assert again.dataset is not None
    assert sorted(p.name for p in published.iterdir()) == ["000500", "001000", "001500"]


def test_one_sim_serves_every_checkpoint_and_each_policy_is_loaded_once(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.agent.lerobot import LeRobotPolicy
    from hud_pipelines.sim.process import SimProcess

    monkeypatch.chdir(REPO)
    loaded: list[Path] = []
    spawned: list[str] = []
    real_load, real_spawn = LeRobotPolicy.from_pretrained, SimProcess.spawn

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        loaded.append(Path(path))
        return real_load(path, *args, **kwargs)

    def spawn(factory: str, *args: Any, **kwargs: Any) -> Any:
        spawned.append(factory)
        return real_spawn(factory, *args, **kwargs)

    monkeypatch.setattr(LeRobotPolicy, "from_pretrained", staticmethod(load))
    monkeypatch.setattr(SimProcess, "spawn", staticmethod(spawn))
    evaluation = evaluate(sweep_spec(tmp_path, str(run.output_dir), max_concurrent=2), outputs_dir=tmp_path / "out")
    assert len(evaluation.results) == 3 * 4, "3 checkpoints x 2 tasks x 2 instances"
    assert sorted(loaded) == sorted(run.pretrained(step) for step in (500, 1000, 1500))
    assert len(spawned) <= 2, "at most max_concurrent sims, reused by every checkpoint"


def test_a_sweep_over_several_training_runs_labels_each_checkpoint_by_its_run(
    lerobot_run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    first = copy_run(lerobot_run, tmp_path / "first")
    second = write_lerobot_run(tmp_path / "second" / "act_other", [200])
    age(tmp_path, 60)
    spec = sweep_spec(
        tmp_path, [str(first.output_dir), str(second.output_dir)], tasks=[{"name": "near", "seed": 10}], group=1
    )
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    labels = list(dict.fromkeys(row.checkpoint for row in evaluation.rows))
    assert labels == ["act_pusht/000500", "act_pusht/001000", "act_pusht/001500", "act_other/000200"], "YAML order"
    assert evaluation.passed
    table = json.loads((tmp_path / "out" / "reach_sweep" / "comparison.json").read_text())
    overall = [r for r in table["rows"] if r["task"] == "all"]
    assert [r["checkpoint"] for r in overall] == labels
    assert [r["run"] for r in overall] == ["act_pusht"] * 3 + ["act_other"]
    assert overall[3]["vs_previous"] is None, "the first checkpoint of a run has no previous one of another run"
    assert overall[1]["vs_previous"] is not None


def test_a_sweep_with_a_matrix_judges_its_candidates_control_tasks(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main
    from hud_pipelines.eval.grades import summarize

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(REPO)
    tasks = [{"name": "near", "seed": 10, "matrix": {"reach": [1.5]}}]
    gate = [{"kind": "min_success_rate", "value": 0.0}]
    spec = sweep_spec(tmp_path, str(run.output_dir), tasks=tasks, checks=gate)
    path = tmp_path / "reach_sweep.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True)))
    capsys.readouterr()
    assert main(["run", str(path), "--quiet", "--checkpoint", "001500", "--outputs", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    rows = [GradeRow.from_dict(r) for r in json.loads((tmp_path / "out" / "reach_sweep" / "grades.json").read_text())]
    control = [row for row in rows if row.task == "near"]
    assert {row.task for row in rows} == {"near", "near-reach-1.5"}
    assert f"this run, 001500 control tasks: success rate {summarize(control).success_rate:.1%}" in out
    checks = json.loads((tmp_path / "out" / "reach_sweep" / "checks.json").read_text())
    [judged] = [c for c in checks if c["name"] == "min_success_rate"]
    assert judged["observed"] == summarize(control).success_rate
    assert judged["description"].startswith("control tasks: 001500: ")
    base = tmp_path / "out" / "reach_sweep"
    table = list(csv.DictReader((base / "comparison.csv").read_text().splitlines()))
    [overall] = [row for row in table if row["checkpoint"] == "001500" and row["task"] == "all"]
    assert int(overall["episodes"]) == len(control), "the all row counts the control tasks, never the arms"
    assert float(overall["success_rate"]) == summarize(control).success_rate
    assert "`all` row counts its control tasks" in (base / "report.md").read_text()
    assert "all row counts its control tasks" in (base / "report.html").read_text()


def test_a_sweep_evaluates_its_checkpoints_again_after_an_edit_of_the_sims_code(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    sim = tmp_path / "reach_sim.py"
    sim.write_text((REPO / "tests" / "eval" / "sweep_sims.py").read_text())
    spec = sweep_spec(
        tmp_path,
        str(run.output_dir),
        tasks=[{"name": "near", "seed": 10}],
        group=1,
        sim={"factory": "reach_sim.py:Reach2D", "num_envs": 2},
    )
    out = tmp_path / "out"
    first = evaluate(spec, outputs_dir=out, checkpoints=["000500"])
    assert {row.run_id for row in first.rows} == {first.run_id}
    kept = evaluate(spec, outputs_dir=out, checkpoints=["000500"])
    assert {row.run_id for row in kept.rows} == {first.run_id}, "nothing changed: the result is current"

    sim.write_text(sim.read_text().replace("REACH = 0.6", "REACH = 0.0"))  # no episode can succeed now
    edited = evaluate(spec, outputs_dir=out, checkpoints=["000500"])
    assert {row.run_id for row in edited.rows} == {edited.run_id}, "results of the old sim are not kept as current"
    assert not any(row.success for row in edited.rows)


def test_a_task_added_to_a_sweep_is_evaluated_alone_on_every_checkpoint(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    near, mid = {"name": "near", "seed": 10}, {"name": "mid", "seed": 20}
    out = tmp_path / "out"
    first = evaluate(sweep_spec(tmp_path, str(run.output_dir), tasks=[near, mid], group=1), outputs_dir=out)
    assert {(row.fault, row.run_id) for row in first.rows} == {(None, first.run_id)}

    grown = sweep_spec(tmp_path, str(run.output_dir), tasks=[near, mid, {"name": "far", "seed": 30}], group=1)
    second = evaluate(grown, outputs_dir=out)
    ran = {(row.checkpoint, row.task, row.fault, row.run_id) for row in second.rows}
    labels = {row.checkpoint for row in first.rows}
    assert len(labels) == 3
    assert ran == {
        *((label, task, None, first.run_id) for label in labels for task in ("near", "mid")),
        *((label, "far", None, second.run_id) for label in labels),
    }, "every checkpoint keeps its results on the tasks it was evaluated on and runs the new one alone"


def test_a_stale_checkpoints_reason_names_only_what_changed_of_the_sweep(
    run: LeRobotRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a checkpoint's recorded policy and weights' hash were held against the whole sweep's (its list of
    checkpoints, no hash of its own): a change of max_steps alone read "policy, checkpoint_hash changed"."""
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.rows import collect_rows

    monkeypatch.chdir(REPO)
    near = [{"name": "near", "seed": 10}]
    out, outputs = tmp_path / "out", EvalOutputs(tmp_path / "out", "reach_sweep")
    evaluate(sweep_spec(tmp_path, str(run.output_dir), tasks=near, group=1), outputs_dir=out)
    longer = sweep_spec(tmp_path, str(run.output_dir), tasks=near, group=1, max_steps=7)

    def reasons(rows: list[GradeRow]) -> dict[str, str]:
        return {row.checkpoint or "": (row.error or "").split(" before ")[-1] for row in rows if row.error}

    said = "the pipeline's max_steps changed; run it with: hud-pipelines run"
    edited = reasons(collect_rows(longer, outputs))  # as `report` judges it: the YAML edited, nothing run since
    assert list(edited) == ["000500", "001000", "001500"]
    assert all(reason.startswith(said) for reason in edited.values()), edited
    evaluate(longer, outputs_dir=out, checkpoints=["000500"])  # the latest run is of the new max_steps
    ran = reasons(collect_rows(longer, outputs))
    assert list(ran) == ["001000", "001500"]
    assert all(reason.startswith(said) for reason in ran.values()), ran
