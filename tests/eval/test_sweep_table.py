"""The sweep table, checked against scipy on constructed checkpoints that share their episodes.

Three checkpoints of one training run, two tasks, the same (task, instance, slot, seed) episodes for
each: each episode has a difficulty and a checkpoint solves the episodes easier than its skill, so
later checkpoints mostly solve a superset (the paired design a sweep has). A few episodes error.
The reference figures are computed here from the outcome strings with scipy.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from hud_pipelines.eval.comparison import Verdict
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.sweep_stats import compare_checkpoints
from hud_pipelines.eval.sweep_table import (
    ALL_TASKS,
    COLUMNS,
    NO_COMPARISON,
    CheckpointRows,
    SweepComparison,
    SweepRow,
)
from hud_pipelines.recording.events import EpisodeStatus

TASKS = ("push", "lift")
INSTANCES, SLOTS = 4, 6
EPISODES = INSTANCES * SLOTS
_DIFFICULTY = np.random.default_rng(11).uniform(size=(len(TASKS), EPISODES))
SKILL = {"000100": 0.25, "000200": 0.5, "000300": 0.85}
ERRORED = {("000200", "push"): {3, 7}, ("000300", "lift"): {7, 12, 20}}
STATUS = {"S": EpisodeStatus.SUCCEEDED, "F": EpisodeStatus.FAILED, "E": EpisodeStatus.ERRORED}


def _outcomes(label: str, task: str) -> str:
    """``S``/``F``/``E`` per episode of ``task`` for checkpoint ``label``."""
    task_index = TASKS.index(task)
    errored = ERRORED.get((label, task), set())
    return "".join(
        "E" if episode in errored else "S" if _DIFFICULTY[task_index, episode] < SKILL[label] else "F"
        for episode in range(EPISODES)
    )


def _row(task: str, episode: int, outcome: str) -> GradeRow:
    task_index = TASKS.index(task) if task in TASKS else 0
    instance, slot = divmod(episode, SLOTS)
    status = STATUS[outcome]
    score = (1.0 if outcome == "S" else 0.0) + 0.1 * (episode % 5)
    return GradeRow(
        "sweep", task, task_index, instance, f"{task}-i{instance}", slot, 1000 * task_index + episode,
        status, score, outcome == "S", score, 10,
    )  # fmt: skip


def _rows_of(outcomes: dict[str, str]) -> list[GradeRow]:
    return [_row(task, episode, outcome) for task, text in outcomes.items() for episode, outcome in enumerate(text)]


def _checkpoint(label: str, *, numbered: bool = True) -> CheckpointRows:
    """Checkpoint ``label`` at step ``int(label)`` (no step unless ``numbered``) with its rows of every task."""
    rows = _rows_of({task: _outcomes(label, task) for task in TASKS})
    return CheckpointRows(label, int(label) if numbered else None, rows)


def _sweep(baseline: str | None = "000100") -> SweepComparison:
    return compare_checkpoints([_checkpoint(label) for label in SKILL], baseline=baseline)


def _find(table: SweepComparison, checkpoint: str, task: str) -> SweepRow:
    (row,) = [r for r in table.rows if r.checkpoint == checkpoint and r.task == task]
    return row


def _all_outcomes(label: str) -> str:
    return "".join(_outcomes(label, task) for task in TASKS)


def _outcomes_of(label: str, task: str) -> str:
    """One task's outcomes, or every task's one after the other for the all-tasks row."""
    return _all_outcomes(label) if task == ALL_TASKS else _outcomes(label, task)


def _paired_reference(mine: str, theirs: str) -> tuple[int, float, float]:
    """Pairs, success difference and McNemar p from two outcome strings, by scipy's binomial test."""
    pairs = [(a, b) for a, b in zip(mine, theirs, strict=True) if "E" not in (a, b)]
    only_mine = sum(a == "S" and b == "F" for a, b in pairs)
    only_theirs = sum(a == "F" and b == "S" for a, b in pairs)
    discordant = only_mine + only_theirs
    p = 1.0 if discordant == 0 else stats.binomtest(only_mine, discordant, 0.5).pvalue
    return len(pairs), (only_mine - only_theirs) / len(pairs), p


def test_every_checkpoint_has_its_task_rows_then_an_all_tasks_row_with_scipys_wilson_interval() -> None:
    table = _sweep()
    assert [(r.checkpoint, r.task) for r in table.rows] == [
        (label, task) for label in SKILL for task in (*TASKS, ALL_TASKS)
    ]
    for label in SKILL:
        for task in (*TASKS, ALL_TASKS):
            outcomes = _outcomes_of(label, task)
            row = _find(table, label, task)
            succeeded, failed, errored = (outcomes.count(c) for c in "SFE")
            assert (row.episodes, row.succeeded, row.failed, row.errored) == (len(outcomes), succeeded, failed, errored)
            assert row.step == int(label)
            assert row.success_rate == pytest.approx(succeeded / (succeeded + failed))
            wilson = stats.binomtest(succeeded, succeeded + failed).proportion_ci(0.95, method="wilson")
            assert (row.ci_low, row.ci_high) == (pytest.approx(float(wilson.low)), pytest.approx(float(wilson.high)))
            rows = [r for r in _checkpoint(label).rows if task in (ALL_TASKS, r.task)]
            answered = [r.score for r in rows if r.status is not EpisodeStatus.ERRORED]
            assert row.mean_score == pytest.approx(sum(answered) / len(answered))


def test_errored_episodes_are_counted_as_errored_never_failed_and_left_out_of_the_pairs() -> None:
    table = _sweep()
    push = _find(table, "000200", "push")
    assert push.errored == 2
    assert push.failed == _outcomes("000200", "push").count("F")
    assert push.success_rate == pytest.approx(push.succeeded / (EPISODES - 2)), "errors leave the denominator"
    assert push.versus_previous.pairs == EPISODES - 2
    lift = _find(table, "000300", "lift")
    assert lift.versus_previous.pairs == EPISODES - 3
    assert _find(table, "000300", ALL_TASKS).versus_previous.pairs == 2 * EPISODES - 5, "errors on either side"
    assert _find(table, "000300", "push").versus_previous.pairs == EPISODES - 2, "errored on the previous side"


@pytest.mark.parametrize("task", [*TASKS, ALL_TASKS])
def test_each_checkpoint_is_compared_with_the_previous_one_by_mcnemars_exact_test(task: str) -> None:
    table = _sweep(baseline=None)
    labels = list(SKILL)
    first = _find(table, labels[0], task)
    assert first.versus_previous.verdict is None
    assert first.as_dict()["previous_p"] is None
    for previous, label in itertools.pairwise(labels):
        versus = _find(table, label, task).versus_previous
        pairs, diff, p = _paired_reference(_outcomes_of(label, task), _outcomes_of(previous, task))
        assert versus.pairs == pairs
        assert versus.diff == pytest.approx(diff)
        assert versus.p == pytest.approx(p, rel=1e-12)
        assert versus.verdict is (Verdict.NO_DIFFERENCE if p >= 0.05 else Verdict.BETTER if diff > 0 else Verdict.WORSE)
        assert versus.diff_low is not None
        assert versus.diff_high is not None
        assert versus.diff_low <= diff <= versus.diff_high
        assert versus.episodes_needed is not None
        assert versus.episodes_needed > 0
        if versus.verdict is Verdict.NO_DIFFERENCE:  # sized for min_effect, and the table says so
            assert f"~{versus.episodes_needed} pairs needed to detect a 10% difference at 80% power" in table.markdown()


def test_the_baseline_columns_compare_with_the_baseline_and_stay_empty_on_the_baseline_itself() -> None:
    table = _sweep(baseline="000100")
    assert all(row.versus_baseline.verdict is None for row in table.rows if row.checkpoint == "000100")
    for task in (*TASKS, ALL_TASKS):
        for label in ("000200", "000300"):
            versus = _find(table, label, task).versus_baseline
            pairs, diff, p = _paired_reference(_outcomes_of(label, task), _outcomes_of("000100", task))
            assert (versus.pairs, versus.diff, versus.p) == (pairs, pytest.approx(diff), pytest.approx(p, rel=1e-12))
        second = _find(table, "000200", task)
        assert second.versus_baseline == second.versus_previous, "the previous checkpoint is the baseline"
    assert _find(table, "000300", ALL_TASKS).versus_baseline.verdict is Verdict.BETTER
    assert all(row.versus_baseline.verdict is None for row in _sweep(baseline=None).rows)


def test_the_best_checkpoint_has_the_highest_all_tasks_rate_and_ties_go_to_the_later_step() -> None:
    rates = {
        label: _all_outcomes(label).count("S") / (2 * EPISODES - _all_outcomes(label).count("E")) for label in SKILL
    }
    assert _sweep().best == max(rates, key=lambda label: rates[label])
    same = _rows_of({"push": "SSFF"})
    tied = compare_checkpoints([("early", 100, same), ("middle", 200, same), ("late", 300, same)])
    assert tied.best == "late"
    unnumbered = compare_checkpoints([("a", None, same), ("b", None, same), ("c", 100, same)])
    assert unnumbered.best == "c", "the one later in training order"
    # two runs: the last listed holds the latest checkpoint (the candidate), whatever the other run's steps
    runs = compare_checkpoints(
        [CheckpointRows("a/002000", 2000, same, "a"), CheckpointRows("b/000500", 500, same, "b")]
    )
    assert runs.best == "b/000500"
    assert compare_checkpoints([("x", 1, _rows_of({"push": "EE"}))]).best is None


def test_the_same_rows_in_any_order_give_the_same_csv_and_json_bytes_and_json_round_trips() -> None:
    table = _sweep()
    shuffled: list[tuple[str, int | None, list[GradeRow]]] = []
    for label in SKILL:
        checkpoint = _checkpoint(label)
        rows = list(checkpoint.rows)
        random.Random(label).shuffle(rows)
        shuffled.append((checkpoint.label, checkpoint.step, rows))
    again = compare_checkpoints(shuffled, baseline="000100")
    assert again == table
    assert (again.to_json(), again.to_csv()) == (table.to_json(), table.to_csv())
    assert table.to_json() == table.to_json()

    restored = SweepComparison.from_json(table.to_json())
    assert restored == table
    assert restored.to_json() == table.to_json()
    document = json.loads(table.to_json())
    assert document["best"] == table.best
    assert list(document["rows"][0]) == list(COLUMNS)

    parsed = list(csv.DictReader(io.StringIO(table.to_csv())))
    assert len(parsed) == len(table.rows)
    for line, row in zip(parsed, table.rows, strict=True):
        for column, value in row.as_dict().items():
            assert line[column] == ("" if value is None else str(value)), column
        assert float(line["ci_low"]) == row.ci_low, "floats are written to round-trip exactly"


def test_the_mean_score_interval_is_a_percentile_bootstrap_like_scipys() -> None:
    row = _find(_sweep(), "000200", ALL_TASKS)
    scores = np.array([r.score for r in _checkpoint("000200").rows if r.status is not EpisodeStatus.ERRORED])
    reference = stats.bootstrap(
        (scores,), np.mean, confidence_level=0.95, n_resamples=20_000, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    low, high = float(reference.low), float(reference.high)
    width = high - low
    assert row.score_ci_low == pytest.approx(low, abs=0.1 * width)
    assert row.score_ci_high == pytest.approx(high, abs=0.1 * width)
    assert row.score_ci_low is not None
    assert row.score_ci_high is not None
    assert row.score_ci_low < scores.mean() < row.score_ci_high


def test_a_checkpoint_without_an_answered_episode_has_no_rates_and_breaks_nothing(tmp_path: Path) -> None:
    broken = ("broken", 200, _rows_of({"push": "E" * EPISODES, "lift": "E" * EPISODES}))
    table = compare_checkpoints([_checkpoint("000100"), broken, _checkpoint("000300")], baseline="broken")
    for task in (*TASKS, ALL_TASKS):
        row = _find(table, "broken", task)
        assert (row.episodes, row.errored, row.succeeded, row.failed) == (row.errored, row.episodes, 0, 0)
        assert (row.success_rate, row.ci_low, row.ci_high, row.mean_score, row.score_ci_low) == (None,) * 5
        assert row.versus_previous.pairs == 0
        assert _find(table, "000300", task).versus_previous.checkpoint == "000100", "the last that answered"
    assert table.best == "000300"
    document = json.loads(table.to_json())
    broken_all = next(r for r in document["rows"] if r["checkpoint"] == "broken" and r["task"] == ALL_TASKS)
    assert broken_all["success_rate"] is None
    assert SweepComparison.from_json(table.to_json()) == table
    assert "n/a (no answered episode, 48 errored)" in table.markdown()
    assert "vs baseline broken: no paired episodes" in table.conclusion()
    written = {(line["checkpoint"], line["task"]): line for line in csv.DictReader(io.StringIO(table.to_csv()))}
    for label, side in (("broken", "previous"), ("000300", "baseline")):  # no pairs: "no difference" says nothing
        assert written[label, ALL_TASKS][f"vs_{side}"] == "no paired episodes"
        assert written[label, ALL_TASKS][f"{side}_pairs"] == "0"
    assert written["000100", ALL_TASKS]["vs_previous"] == "", "nothing to compare with"
    assert "no detectable difference" not in table.markdown()
    assert _is_png(table.plot(tmp_path / "broken.png"))


def test_the_plot_is_a_png_of_success_against_step_and_places_unnumbered_checkpoints_by_order(tmp_path: Path) -> None:
    table = _sweep()
    path = tmp_path / "sweep.png"
    png = table.plot(path)
    assert path.read_bytes() == png
    assert _is_png(png)
    assert table.plot() == png, "the same table draws the same bytes"
    figure = table.figure()
    (axis,) = figure.axes
    assert axis.get_xlabel() == "training step"
    assert [float(tick) for tick in axis.get_xticks()] == [100, 200, 300]
    legend = axis.get_legend()
    assert legend is not None
    assert [text.get_text() for text in legend.get_texts()] == [*TASKS, "all tasks"]

    unnumbered = compare_checkpoints([_checkpoint("000100"), _checkpoint("000200", numbered=False)])
    assert [row.step for row in unnumbered.overall] == [100, None]
    axis = unnumbered.figure().axes[0]
    assert axis.get_xlabel() == "checkpoint (in training order)"
    assert [float(tick) for tick in axis.get_xticks()] == [0, 1]
    assert [text.get_text() for text in axis.get_xticklabels()] == ["000100", "000200"]
    assert _is_png(unnumbered.plot())


def test_the_markdown_table_and_its_conclusion() -> None:
    table = _sweep()
    text = table.markdown()
    lines = text.splitlines()
    assert lines[0] == "| checkpoint | step | task | success (95% CI, n) | vs previous | vs baseline (000100) |"
    assert len([line for line in lines if line.startswith("| 000")]) == len(table.rows)
    best = _find(table, "000300", ALL_TASKS)
    versus = best.versus_baseline
    assert lines[-1] == (
        f"000300 is the best ({best.success_rate:.1%}, 95% CI {best.ci_low:.1%}-{best.ci_high:.1%}, "
        f"n={best.answered}, 3 errored); vs baseline 000100: better ({versus.diff:+.1%}, p={versus.p:.3g})."
    )
    assert f"{best.succeeded}/{best.answered}, 3 errored" in text

    two = [CheckpointRows("a", 1, _rows_of({"push": "SFFF"})), ("b", 2, _rows_of({"push": "SSSF"}))]
    single = compare_checkpoints(two)
    lines = single.markdown().splitlines()
    assert lines[0] == "| checkpoint | step | success (95% CI, n) | vs previous |", "no baseline: no column"
    assert lines[3].count(" | ") == 3
    assert lines[3].startswith("| b | 2 | 75.0% (")
    assert "no detectable difference +50.0% (p=0.5, 4 pairs; ~" in lines[3]
    assert lines[-1].startswith("b is the best (75.0%, 95% CI ")
    assert lines[-1].endswith(", n=4).")
    assert [(r.checkpoint, r.task) for r in single.rows] == [
        ("a", "push"),
        ("a", ALL_TASKS),
        ("b", "push"),
        ("b", ALL_TASKS),
    ]
    assert len(lines) == 2 + 2 + 2, "one line per checkpoint: the all-tasks row repeats the only task's"
    assert compare_checkpoints(two, baseline="b").conclusion().endswith("; it is the baseline.")


def test_labels_in_the_markdown_table_and_its_conclusion_are_text_never_markup() -> None:
    odd = [CheckpointRows("<b>a</b>", 1, _rows_of({"push": "SFFF"})), ("c <img src=x>", 2, _rows_of({"push": "SSSF"}))]
    stood_in = compare_checkpoints([*odd, ("d", 3, _rows_of({"push": "EEEE"})), ("e", 4, _rows_of({"push": "SSSS"}))])
    named = stood_in.markdown().splitlines()[5]
    assert named.startswith("| e | 4 |")
    assert "with c &lt;img src=x>" in named, "the checkpoint that stands in for one that answered nothing, as text"
    text = compare_checkpoints(odd, baseline="<b>a</b>").markdown()
    assert "<b>" not in text, text
    assert "<img" not in text, text
    assert "| &lt;b>a&lt;/b> | 1 |" in text
    assert text.splitlines()[-1].startswith("c &lt;img src=x> is the best (75.0%")
    assert "vs baseline &lt;b>a&lt;/b>:" in text.splitlines()[-1]


def test_the_pages_table_gives_each_difference_its_interval_and_no_baseline_column_without_a_baseline() -> None:
    from hud_pipelines.eval.report_html.page import _checkpoints  # pyright: ignore[reportPrivateUsage]

    with_baseline, without = _checkpoints(_sweep(), [], matrix=False), _checkpoints(_sweep(None), [], matrix=False)
    versus = _find(_sweep(), "000300", ALL_TASKS).versus_baseline
    assert versus.diff_low is not None
    assert versus.diff_high is not None
    assert f"(95% CI {versus.diff_low:+.1%} to {versus.diff_high:+.1%}, p={versus.p:.3g}, " in with_baseline
    assert "<th>vs baseline</th>" in with_baseline
    assert "<th>vs baseline</th>" not in without, "an always empty column"
    assert without.count("<tr><td>") == with_baseline.count("<tr><td>")
    first_row = without.split("<tbody>")[1].split("</tr>")[0]
    assert first_row.count("<td>") == 8


def test_each_checkpoints_link_and_the_sentence_above_the_table_hold_for_any_label_and_baseline() -> None:
    """A label may hold ``#``, ``?`` and ``%`` (valid folder names): the link to its page was written raw, and a
    browser opened ``checkpoints/run`` for ``run#1``. report.md named a baseline a sweep without one does not have."""
    from hud_pipelines.eval.report_html.page import _checkpoints  # pyright: ignore[reportPrivateUsage]
    from hud_pipelines.eval.steps import _sweep_section  # pyright: ignore[reportPrivateUsage]

    odd = compare_checkpoints([("run#1", 1, _rows_of({"push": "SFFF"})), ("50%done?", 2, _rows_of({"push": "SSSF"}))])
    page = _checkpoints(odd, [], matrix=False)
    assert '<a href="checkpoints/run%231/report.html">run#1</a>' in page
    assert '<a href="checkpoints/50%25done%3F/report.html">50%done?</a>' in page
    assert "compared with the previous one by McNemar" in _sweep_section(odd, [], matrix=False)
    gated = compare_checkpoints(
        [("a", 1, _rows_of({"push": "SFFF"})), ("b", 2, _rows_of({"push": "SSSF"}))], baseline="a"
    )
    assert "compared with the previous one and the baseline a by McNemar" in _sweep_section(gated, [], matrix=False)


def test_what_would_make_a_wrong_table_is_refused_by_name() -> None:
    rows = _rows_of({"push": "SF"})
    with pytest.raises(ValueError, match=r"listed twice: a"):
        compare_checkpoints([("a", 1, rows), ("a", 2, rows)])
    with pytest.raises(ValueError, match=r"the baseline 'z' is not one of the checkpoints \(a, b\)"):
        compare_checkpoints([("a", 1, rows), ("b", 2, rows)], baseline="z")
    with pytest.raises(ValueError, match=r"checkpoint a: a task is named 'all'"):
        compare_checkpoints([("a", 1, _rows_of({"all": "SF"}))])
    with pytest.raises(ValueError, match="alpha"):
        compare_checkpoints([("a", 1, rows)], alpha=0)
    with pytest.raises(ValueError, match="missing column"):
        SweepComparison.from_json(json.dumps({"baseline": None, "alpha": 0.05, "min_effect": 0.1, "rows": [{}]}))


def _is_png(data: bytes) -> bool:
    image = Image.open(io.BytesIO(data))
    image.verify()
    return image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


def test_a_score_that_is_the_success_gets_the_success_interval_and_one_episode_gets_none() -> None:
    rows = [dataclasses.replace(r, score=float(r.success)) for r in _rows_of({"push": "SSSSSSSSSF"})]
    table = compare_checkpoints([("only", 100, rows)])
    row = _find(table, "only", "push")
    assert (row.score_ci_low, row.score_ci_high) == (row.ci_low, row.ci_high), "a bootstrap of 0/1 is too narrow"
    assert row.score_ci_low is not None
    assert row.score_ci_low < 0.9
    scored = [dataclasses.replace(r, score=3.5) for r in _rows_of({"push": "SEEEEEEEEE"})]
    alone = _find(compare_checkpoints([("alone", 100, scored)]), "alone", "push")
    assert alone.mean_score == 3.5
    assert (alone.score_ci_low, alone.score_ci_high) == (None, None), "one answered episode: no interval"


def test_the_best_checkpoint_is_not_one_whose_rate_stands_on_a_few_answered_episodes() -> None:
    lucky = ("lucky", 100, _rows_of({"push": "S" + "E" * 11}))  # 1 of 1 answered: 100%, lower bound 21%
    steady = ("steady", 200, _rows_of({"push": "SSSSSFFFF" + "EEE"}))  # 5 of 9: 55.6%, lower bound 27%
    table = compare_checkpoints([lucky, steady])
    assert table.best == "steady"
    assert table.conclusion().startswith("steady is the best (55.6%, 95% CI 26.7%-81.1%, n=9, 3 errored)")
    better, worse = _rows_of({"push": "SSSSSFFFF"}), _rows_of({"push": "SSSFFFFFF"})
    assert compare_checkpoints([("a", 100, better), ("b", 200, worse)]).best == "a", "as many answered: the higher rate"


def test_a_sweep_of_several_runs_compares_each_checkpoint_with_its_own_runs_previous_and_draws_a_line_per_run() -> None:
    def of(label: str, step: int, outcomes: str, run: str) -> CheckpointRows:
        return CheckpointRows(f"{run}/{label}", step, _rows_of({"push": outcomes}), run)

    table = compare_checkpoints(
        [
            of("100", 100, "SSFF", "zeta"),
            of("200", 200, "SSSF", "zeta"),
            of("100", 100, "FFFF", "alpha"),
            of("200", 200, "SFFF", "alpha"),
        ]
    )
    first_of_alpha = _find(table, "alpha/100", ALL_TASKS)
    assert first_of_alpha.run == "alpha"
    assert first_of_alpha.versus_previous == NO_COMPARISON, "zeta/200 is another run's checkpoint"
    assert _find(table, "alpha/200", ALL_TASKS).versus_previous.pairs == 4
    assert SweepComparison.from_json(table.to_json()) == table
    document = json.loads(table.to_json())
    for row in document["rows"]:
        del row["run"]  # a table written before runs were recorded still reads
    assert SweepComparison.from_json(json.dumps(document)).rows[0].run is None
    axis = table.figure().axes[0]
    assert axis.get_legend_handles_labels()[1] == ["run zeta", "run alpha"]
    assert [tick.get_text() for tick in axis.get_xticklabels()] == ["100", "200"]
    assert [list(line.get_xdata()) for line in axis.get_lines()] == [[100.0, 200.0], [100.0, 200.0]]


def test_a_numbered_checkpoint_is_never_compared_with_one_of_no_step_listed_before_it() -> None:
    """``best.pt`` and ``final.pt`` beside ``step_*.pt`` come first in the table; before, the first numbered
    checkpoint's ``vs previous`` was ``final``, a checkpoint from the end of training."""
    table = compare_checkpoints(
        [
            CheckpointRows("best", None, _rows_of({"push": "SSSS"})),
            CheckpointRows("final", None, _rows_of({"push": "SSSF"})),
            CheckpointRows("step_100", 100, _rows_of({"push": "FFFF"})),
            CheckpointRows("step_200", 200, _rows_of({"push": "SFFF"})),
        ]
    )
    assert _find(table, "step_100", ALL_TASKS).versus_previous == NO_COMPARISON
    assert _find(table, "step_200", ALL_TASKS).versus_previous.checkpoint == "step_100"
    assert _find(table, "final", ALL_TASKS).versus_previous == NO_COMPARISON, "nor one of no step with another"
    named = compare_checkpoints([CheckpointRows(label, None, _rows_of({"push": "SSFF"})) for label in ("a", "b")])
    assert _find(named, "b", ALL_TASKS).versus_previous.checkpoint == "a", "no step anywhere: the table's order"


def test_a_checkpoint_after_one_that_never_loaded_is_compared_with_the_last_one_that_answered() -> None:
    """Before, the checkpoint after one whose every episode errored (weights of another shape) was compared with it:
    its ``vs previous`` read "no paired episodes", and whether training helped since went unsaid."""
    from hud_pipelines.eval.report import ReportContext
    from hud_pipelines.eval.report_html.page import render_page

    broken = CheckpointRows("000200", 200, _rows_of({"push": "E" * EPISODES, "lift": "E" * EPISODES}))
    half_outcomes = {"push": _outcomes("000200", "push"), "lift": "E" * EPISODES}  # every lift episode errored
    half = CheckpointRows("000250", 250, _rows_of(half_outcomes))
    half_outcomes[ALL_TASKS] = half_outcomes["push"] + half_outcomes["lift"]
    table = compare_checkpoints([_checkpoint("000100"), broken, half, _checkpoint("000300")])
    for task in (*TASKS, ALL_TASKS):
        versus = _find(table, "000300", task).versus_previous
        against = "000100" if task == "lift" else "000250"  # 000250 answered push, not lift
        theirs = _outcomes_of("000100", task) if task == "lift" else half_outcomes[task]
        pairs, diff, p = _paired_reference(_outcomes_of("000300", task), theirs)
        assert (versus.checkpoint, versus.pairs, versus.diff) == (against, pairs, pytest.approx(diff)), task
        assert versus.p == pytest.approx(p)
        assert _find(table, "000250", task).versus_previous.checkpoint == "000100", "000200 answered nothing"
    assert _find(table, "000200", ALL_TASKS).versus_previous.outcome == "no paired episodes", "not a direction"
    lines = {line.split(" | ")[0] + " | " + line.split(" | ")[2]: line for line in table.markdown().splitlines()[2:-2]}
    assert lines["| 000200 | push"].endswith("| no paired episodes |"), "the row above: not named"
    assert " pairs with 000100" in lines["| 000300 | lift"], "an earlier one than the row above: named"
    assert " pairs with 000100" in lines["| 000250 | push"]
    assert "pairs with" not in lines["| 000300 | push"], "000250, the row above, answered push"
    assert "pairs with" not in lines["| 000100 | push"] + lines["| 000200 | push"]
    single = compare_checkpoints([_checkpoint("000100"), broken, _checkpoint("000300")])
    said = _find(single, "000300", ALL_TASKS).versus_previous
    assert said.checkpoint == "000100"
    assert said.pairs == _paired_reference(_all_outcomes("000300"), _all_outcomes("000100"))[0]
    assert (
        f"vs previous: {said.verdict} {said.diff:+.1%} (p={said.p:.3g}, {said.pairs} pairs with 000100"
        in (single.summary_lines()[0])
    )
    written = {(r["checkpoint"], r["task"]): r for r in csv.DictReader(io.StringIO(single.to_csv()))}
    assert written["000300", ALL_TASKS]["previous_checkpoint"] == "000100"
    assert written["000300", ALL_TASKS]["vs_previous"] == said.verdict.value
    assert SweepComparison.from_json(single.to_json()) == single
    document = json.loads(single.to_json())
    for row in document["rows"]:
        del row["previous_checkpoint"], row["baseline_checkpoint"]  # a table written before they were recorded
    assert SweepComparison.from_json(json.dumps(document)).rows[-1].versus_previous.checkpoint is None
    page = render_page("sweep", [], [], ReportContext(), sweep=single)
    assert f"{said.pairs} pairs with 000100" in page, "the page names it too"
    assert page.count(" pairs with ") == 1
    first_broken = compare_checkpoints([broken, _checkpoint("000300")])  # no earlier one answered: the one before
    assert _find(first_broken, "000300", ALL_TASKS).versus_previous.checkpoint == "000200"
    assert "| no paired episodes |" in first_broken.markdown()


def test_checkpoints_tied_for_the_best_are_named_together() -> None:
    """Before, three checkpoints at 7 of 12 read "000300 is the best": the latest of them, no better than the others."""
    same = _rows_of({"push": "SSSSSSSFFFFF"})
    tied = compare_checkpoints([("000100", 100, same), ("000200", 200, same), ("000300", 300, same)])
    assert tied.best == "000300", "the latest stands for them, as documented"
    assert tied.tied == ["000100", "000200", "000300"]
    assert tied.conclusion() == (
        "000100, 000200 and 000300 tie for the best; 000300 is taken (58.3%, 95% CI 32.0%-80.7%, n=12)."
    )
    assert tied.summary_lines()[1] == tied.conclusion()
    assert tied.markdown().endswith(tied.conclusion() + "\n")
    lower = _rows_of({"push": "SSSSSSFFFFFF"})
    two = compare_checkpoints([("000100", 100, same), ("000200", 200, lower), ("000300", 300, same)], baseline="000200")
    assert two.tied == ["000100", "000300"]
    assert two.conclusion().startswith(
        "000100 and 000300 tie for the best; 000300 is taken (58.3%, 95% CI 32.0%-80.7%, n=12); vs baseline 000200: "
        "no detectable difference"
    ), two.conclusion()
    alone = compare_checkpoints([("000100", 100, lower), ("000200", 200, same)])
    assert alone.tied == ["000200"]
    assert alone.conclusion() == "000200 is the best (58.3%, 95% CI 32.0%-80.7%, n=12)."
    assert compare_checkpoints([("x", 1, _rows_of({"push": "EE"}))]).tied == []


def test_instances_completed_names_a_checkpoint_that_cannot_load_only_where_others_did() -> None:
    """A setup fault of every checkpoint is the pipeline's (a grader that cannot be built), not the checkpoints':
    before, the hint said to delete each one's files from the training run."""
    from hud_pipelines.errors import Fault
    from hud_pipelines.eval.sweep import completed

    def of(label: str, outcomes: str) -> list[GradeRow]:
        rows = _rows_of({"push": outcomes})
        faulted = [
            dataclasses.replace(r, fault=Fault.SETUP, error="cannot load") if r.status.value == "errored" else r
            for r in rows
        ]
        return [dataclasses.replace(r, checkpoint=label, group_id=f"{label}|{r.group_id}") for r in faulted]

    command = ["hud-pipelines", "run", "sweep"]
    one = completed([*of("000100", "SFSF"), *of("000200", "EEEE")], command)
    assert not one.passed
    assert "checkpoint(s) 000200 could not be loaded where others were" in one.description
    assert one.description.index("could not be loaded") < one.description.index("; re-run them with: ")
    every = completed([*of("000100", "EEEE"), *of("000200", "EEEE")], command)
    assert not every.passed
    assert "could not be loaded" not in every.description


def test_a_comparison_that_episodes_errored_on_one_side_only_could_make_worse_says_it_is_undecided() -> None:
    """Before, the cell said "no detectable difference +0.0% (p=1, 4 pairs)" where ``no_regression`` on the same
    two checkpoints failed as undecided: errors are not failures, nor do they carry a pass."""
    steady, erring = _rows_of({"push": "S" * 10}), _rows_of({"push": "SSSS" + "E" * 6})
    table = compare_checkpoints([("a", 100, steady), ("b", 200, erring)], baseline="a")
    versus = _find(table, "b", "push").versus_previous
    assert (versus.verdict, versus.pairs, versus.undecided_by_errors) == (Verdict.NO_DIFFERENCE, 4, 6)
    assert _find(table, "b", ALL_TASKS).versus_baseline.undecided_by_errors == 6
    assert "undecided: 6 errored on one side only would make it worse" in table.markdown()
    from hud_pipelines.eval.report_html.page import _checkpoints  # pyright: ignore[reportPrivateUsage]

    assert "undecided: 6 errored on one side only would make it worse" in _checkpoints(table, [], matrix=False)
    assert SweepComparison.from_json(table.to_json()) == table
    fine = compare_checkpoints([("a", 100, steady), ("b", 200, _rows_of({"push": "S" * 9 + "E"}))])
    assert _find(fine, "b", "push").versus_previous.undecided_by_errors is None, "one error could not decide it"
    older = json.loads(table.to_json())
    for row in older["rows"]:
        del row["previous_undecided_by_errors"], row["baseline_undecided_by_errors"]  # a table written before
    assert SweepComparison.from_json(json.dumps(older)).rows[1].versus_previous.undecided_by_errors is None
