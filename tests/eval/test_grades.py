"""Grades and their statistics: denominators, Wilson intervals, graders, checks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from hud_pipelines.errors import Fault, GraderError
from hud_pipelines.eval import sweep
from hud_pipelines.eval.checks import answered_verdict, check_verdict, instances_verdict, rerun_command, verdicts
from hud_pipelines.eval.graders import build_graders, grader_text, score_bounds
from hud_pipelines.eval.grades import GradeRow, summarize, summarize_by_task, wilson_interval
from hud_pipelines.eval.report import figures_line, render_markdown
from hud_pipelines.eval.run_warnings import episode_errors_warning, success_signal_warning
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus
from hud_pipelines.spec.grading import (
    CallableGrader,
    CheckSpec,
    MaxErrorRateCheck,
    MinMeanScoreCheck,
    MinSuccessRateCheck,
    ReturnGrader,
    SuccessGrader,
)

KEY = EpisodeKey("job", 0, 0, 0, 0, 7)


def test_a_success_rate_check_on_some_instances_says_where_the_ones_not_run_could_take_it() -> None:
    """A run of some partitions is judged on what it ran (instances not run yet are no answer), and says so."""
    not_run = [dataclasses.replace(r, fault=Fault.NOT_RUN) for r in _rows(0, 0, 9)]
    gate = MinSuccessRateCheck(value=0.2)
    verdict = check_verdict(gate, _rows(2, 1) + not_run)
    assert verdict.passed
    assert verdict.description == (
        "min_success_rate: observed 66.7% (2/3), threshold 20.0%; 9 episode(s) not run with this configuration yet "
        "could change it (16.7% to 91.7% had they run): run every instance for the eval's verdict"
    )
    assert "not run" not in check_verdict(gate, _rows(3, 0) + not_run[:3]).description, "at least 50% either way"


def _row(status: EpisodeStatus, task: str = "t", reward: float = 1.0) -> GradeRow:
    return GradeRow(
        "p",
        task,
        0,
        0,
        "t-i0",
        0,
        0,
        status,
        float(status is EpisodeStatus.SUCCEEDED),
        status is EpisodeStatus.SUCCEEDED,
        reward,
        10,
    )


def test_wilson_interval_matches_the_textbook_and_stays_in_bounds() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)
    for successes, trials in [(0, 1), (1, 1), (3, 7), (50, 100)]:
        low, high = wilson_interval(successes, trials)
        assert 0.0 <= low <= successes / trials <= high <= 1.0
        mirrored = wilson_interval(trials - successes, trials)
        assert mirrored == pytest.approx((1 - high, 1 - low))
    assert (
        wilson_interval(50, 100)[1] - wilson_interval(50, 100)[0]
        < wilson_interval(5, 10)[1] - wilson_interval(5, 10)[0]
    )
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_errors_are_reported_beside_the_rate_never_as_failures() -> None:
    rows = (
        [_row(EpisodeStatus.SUCCEEDED)] * 3
        + [_row(EpisodeStatus.FAILED)]
        + [_row(EpisodeStatus.ERRORED, reward=-99)] * 2
    )
    summary = summarize(rows)
    assert summary.scheduled == 6 == summary.succeeded + summary.failed + summary.errored
    assert summary.success_rate == pytest.approx(3 / 4)
    assert summary.error_rate == pytest.approx(2 / 6)
    assert summary.mean_return == pytest.approx(1.0)  # errored returns are left out
    by_task = summarize_by_task([*rows, _row(EpisodeStatus.FAILED, task="u")])
    assert by_task["u"].success_rate == 0.0
    assert by_task["t"].scheduled == 6
    assert summarize([_row(EpisodeStatus.ERRORED)]).success_rate is None


def test_the_errored_count_says_how_many_have_not_run_with_this_configuration_yet() -> None:
    """A task just added reads as ``errored 12 (error rate 50.0%)`` before its first run: it has not run."""
    from hud_pipelines.eval.report_html.summary import summary_section

    crashed = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.SIM_CRASHED)
    not_run = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.NOT_RUN)
    rows = [_row(EpisodeStatus.SUCCEEDED), crashed, not_run, not_run]
    assert (summarize(rows).errored, summarize(rows).not_run) == (3, 2)
    said = "errored 3 (2 of them not run with this configuration yet) (error rate 75.0%"
    assert said in render_markdown("p", rows)
    assert "errored <b>3</b> (2 of them not run with this configuration yet)\n" in summary_section(summarize(rows))
    assert "not run with" not in render_markdown("p", [_row(EpisodeStatus.SUCCEEDED), crashed])


def _rows(succeeded: int, failed: int, errored: int = 0, score: float | None = None) -> list[GradeRow]:
    rows = [_row(EpisodeStatus.SUCCEEDED)] * succeeded + [_row(EpisodeStatus.FAILED)] * failed
    rows += [_row(EpisodeStatus.ERRORED)] * errored
    return [dataclasses.replace(r, score=score) for r in rows] if score is not None else rows


def test_errored_episodes_that_could_turn_a_failure_or_decide_a_mean_score_say_so() -> None:
    """13 succeeded, 20 failed, 7 errored: at 0.4 the rate failed without a word of the 7 that could pass it
    (50.0% had they succeeded), and ``min_mean_score: 0.39`` of a success grader passed on 0.394 where it is
    0.325 had the errored ones scored 0, the verdict ``min_success_rate: 0.39`` refuses on the same numbers."""
    rows = _rows(13, 20) + [dataclasses.replace(r, fault=Fault.ENV) for r in _rows(0, 0, 7)]
    below = check_verdict(MinSuccessRateCheck(value=0.4), rows)
    assert not below.passed
    assert below.description.startswith(
        "min_success_rate: observed 39.4% (13/33), undecided: 7 errored episode(s) decide it (32.5% had they "
        "failed, 50.0% had they succeeded)"
    )
    success_scores = score_bounds(SuccessGrader())
    mean = check_verdict(MinMeanScoreCheck(value=0.39), rows, success_scores)
    assert not mean.passed
    assert mean.observed == 13 / 33, "the mean stays the answered episodes' one"
    assert "observed 0.3939, but undecided: 7 errored episode(s) decide it (0.325 had they scored 0, 0.5 had" in (
        mean.description
    )
    assert check_verdict(MinMeanScoreCheck(value=0.3), rows, success_scores).passed, "0.325 even had they scored 0"
    assert not check_verdict(MinMeanScoreCheck(value=0.6), rows, success_scores).passed, "0.5 at best: fails"
    returns = check_verdict(MinMeanScoreCheck(value=0.39), rows, score_bounds(ReturnGrader()))
    assert returns.passed, "a return can be anything: the mean of the answered episodes decides"
    assert returns.description.endswith("; 7 errored episode(s) left out of the mean")


def test_the_rate_comes_with_where_the_errored_episodes_could_have_moved_it() -> None:
    """A crash keeps the episodes that ended (often the short, successful ones) and cuts the long ones: the
    rate over the answered episodes leans, so the figures say where it lies had the errored ones run."""
    rows = _rows(7, 7, errored=2)
    summary = summarize(rows)
    assert summary.error_bounds == (7 / 16, 9 / 16)
    said = "had the 2 errored episode(s) run: 43.8% (all failed) to 56.2% (all succeeded)"
    assert said in figures_line(rows)
    assert f"The rate leaves the errored episodes out; {said}." in render_markdown("p", rows)
    assert summarize(_rows(3, 1)).error_bounds is None
    assert "errored episode" not in figures_line(_rows(3, 1)) + render_markdown("p", _rows(3, 1))
    assert summarize(_rows(0, 0, errored=3)).error_bounds == (0.0, 1.0), "nothing answered: anything goes"


def test_checks_pass_and_fail_on_their_figure() -> None:
    def verdict(check: CheckSpec, rows: list[GradeRow]) -> tuple[bool, float | None]:
        result = check_verdict(check, rows)
        return result.passed, result.observed

    assert verdict(MinSuccessRateCheck(value=0.75), _rows(3, 1)) == (True, 0.75)
    assert verdict(MinSuccessRateCheck(value=0.75), _rows(74, 26))[0] is False
    assert verdict(MinSuccessRateCheck(value=0.0), _rows(0, 0, 1)) == (False, None)  # nothing graded
    assert verdict(MaxErrorRateCheck(value=0.1), _rows(4, 0, 1)) == (False, 0.2)
    assert verdict(MinMeanScoreCheck(value=100.0), _rows(1, 0, score=150.0)) == (True, 150.0)


def test_a_checks_description_gives_its_figure_as_people_read_it_with_its_denominator() -> None:
    def said(check: CheckSpec, rows: list[GradeRow]) -> str:
        return check_verdict(check, rows).description

    assert said(MaxErrorRateCheck(value=0.0), _rows(1, 0, 2)) == "max_error_rate: observed 66.7% (2/3), threshold 0.0%"
    not_run = [dataclasses.replace(r, fault=Fault.NOT_RUN) for r in _rows(0, 0, 3)]  # a run of some partitions
    assert check_verdict(MaxErrorRateCheck(value=0.0), _rows(2, 1) + not_run).passed
    assert said(MaxErrorRateCheck(value=0.0), _rows(1, 0, 2) + not_run) == (
        "max_error_rate: observed 66.7% (2/3), threshold 0.0%; 3 episode(s) not run with this configuration yet"
    )
    assert (
        said(MinSuccessRateCheck(value=0.7), _rows(2, 1)) == "min_success_rate: observed 66.7% (2/3), threshold 70.0%"
    )
    assert said(MinSuccessRateCheck(value=0.5), _rows(0, 0, 1)).endswith(
        "observed n/a (no graded episode), threshold 50.0%"
    )
    assert said(MinMeanScoreCheck(value=100.0), _rows(2, 1, score=1 / 3)) == (
        "min_mean_score: observed 0.3333, threshold 100"
    )


def test_the_instances_check_fails_on_instance_faults_only() -> None:
    slot_fault = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.ENV, group_id="t-i0")
    not_run = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.NOT_RUN, group_id="t-i1")
    crashed = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.SIM_CRASHED, group_id="t-i2", error="x")
    assert instances_verdict([slot_fault, not_run, _row(EpisodeStatus.SUCCEEDED)]).passed
    failing = instances_verdict([slot_fault, crashed, crashed])
    assert not failing.passed
    assert failing.failed_instances == ("t-i2",)
    assert "sim_crashed" in failing.description
    assert failing.description.endswith("re-run them with: hud-pipelines run p --partition t-i2")
    assert "first" not in failing.description, "a crash may pass when run again"
    misfit = dataclasses.replace(crashed, fault=Fault.CONTRACT, group_id="t-i3", error="fix contracts/c.json")
    said = instances_verdict([crashed, misfit]).description
    assert "; fix what the contract error says first; re-run them with: hud-pipelines run p --partition t-i2" in said


def test_failed_instances_with_others_between_them_get_a_command_per_contiguous_range() -> None:
    rows = [
        dataclasses.replace(_row(status), group_id=f"t-i{i}", fault=fault, error="x" if fault else None)
        for i, (status, fault) in enumerate(
            [(EpisodeStatus.ERRORED, Fault.SIM_CRASHED), (EpisodeStatus.SUCCEEDED, None)]
            + [(EpisodeStatus.ERRORED, Fault.SIM_HUNG)] * 2
        )
    ]
    described = instances_verdict(rows).description
    assert described.endswith(
        "re-run them with: hud-pipelines run p --partition t-i0; hud-pipelines run p --partition t-i2 --partition t-i3"
    ), "one run takes a contiguous range of partitions"
    assert rerun_command(["a|i1"], ["hud-pipelines", "run", "my sweep.yaml"]) == (
        "hud-pipelines run 'my sweep.yaml' --partition 'a|i1'"
    ), "quoted for a shell"


def test_a_sweep_with_no_checkpoint_evaluated_has_no_answer_and_says_so() -> None:
    verdict = sweep.answered([])
    assert not verdict.passed
    assert verdict.description == "no checkpoint of the sweep has been evaluated yet"


def test_the_answered_check_fails_only_when_no_episode_succeeded_or_failed() -> None:
    policy = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.POLICY, error="policy failed: boom")
    hung = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.SIM_HUNG, error="the sim hung")
    one_failure = answered_verdict([policy, hung, _row(EpisodeStatus.FAILED)])
    assert one_failure.passed
    assert one_failure.observed == 1.0
    assert one_failure.description.startswith("1 of 3 episode(s) produced an answer")
    nothing = answered_verdict([policy, policy, hung])
    assert not nothing.passed
    assert nothing.blocking
    assert nothing.description == (
        "no episode produced an answer: 3 scheduled, 3 errored (policy: 2, sim_hung: 1); "
        "the first error: policy failed: boom"
    )
    assert not answered_verdict([]).passed
    assert [v.name for v in verdicts([], [policy])] == ["instances_completed", "episodes_answered"]


def test_the_success_signal_warning_needs_a_grade_that_reads_the_signal_and_answers_without_one() -> None:
    silent = [dataclasses.replace(_row(EpisodeStatus.FAILED), success_reported=False) for _ in range(2)]
    errored = dataclasses.replace(_row(EpisodeStatus.ERRORED), success_reported=True)
    warned = success_signal_warning(SuccessGrader(), [*silent, errored])
    assert warned is not None
    assert "the success grader counts all 2 answered episode(s) as failed" in warned
    assert success_signal_warning(ReturnGrader(), silent) is not None, "a return grader without threshold reads it"
    assert success_signal_warning(ReturnGrader(threshold=5.0), silent) is None
    signalled = [*silent, dataclasses.replace(_row(EpisodeStatus.FAILED), success_reported=True)]
    assert success_signal_warning(SuccessGrader(), signalled) is None
    assert success_signal_warning(SuccessGrader(), [_row(EpisodeStatus.FAILED)]) is None, "unknown: no warning"

    other_task = [dataclasses.replace(row, task="nosig") for row in silent]  # a benchmark env of its own keys
    mixed = success_signal_warning(SuccessGrader(), [*other_task, *signalled])
    assert mixed is not None, "a task whose episodes never report success reads 0 % unexplained"
    assert mixed.startswith("no episode of task(s) nosig (2) reported a success signal (info['is_success']")
    assert "where other tasks' did: the success grader counts those answered episodes as failed" in mixed


def test_the_success_signal_warning_tells_a_return_grader_to_add_its_threshold() -> None:
    """Before, a grader already ``{kind: return}`` was told to grade on the return, as if it did not."""
    silent = [dataclasses.replace(_row(EpisodeStatus.FAILED), success_reported=False) for _ in range(2)]
    warned = success_signal_warning(ReturnGrader(), silent) or ""
    assert warned.endswith(
        "report success in the env's info, or give the return grader a threshold the return must reach to succeed "
        "(graders: [{kind: return, threshold: ...}])"
    ), warned
    assert "or grade on the return" not in warned
    advised = success_signal_warning(SuccessGrader(), silent) or ""
    assert advised.endswith("or grade on the return (graders: [{kind: return, threshold: ...}])"), advised


def test_a_callable_grader_is_warned_of_only_where_it_left_success_to_a_signal_that_never_came() -> None:
    """A function returning a score on an env without a success signal read 0 % unexplained; one returning its
    own ``False`` must not be warned of (its failures are verdicts)."""
    grader = CallableGrader(name="dist", target="graders:distance")
    silent = [_row(EpisodeStatus.FAILED) for _ in range(3)]
    scored = [dataclasses.replace(row, success_reported=False, success_by_signal=True) for row in silent]
    warned = success_signal_warning(grader, scored) or ""
    assert warned.startswith("no episode reported a success signal (info['is_success']"), warned
    assert "the dist grader counts all 3 answered episode(s) it left to that signal as failed" in warned
    assert warned.endswith("or have graders:distance return it too ({'score': ..., 'success': ...})"), warned
    judged = [dataclasses.replace(row, success_by_signal=False) for row in scored]
    assert success_signal_warning(grader, judged) is None, "the grader's own verdicts"
    assert success_signal_warning(SuccessGrader(), judged[:1] + scored[1:]) is not None
    earlier = [dataclasses.replace(row, success_reported=False) for row in silent]  # written before the record
    assert success_signal_warning(grader, earlier) is None
    assert success_signal_warning(SuccessGrader(), earlier) is not None, "goes by the grader's kind"


def test_episodes_that_errored_on_their_own_are_warned_of_unless_a_check_reads_errors() -> None:
    def errored(fault: Fault, error: str) -> GradeRow:
        return dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=fault, error=error)

    rows = [_row(EpisodeStatus.FAILED), errored(Fault.POLICY, "policy failed: boom"), errored(Fault.ENV, "env: x")]
    not_run = errored(Fault.NOT_RUN, "not run with this configuration")
    warned = episode_errors_warning([], [*rows, errored(Fault.POLICY, "again"), not_run])
    assert warned is not None
    assert warned.startswith(  # its figures add up to the 5 scheduled the summary counts
        "3 of 4 episode(s) errored, besides 1 not run with this configuration yet (policy 2, env 1; the first: "
        "policy failed: boom)"
    )
    assert episode_errors_warning([MaxErrorRateCheck(value=0.5)], rows) is None, "the check decides on them"
    assert episode_errors_warning([MinSuccessRateCheck(value=0.5)], rows) is not None
    crashed = errored(Fault.SIM_CRASHED, "the sim died")  # instances_completed fails on it already
    assert episode_errors_warning([], [_row(EpisodeStatus.FAILED), crashed, not_run]) is None

    # a matrix: its checks judge the control tasks, so a perturbation's errors are said even with the check
    arm = [dataclasses.replace(row, task="t/scale=abc") for row in rows]
    bounded = [MaxErrorRateCheck(value=0.0)]
    assert episode_errors_warning(bounded, [*rows, *arm], controls={rows[0].task}) == (
        "2 of 3 episode(s) errored (policy 1, env 1; the first: policy failed: boom) in perturbation tasks: the "
        "max_error_rate check judges the control tasks only; each perturbation's errors are in the report's "
        "perturbations table"
    )
    assert episode_errors_warning(bounded, rows, controls={rows[0].task}) is None, "only the controls errored"
    unbounded = episode_errors_warning([], rows, controls={rows[0].task})
    assert unbounded is not None
    assert unbounded.endswith("to fail the run when an episode of the control tasks errors")


def test_the_episode_errors_warning_counts_every_errored_episode_those_of_failed_instances_too() -> None:
    """Before, a sweep whose checkpoint never loaded (32 episodes of fault setup) and with 2 env errors said
    "2 of 64 episode(s) errored (env 2; ...)": the episodes of failed instances were left out of the count."""

    def errored(fault: Fault, error: str) -> GradeRow:
        return dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=fault, error=error)

    never_loaded = [errored(Fault.SETUP, "cannot load the checkpoint: size mismatch")] * 32
    rows = [*never_loaded, *[_row(EpisodeStatus.SUCCEEDED)] * 30, *[errored(Fault.ENV, "env: x")] * 2]
    warned = episode_errors_warning([], [*rows, errored(Fault.NOT_RUN, "not run with this configuration")])
    assert warned is not None
    assert warned.startswith(
        "34 of 64 episode(s) errored, besides 1 not run with this configuration yet (setup 32, "
    ), warned
    assert episode_errors_warning([], [*never_loaded, _row(EpisodeStatus.FAILED)]) is None, "instances_completed fails"


def test_the_episode_errors_warning_of_a_sweep_names_whose_episodes_it_counts() -> None:
    """The run's summary counted every checkpoint's ("4 of 40"), its report the candidate's ("4 of 20"), in the same
    words: neither said which."""
    rows = [dataclasses.replace(_row(EpisodeStatus.FAILED), checkpoint=label) for label in ("s100", "s200")]
    broken = dataclasses.replace(_row(EpisodeStatus.ERRORED), checkpoint="s200", fault=Fault.ENV, error="env: x")
    both = episode_errors_warning([], [*rows, broken]) or ""
    assert both.startswith("1 of 3 episode(s) of 2 checkpoints errored (env 1; "), both
    candidate = episode_errors_warning([], [rows[1], broken]) or ""
    assert candidate.startswith("1 of 2 episode(s) of checkpoint s200 errored (env 1; "), candidate


def _outcome(success: bool, reward: float, status: EpisodeStatus | None = None) -> EpisodeOutcome:
    status = status or (EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED)
    return EpisodeOutcome(status=status, score=float(success), success=success, total_reward=reward, steps=5)


def test_graders_read_success_return_and_callables(tmp_path: Path) -> None:
    module = tmp_path / "grade.py"
    module.write_text(
        "def by_steps(episode):\n"
        "    return {'score': episode['steps'] * 2.0, 'success': episode['seed'] == 7}\n"
        "def flag(episode):\n    return episode['total_reward'] > 3\n"
        "def broken(episode):\n    return 'yes'\n"
        "import numpy as np\n"
        "def numpy_flag(episode):\n    return np.float64(episode['steps']) > 2\n"
        "def numpy_score(episode):\n    return np.float32(episode['total_reward'])\n"
        "def as_text(episode):\n    return {'score': 1.0, 'success': 'False'}\n"
        "def no_score(episode):\n    return {'score': None, 'success': True}\n"
        "def half(episode):\n    return {'score': 1, 'success': 0.5}\n"
        "import sys\n"
        "def exits(episode):\n    sys.exit(3)\n"
    )
    numpy_flag, numpy_score = build_graders(
        [CallableGrader(name=n, target=f"{module}:{n}") for n in ("numpy_flag", "numpy_score")], base_dir=tmp_path
    )
    flagged = numpy_flag.grade(_outcome(False, 3.5), KEY)
    assert flagged == (1.0, True, False), "a numpy comparison's bool is a success, the grader's own say"
    assert type(flagged[1]) is bool
    assert numpy_score.grade(_outcome(True, 3.5), KEY) == (3.5, True, True), "a float is a score, success the env's"
    success, returns, threshold, by_steps, flag, broken = build_graders(
        [
            SuccessGrader(name="success"),
            ReturnGrader(name="ret"),
            ReturnGrader(name="thr", threshold=4.0),
            CallableGrader(name="steps", target=f"{module}:by_steps"),
            CallableGrader(name="flag", target=f"{module}:flag"),
            CallableGrader(name="broken", target=f"{module}:broken"),
        ],
        base_dir=tmp_path,
    )
    outcome = _outcome(False, 3.5)
    assert success.grade(outcome, KEY) == (0.0, False, True)
    assert returns.grade(outcome, KEY) == (3.5, False, True)  # no threshold: the env's signal decides
    assert threshold.grade(outcome, KEY) == (3.5, False, False)
    assert threshold.grade(_outcome(False, 4.0), KEY).success
    assert not threshold.grade(_outcome(False, 3.9999), KEY).success

    assert by_steps.grade(outcome, KEY) == (10.0, True, False)
    assert flag.grade(outcome, KEY) == (1.0, True, False)
    with pytest.raises(GraderError, match=r"broken.*returned 'yes'"):
        broken.grade(outcome, KEY)
    (exits,) = build_graders([CallableGrader(name="exits", target=f"{module}:exits")], base_dir=tmp_path)
    with pytest.raises(GraderError, match=r"grader 'exits' .* raised SystemExit: 3"):  # not the run's interrupt
        exits.grade(outcome, KEY)
    assert math.isfinite(returns.grade(_outcome(True, -1.0), KEY)[0])
    loose = [CallableGrader(name=n, target=f"{module}:{n}") for n in ("as_text", "no_score", "half")]
    for grader in build_graders(loose, base_dir=tmp_path):  # "False" was a success, a None score a bare TypeError
        with pytest.raises(GraderError, match=r"'score' \(a number\) and 'success' \(a bool\)"):
            grader.grade(outcome, KEY)


def test_the_report_says_in_words_what_the_deciding_grader_counts_as_success() -> None:
    assert grader_text(SuccessGrader()) == "success: the env's success signal at any step of the episode"
    assert grader_text(SuccessGrader(name="held", at="end")) == (
        "held (a success grader): the env's success signal on the episode's last step"
    )
    assert grader_text(ReturnGrader(threshold=195)) == "return: score the return, success a return of at least 195"
    assert grader_text(ReturnGrader()) == "return: score the return, success the env's signal at any step"
    assert grader_text(CallableGrader(name="mine", target="g.py:f")) == "mine (a callable grader): the function g.py:f"


def test_an_errored_episode_has_no_score_in_the_files_a_reader_averages() -> None:
    import csv
    import io
    import json

    from hud_pipelines.eval.grade_table import grades_csv
    from hud_pipelines.spec.loader import load_pipeline_text

    stacks = 'the sim did not answer within 5 s\nThread 0x7f (most recent call first):\n  File "env.py", line 9'
    errored = dataclasses.replace(_row(EpisodeStatus.ERRORED), fault=Fault.SIM_HUNG, error=stacks)
    failed = _row(EpisodeStatus.FAILED)
    stored = json.loads(json.dumps([errored.as_dict(), failed.as_dict()]))  # grades.json
    assert [row["score"] for row in stored] == [None, 0.0], "an error is not a failure: no 0 to average in"
    assert [row["success"] for row in stored] == [None, False], "nor a false to count as a failure"
    assert [GradeRow.from_dict(row) for row in stored] == [errored, failed]
    spec = load_pipeline_text(
        '{"name": "p", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": {"kind": "random"}}}'
    )
    table = list(csv.DictReader(io.StringIO(grades_csv(spec, [errored, failed]))))
    assert [line["score"] for line in table] == ["", "0.0"]
    assert [line["success"] for line in table] == ["", "False"], "nor a false to count as a failure"
    assert [line["error"] for line in table] == ["the sim did not answer within 5 s [more in grades.json]", ""]
    assert stored[0]["error"] == stacks, "grades.json keeps all of it"
    assert summarize([errored, failed]).mean_score == 0.0, "the mean counts the answered episode alone"


def test_errored_episodes_that_could_decide_a_success_rate_check_fail_it_as_undecided() -> None:
    policy_errors = [dataclasses.replace(r, fault=Fault.POLICY) for r in _rows(0, 0, 10)]
    gate = MinSuccessRateCheck(value=0.8)
    diverged = check_verdict(gate, _rows(2, 0) + policy_errors)  # 100% of the 2 answered; 10 errored
    assert not diverged.passed, "2 answers of 12 episodes cannot carry a pass"
    assert diverged.observed == 1.0, "the rate stays the answered episodes' one: errors are not failures"
    assert "undecided: 10 errored episode(s) decide it (16.7% had they failed, 100.0% had they succeeded)" in (
        diverged.description
    )
    assert check_verdict(gate, _rows(95, 4) + policy_errors[:1]).passed, "95% even had the one errored failed"
    assert not check_verdict(gate, _rows(1, 9) + policy_errors).passed
    assert "undecided" not in check_verdict(gate, _rows(1, 9) + policy_errors).description, "fails either way"
    not_run = [dataclasses.replace(r, fault=Fault.NOT_RUN) for r in _rows(0, 0, 10)]
    assert check_verdict(gate, _rows(2, 0) + not_run).passed, "instances not run yet are no answer of this eval's"


def test_a_return_that_reaches_the_threshold_on_paper_reaches_it_whatever_the_sums_last_bit() -> None:
    """Ten rewards of 0.1 summed step by step are 0.9999999999999999: the episode failed a threshold of 1."""
    total = 0.0
    for _ in range(10):
        total += 0.1
    assert total < 1.0
    (grader,) = build_graders([ReturnGrader(name="thr", threshold=1.0)], base_dir=Path())
    assert grader.grade(_outcome(False, total), KEY) == (total, True, False)
    assert not grader.grade(_outcome(False, 1.0 - 1e-6), KEY).success, "a return short of it still fails"
    (large,) = build_graders([ReturnGrader(name="thr", threshold=-500.0)], base_dir=Path())
    assert large.grade(_outcome(False, -500.0000000001), KEY).success
    assert not large.grade(_outcome(False, -500.001), KEY).success


def test_instances_another_run_wrote_over_at_the_same_time_are_said_to_the_run_that_completed_them() -> None:
    """Two runs of the same instances at once: the earlier one's summary counted the later one's rows as "from
    earlier runs", and nothing told it that its own results had been written over."""
    from hud_pipelines.eval.run_warnings import rewritten_warning

    def row(instance: int, run_id: str, checkpoint: str | None = None) -> GradeRow:
        plain = dataclasses.replace(_row(EpisodeStatus.FAILED), instance=instance, group_id=f"t-i{instance}")
        return dataclasses.replace(plain, run_id=run_id, checkpoint=checkpoint)

    rows = [row(0, "mine"), row(1, "later"), row(1, "later"), row(2, "earlier"), row(3, "later", checkpoint="000500")]
    warned = rewritten_warning(rows, ["t-i0", "t-i1", "t-i3"], "mine")
    assert warned == (
        "1 instance(s) this run completed were written over by a run of them at the same time (t-i1 by run later): "
        "the figures over all rows count that run's results for them (as not run, where it ran another configuration)"
    ), "t-i2 was not this run's to complete; a sweep's rows name no key of the results"
    assert rewritten_warning(rows, ["t-i2"], "earlier") is None, "what it completed holds its own results"
