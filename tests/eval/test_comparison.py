"""Paired comparison statistics, checked against scipy on constructed data, and the ``compare`` command."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.comparison import Verdict, compare, describe, pair_rows
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.paired_tests import (
    EXACT_FLIPS_UP_TO,
    clopper_pearson,
    mcnemar_exact,
    mcnemar_sample_size,
    paired_difference_interval,
    sign_flip_test,
)
from hud_pipelines.recording.events import EpisodeStatus

FOLDER_NOTE = (
    "give its pipeline's name to judge it against the code, weights and configuration as they are now, as `report` does"
)


def _row(slot: int, success: bool, *, score: float | None = None, errored: bool = False, task: str = "t") -> GradeRow:
    status = EpisodeStatus.ERRORED if errored else EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED
    value = float(success) if score is None else score
    return GradeRow("p", task, 0, 0, "t-i0", slot, slot, status, value, success and not errored, value, 10)


def _sets(outcomes: list[tuple[bool, bool]]) -> tuple[list[GradeRow], list[GradeRow]]:
    candidate = [_row(i, a) for i, (a, _) in enumerate(outcomes)]
    baseline = [_row(i, b) for i, (_, b) in enumerate(outcomes)]
    return candidate, baseline


@pytest.mark.parametrize(("only_candidate", "only_baseline"), [(0, 0), (1, 0), (7, 2), (2, 9), (15, 3), (40, 41)])
def test_mcnemar_exact_is_scipys_two_sided_binomial_test(only_candidate: int, only_baseline: int) -> None:
    expected = (
        1.0
        if only_candidate + only_baseline == 0
        else stats.binomtest(only_candidate, only_candidate + only_baseline, 0.5).pvalue
    )
    assert mcnemar_exact(only_candidate, only_baseline) == pytest.approx(expected, rel=1e-12)


def test_a_clear_gain_is_better_a_clear_loss_worse_and_a_small_sample_undecided() -> None:
    gain = [(True, True)] * 10 + [(True, False)] * 12 + [(False, False)] * 8
    better = compare(*_sets(gain))
    assert better.verdict is Verdict.BETTER
    assert (better.pairs, better.only_candidate, better.only_baseline) == (30, 12, 0)
    assert better.success_difference == pytest.approx(12 / 30)
    assert better.mcnemar_p == pytest.approx(stats.binomtest(12, 12, 0.5).pvalue)
    assert better.success_interval is not None
    low, high = better.success_interval
    assert 0 < low < 12 / 30 < high <= 1

    loss = [(b, a) for a, b in gain]
    assert compare(*_sets(loss)).verdict is Verdict.WORSE

    small = compare(*_sets([(True, False), (True, False), (False, True), (True, True)]))
    assert small.verdict is Verdict.NO_DIFFERENCE
    assert small.episodes_needed is not None
    assert small.episodes_needed > small.pairs, "it says how many episodes an answer would take"


@pytest.mark.parametrize(("successes", "trials"), [(0, 8), (8, 8), (3, 10), (50, 200), (4000, 10000)])
def test_the_exact_binomial_interval_is_scipys_clopper_pearson(successes: int, trials: int) -> None:
    expected = stats.binomtest(successes, trials).proportion_ci(0.95, method="exact")
    low, high = clopper_pearson(successes, trials, 0.05)
    assert low == pytest.approx(expected.low, abs=1e-9)
    assert high == pytest.approx(expected.high, abs=1e-9)


def test_the_success_difference_interval_excludes_zero_exactly_when_mcnemar_finds_a_difference() -> None:
    few = compare(*_sets([(True, True)] * 4 + [(True, False)] * 4))  # 8/8 against 4/8: p = 0.125
    assert few.verdict is Verdict.NO_DIFFERENCE
    assert few.success_interval is not None
    low, high = few.success_interval
    assert low < 0 < few.success_difference < high, "no detectable difference: the interval holds zero"
    for pairs in range(1, 17):
        for won in range(pairs + 1):
            for lost in range(pairs - won + 1):
                low, high = paired_difference_interval(won, lost, pairs, 0.05)
                assert low <= (won - lost) / pairs <= high
                assert (low > 0 or high < 0) == (mcnemar_exact(won, lost) <= 0.05), (pairs, won, lost)
                if won + lost < pairs:  # one more pair lost never raises the upper bound, one more won the lower
                    assert paired_difference_interval(won, lost + 1, pairs, 0.05)[1] <= high, (pairs, won, lost)
                    assert paired_difference_interval(won + 1, lost, pairs, 0.05)[0] >= low, (pairs, won, lost)


@pytest.mark.parametrize("pairs", [16, 30])
def test_the_success_difference_interval_covers_the_true_difference_at_least_95_percent_of_the_time(
    pairs: int,
) -> None:
    """Exact coverage, summed over every outcome of ``pairs`` pairs, at shares where it is lowest (every pair
    discordant) and where the cap on each side's share of wins binds (one side never or rarely wins alone)."""
    outcomes = [(won, lost) for won in range(pairs + 1) for lost in range(pairs + 1 - won)]
    intervals = {outcome: paired_difference_interval(*outcome, pairs, 0.05) for outcome in outcomes}
    for won_share, lost_share in [(0.0, 0.0), (0.0, 0.05), (0.02, 0.1), (0.05, 0.3), (0.3, 0.3), (0.5, 0.5)]:
        difference = won_share - lost_share
        shares = [won_share, lost_share, 1 - won_share - lost_share]
        covered = sum(
            stats.multinomial.pmf([won, lost, pairs - won - lost], pairs, shares)
            for (won, lost), (low, high) in intervals.items()
            if low - 1e-12 <= difference <= high + 1e-12
        )
        assert covered >= 0.95, (pairs, won_share, lost_share, covered)


def test_the_sample_size_follows_connors_formula() -> None:
    z_alpha, z_power = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    for psi, effect in [(0.3, 0.1), (0.2, 0.15), (0.05, 0.1)]:
        used = max(psi, effect)
        expected = (z_alpha * math.sqrt(used) + z_power * math.sqrt(used - effect**2)) ** 2 / effect**2
        assert mcnemar_sample_size(psi, effect, 0.05) == math.ceil(expected)


def test_scores_are_compared_pair_by_pair_with_a_bootstrap_that_repeats_itself() -> None:
    candidate = [_row(i, True, score=10.0 + i + (i % 3)) for i in range(20)]
    baseline = [_row(i, True, score=10.0 + i) for i in range(20)]
    first, again = compare(candidate, baseline), compare(candidate, baseline)
    assert first == again
    assert first.score_difference == pytest.approx(sum(i % 3 for i in range(20)) / 20)
    assert first.score_interval is not None
    assert first.score_interval[0] > 0, "every pair improves or ties: the interval excludes zero"
    assert first.score_p is not None
    assert first.score_p < 0.05


def test_the_score_test_on_few_pairs_is_the_exact_sign_flip_test_and_gives_no_interval_it_cannot_back() -> None:
    for differences, p in [([2.31], 1.0), ([2.31, 3.42, 0.002], 0.25), ([2.31, 2.31], 0.5)]:
        candidate = [_row(i, True, score=10.0 + d) for i, d in enumerate(differences)]
        baseline = [_row(i, True, score=10.0) for i in range(len(differences))]
        result = compare(candidate, baseline)
        assert result.score_p == pytest.approx(p), differences  # a bootstrap said 0: no resample below zero
        assert result.score_interval is None, "every shift is kept at 95%: there is no interval to give"
        assert "too few pairs for a 95% interval, p = " in describe(result, "a", "b")


def test_the_score_test_of_few_changed_pairs_among_many_ties_is_exact_whatever_the_rows_order() -> None:
    """48 pairs of which 4 changed, the score a multiple of success: the sign-flip test is McNemar's exact test
    (p = 0.125), not a draw whose p-value moved with the order of the rows; its interval's bound is 0, not 1e-9."""
    rng = np.random.default_rng(0)
    won = {3, 17, 31, 41}  # odd: the baseline failed these
    candidate = [_row(i, i in won or i % 2 == 0, score=2.5 * (i in won or i % 2 == 0)) for i in range(48)]
    baseline = [_row(i, i % 2 == 0, score=2.5 * (i % 2 == 0)) for i in range(48)]
    results = [compare(list(rng.permutation(candidate)), list(rng.permutation(baseline))) for _ in range(3)]
    assert [result.mcnemar_p for result in results] == pytest.approx([0.125] * 3)
    assert [result.score_p for result in results] == pytest.approx([0.125] * 3)
    assert len({result.score_interval for result in results}) == 1
    interval = results[0].score_interval
    assert interval is not None
    assert interval[0] == 0.0 or interval[0] < -1e-6, interval


def test_a_p_value_equal_to_alpha_with_ties_is_alpha_to_the_last_bit_and_keeps_zero_in_the_interval() -> None:
    for zeros in (0, 4, 6, 11):  # five equal wins: p = 2 / 32 whatever the ties (summed in log space, an ulp off)
        p, interval = sign_flip_test(np.concatenate((np.ones(5), np.zeros(zeros))), 0.0625)
        assert p == 0.0625
        assert interval is None or interval[0] <= 0.0 <= interval[1], (zeros, interval)


@pytest.mark.parametrize("zeros", [0, 3, 10])
def test_the_score_test_with_ties_is_scipys_exact_permutation_test(zeros: int) -> None:
    differences = np.concatenate((np.random.default_rng(zeros).normal(0.7, 1.0, 6), np.zeros(zeros)))
    p, interval = sign_flip_test(differences, 0.05)
    reference = stats.permutation_test(
        (differences,), np.mean, permutation_type="samples", vectorized=True, n_resamples=np.inf
    ).pvalue
    assert p == pytest.approx(reference, abs=1e-12)
    if interval is not None:
        assert (interval[0] > 0 or interval[1] < 0) == (p < 0.05), (p, interval)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_score_test_agrees_with_scipys_permutation_test_and_its_interval_excludes_zero_exactly_when_p_does(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    for n in (8, 12, 14, 40):
        differences = rng.normal(0.6, 1.0, n)
        p, interval = sign_flip_test(differences, 0.05)
        reference = stats.permutation_test(
            (differences,),
            np.mean,
            permutation_type="samples",
            vectorized=True,
            n_resamples=100_000,
            rng=np.random.default_rng(0),
        ).pvalue
        assert p == pytest.approx(reference, abs=0.01 if n > EXACT_FLIPS_UP_TO else 1e-12), n
        assert interval is not None
        assert interval[0] < differences.mean() < interval[1]
        assert (interval[0] > 0 or interval[1] < 0) == (p < 0.05), (n, p, interval)


def test_a_score_that_is_the_success_gets_the_success_statistics_not_a_bootstrap_that_contradicts_them() -> None:
    candidate, baseline = _sets([(False, True)] * 4 + [(True, True)] * 2 + [(False, False)] * 2)
    result = compare(candidate, baseline)  # 8 pairs, 4 discordant all one way: McNemar p = 0.125
    assert result.verdict is Verdict.NO_DIFFERENCE
    assert result.score_difference == result.success_difference == -0.5
    assert (result.score_interval, result.score_p) == (result.success_interval, result.mcnemar_p)
    assert result.score_interval is not None
    assert result.score_interval[1] >= 0, "no detectable difference: the score's interval holds zero too"


def test_errored_and_unshared_episodes_are_left_out_and_counted() -> None:
    candidate = [_row(0, True), _row(1, True, errored=True), _row(2, False), _row(3, True)]
    baseline = [_row(0, False), _row(1, True), _row(2, False, errored=True)]
    pairs, left_out = pair_rows(candidate, baseline)
    assert [(a.slot, b.slot) for a, b in pairs] == [(0, 0)]
    assert left_out == 3  # slot 1 and 2 errored on one side, slot 3 only in the candidate
    assert compare(candidate, baseline).unpaired == 3


def test_hud_pipelines_compare_reads_two_grade_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hud_pipelines.cli.main import main

    candidate, baseline = _sets([(True, True)] * 10 + [(True, False)] * 12 + [(False, False)] * 8)
    (tmp_path / "a.json").write_text(json.dumps([r.as_dict() for r in candidate]))
    (tmp_path / "b.json").write_text(json.dumps([r.as_dict() for r in baseline]))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "better"
    assert report["pairs"] == 30
    assert main(["compare", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--fail-if-worse"]) == 1
    assert "worse" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--alpha", "0.01"]) == 0
    interval = paired_difference_interval(12, 0, 30, 0.01)
    assert f"(99% CI {interval[0]:+.1%} to {interval[1]:+.1%})" in capsys.readouterr().out, "the interval it prints"

    elsewhere = [dataclasses.replace(row, seed=row.seed + 100) for row in baseline]  # other seeds: no pair
    (tmp_path / "c.json").write_text(json.dumps([r.as_dict() for r in elsewhere]))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "c.json")]) == 0, "a comparison, not a gate"
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--fail-if-worse"]) == 1
    said = capsys.readouterr().err
    assert "no episode of" in said, "a gate never passes on no paired episode"
    assert "(same tasks and seeds?)" in said


def test_the_no_regression_check_fails_a_worse_candidate_and_passes_an_inconclusive_one(tmp_path: Path) -> None:
    from hud_pipelines.eval.checks import check_verdict
    from hud_pipelines.spec.grading import NoRegressionCheck

    strong, weak = _sets([(True, False)] * 14 + [(True, True)] * 6)
    (tmp_path / "strong.json").write_text(json.dumps([r.as_dict() for r in strong]))
    gate = NoRegressionCheck(baseline=str(tmp_path / "strong.json"), max_drop=0.05)
    worse = check_verdict(gate, weak)
    assert not worse.passed
    assert "worse than the baseline: success -70.0%" in worse.description
    assert check_verdict(gate, strong).passed

    few_strong, few_weak = _sets([(True, False), (True, True), (False, True), (True, False)])
    (tmp_path / "few.json").write_text(json.dumps([r.as_dict() for r in few_strong]))
    undecided = check_verdict(NoRegressionCheck(baseline=str(tmp_path / "few.json")), few_weak)
    assert undecided.passed
    assert "inconclusive" in undecided.description
    assert "more episodes needed" in undecided.description
    assert "not run" not in undecided.description
    even_strong, even_weak = _sets([(True, False)] * 10 + [(False, True)] * 10 + [(True, True)] * 380)
    (tmp_path / "even.json").write_text(json.dumps([r.as_dict() for r in even_strong]))
    answered = check_verdict(NoRegressionCheck(baseline=str(tmp_path / "even.json"), max_drop=0.05), even_weak)
    needed = compare(even_weak, even_strong, min_effect=0.05).episodes_needed
    assert needed is not None
    assert needed < 400, "the sample is large enough to see a 5% drop"
    assert answered.passed
    assert answered.description.startswith("no_regression: no drop detected: success +0.0%"), answered.description
    assert "enough to detect a 5% drop at 80% power" in answered.description
    assert "more episodes needed" not in answered.description, "never '0 more episodes needed'"
    assert "  no difference detected: about" in describe(compare(even_weak, even_strong, min_effect=0.05), "a", "b")
    assert "  inconclusive: about" in describe(compare(few_weak, few_strong, min_effect=0.05), "a", "b")
    unrun = [dataclasses.replace(row, status=EpisodeStatus.ERRORED, fault=Fault.NOT_RUN) for row in few_weak[:2]]
    partial = check_verdict(NoRegressionCheck(baseline=str(tmp_path / "few.json")), unrun + few_weak[2:])
    assert partial.passed, "judged on what ran, as a success-rate check is"
    assert partial.description.endswith("; 2 episode(s) not run with this configuration yet are left out")
    missing = check_verdict(NoRegressionCheck(baseline=str(tmp_path / "nothing.json")), weak)
    assert not missing.passed
    assert "the baseline cannot be read" in missing.description


def test_a_pipeline_gated_on_its_baseline_fails_the_run_when_it_regresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text
    from hud_pipelines.spec.models import PipelineSpec
    from tests.dagster.support import REPO

    monkeypatch.chdir(REPO)

    def spec(policy: dict[str, object], checks: list[dict[str, object]]) -> PipelineSpec:
        text = {
            "name": "gated",
            "sim": {"factory": "CartPole-v1", "num_envs": 4},
            "agent": {"policy": policy},
            "group": 4,
            "max_concurrent": 2,
            "max_steps": 60,
            "graders": [{"kind": "return", "threshold": 50}],
            "checks": checks,
        }
        return load_pipeline_text(json.dumps(text), source=tmp_path / "gated.yaml")

    pd = {"kind": "scripted", "target": "envs.controllers:CartPolePD"}
    baseline = evaluate(spec(pd, []), outputs_dir=tmp_path / "baseline", project_dir=REPO)
    assert baseline.summary.succeeded == 16
    gate = [{"kind": "no_regression", "baseline": "baseline/gated/grades.json"}]
    regressed = evaluate(spec({"kind": "constant"}, gate), outputs_dir=tmp_path / "candidate", project_dir=REPO)
    verdict = {c.name: c for c in regressed.checks}["no_regression"]
    assert not verdict.passed
    assert not regressed.passed
    assert "worse than the baseline" in verdict.description

    itself = [{"kind": "no_regression", "baseline": "candidate/gated/grades.json", "max_drop": 0.05}]
    judged = evaluate(spec({"kind": "constant"}, itself), outputs_dir=tmp_path / "candidate", project_dir=REPO)
    verdict = {c.name: c for c in judged.checks}["no_regression"]
    assert not verdict.passed, "before, the run was compared with the grades it had just written: it always passed"
    assert "the baseline is this pipeline's own grades.json" in verdict.description
    assert not judged.passed


def test_a_baseline_that_is_the_pipelines_own_results_is_refused_before_the_run_and_by_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main
    from hud_pipelines.cli.selection import refuse_misconfigured
    from hud_pipelines.errors import HudPipelinesError
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.spec.loader import load_pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HUD_PIPELINES_OUTPUTS", str(tmp_path / "outputs"))
    (tmp_path / "pipelines").mkdir()
    path = tmp_path / "pipelines" / "gated.yaml"
    for baseline in ("../outputs/gated/grades.json", "../outputs/gated", "../outputs/other/grades.json"):
        path.write_text(
            "name: gated\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: constant}}\n"
            f"checks:\n  - {{kind: no_regression, baseline: {baseline}}}\n"
        )
        spec = load_pipeline(path)
        outputs = EvalOutputs(tmp_path / "outputs", "gated")
        capsys.readouterr()
        if "other" in baseline:
            refuse_misconfigured(path, spec, outputs)
            assert main(["validate", "--no-deep", str(path)]) == 0, capsys.readouterr().out
            continue
        own = r"gated\.yaml:5:\d+: checks\[0\]\.baseline: the baseline is this pipeline's own"  # at its line
        with pytest.raises(HudPipelinesError, match=own):
            refuse_misconfigured(path, spec, outputs)
        assert main(["validate", "--no-deep", str(path)]) == 1
        said = capsys.readouterr().out
        assert "gated.yaml:5:" in said, said
        assert "checks[0].baseline: the baseline is this pipeline's own" in said


def test_a_sweeps_results_are_compared_one_checkpoint_at_a_time_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    good, bad = _sets([(True, False)] * 12)
    sweep = [dataclasses.replace(r, checkpoint="step_100") for r in good]
    sweep += [dataclasses.replace(r, checkpoint="step_200") for r in bad]  # the candidate: the table's last
    (tmp_path / "sweep.json").write_text(json.dumps([r.as_dict() for r in sweep]))
    (tmp_path / "run.json").write_text(json.dumps([r.as_dict() for r in good]))
    assert main(["compare", str(tmp_path / "sweep.json"), str(tmp_path / "run.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["candidate"] == f"{tmp_path / 'sweep.json'} (checkpoint step_200 of 2)"
    assert (report["pairs"], report["unpaired"], report["verdict"]) == (12, 0, "worse")
    chosen = ["--candidate-checkpoint", "step_100"]
    assert main(["compare", str(tmp_path / "sweep.json"), str(tmp_path / "run.json"), *chosen]) == 0
    assert "(checkpoint step_100 of 2) vs" in capsys.readouterr().out
    numbered = [dataclasses.replace(r, checkpoint=f"{500 * (1 + i // 12):06d}") for i, r in enumerate(sweep)]
    (tmp_path / "steps.json").write_text(json.dumps([r.as_dict() for r in numbered]))
    by_step = ["--candidate-checkpoint", "500"]  # a step number names the checkpoint numbered so
    assert main(["compare", str(tmp_path / "steps.json"), str(tmp_path / "run.json"), *by_step]) == 0
    assert "(checkpoint 000500 of 2) vs" in capsys.readouterr().out
    by_file_step = ["--candidate-checkpoint", "100"]  # a torch sweep's labels end in their step: step_100
    assert main(["compare", str(tmp_path / "sweep.json"), str(tmp_path / "run.json"), *by_file_step]) == 0
    assert "(checkpoint step_100 of 2) vs" in capsys.readouterr().out
    mistyped = ["--candidate-checkpoint", "step_10"]
    assert main(["compare", str(tmp_path / "sweep.json"), str(tmp_path / "run.json"), *mistyped]) != 0
    error = capsys.readouterr().err
    assert "has no checkpoint 'step_10' (did you mean 'step_100'?); its checkpoints: step_100, step_200" in error
    runs = [dataclasses.replace(r, checkpoint=f"r{1 + i // 12}/step_2") for i, r in enumerate(sweep)]
    (tmp_path / "runs.json").write_text(json.dumps([r.as_dict() for r in runs]))
    several = ["--candidate-checkpoint", "2"]  # each of two training runs has a step 2: the number names neither
    assert main(["compare", str(tmp_path / "runs.json"), str(tmp_path / "run.json"), *several]) != 0
    error = capsys.readouterr().err
    assert "has no checkpoint '2' ('2' is the step of several: r1/step_2, r2/step_2; give one's label)" in error
    with pytest.raises(HudPipelinesError, match="the baseline holds two rows of one episode"):
        compare(good, sweep)


def test_one_episode_pairs_up_whatever_num_envs_placed_it_in(tmp_path: Path) -> None:
    """Seeds 0-19 run as 5 instances of 4 slots and as 10 instances of 2: the same 20 episodes."""

    def ran(num_envs: int, success: Callable[[int], bool]) -> list[GradeRow]:
        return [
            dataclasses.replace(_row(seed % num_envs, success(seed)), instance=seed // num_envs, seed=seed)
            for seed in range(20)
        ]

    candidate = ran(2, lambda seed: seed < 3)
    baseline = ran(4, lambda seed: seed < 13)
    pairs, left_out = pair_rows(candidate, baseline)
    assert [(a.seed, b.seed) for a, b in pairs] == [(seed, seed) for seed in range(20)]
    assert left_out == 0
    result = compare(candidate, baseline)
    assert (result.pairs, result.only_baseline, result.verdict) == (20, 10, Verdict.WORSE)
    assert result.mcnemar_p == pytest.approx(stats.binomtest(0, 10, 0.5).pvalue)

    unseeded = [dataclasses.replace(row, seed=None) for row in candidate]  # without seeds: by instance and slot
    assert len(pair_rows(unseeded, [dataclasses.replace(row, seed=None) for row in candidate])[0]) == 20
    by_place, left_out = pair_rows(unseeded, [dataclasses.replace(row, seed=None) for row in baseline])
    assert (len(by_place), left_out) == (10, 20), "instances 0-4, slots 0-1 are in both; the other 10 + 10 are not"


def test_compare_refuses_a_level_outside_its_range_and_labels_the_level_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    candidate, baseline = _sets([(True, True)] * 10 + [(True, False)] * 12 + [(False, False)] * 8)
    (tmp_path / "a.json").write_text(json.dumps([r.as_dict() for r in candidate]))
    (tmp_path / "b.json").write_text(json.dumps([r.as_dict() for r in baseline]))
    files = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for flag, value in [("--alpha", "0"), ("--alpha", "1"), ("--alpha", "nan"), ("--min-effect", "0")]:
        with pytest.raises(SystemExit) as exited:
            main(["compare", *files, flag, value])
        assert exited.value.code == 2, "a usage error, not the exit 1 of a worse candidate"
        assert f"argument {flag}: must be" in capsys.readouterr().err
    for alpha, label in [("0.001", "99.9% CI"), ("0.025", "97.5% CI"), ("0.05", "95% CI")]:
        assert main(["compare", *files, "--alpha", alpha]) == 0
        assert f"({label} " in capsys.readouterr().out, alpha
    with pytest.raises(SystemExit) as exited:  # said with the top-level usage, which lists none of compare's options
        main(["compare", *files, "--alpah", "0.01"])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "hud-pipelines compare: error: unrecognized arguments: --alpah 0.01" in said, said
    assert "[--alpha ALPHA]" in said, "compare's own usage"


def test_compare_reads_a_pipeline_files_results_and_names_a_json_file_that_holds_no_grades(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    candidate, baseline = _sets([(True, False)] * 12 + [(False, False)] * 8)
    for name, rows in (("mine", candidate), ("theirs", baseline)):
        (tmp_path / "outputs" / name).mkdir(parents=True)
        (tmp_path / "outputs" / name / "grades.json").write_text(json.dumps([r.as_dict() for r in rows]))
    (tmp_path / "mine.yaml").write_text("name: mine\nsim: {factory: CartPole-v1}\n")
    outputs = ["--outputs", str(tmp_path / "outputs")]
    assert main(["compare", str(tmp_path / "mine.yaml"), "theirs", *outputs, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 20

    (tmp_path / "checks.json").write_text(json.dumps([{"name": "max_error_rate", "passed": True}]))
    assert main(["compare", str(tmp_path / "checks.json"), "theirs", *outputs]) == 2
    assert "checks.json: not a grades file (a row has no 'status' field)" in capsys.readouterr().err


def test_compare_notes_results_of_two_pipelines_and_never_says_a_p_of_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    candidate = [dataclasses.replace(_row(slot, True, score=25.0), pipeline="cart") for slot in range(20)]
    baseline = [_row(slot, slot < 5) for slot in range(20)]
    (tmp_path / "a.json").write_text(json.dumps([r.as_dict() for r in candidate]))
    (tmp_path / "b.json").write_text(json.dumps([r.as_dict() for r in baseline]))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out, err = capsys.readouterr()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert f"the two sides hold results of other pipelines (candidate {a}: cart; baseline {b}: p)" in err
    assert "their episodes pair up by task name and seed alone" in err
    assert "mean score difference" in out
    assert "(95% CI " in out.split("mean score difference")[1], "the score interval says its level"
    assert compare(candidate, baseline).score_p == pytest.approx(1 / 4001), "no drawn flip is as extreme: 1 / (B + 1)"
    assert "p = 0.00025)" in out
    assert "p = 0)" not in out


def test_compare_notes_sides_run_with_other_episode_lengths_or_graders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    candidate, baseline = _sets([(True, False)] * 12 + [(False, False)] * 8)
    graders = [{"name": "return", "kind": "return", "threshold": 475.0}]
    factories = {"a": "pipelines/myenv.py:make", "b": "/home/me/proj/pipelines/myenv.py:make"}  # one file, two ways
    for name, rows, max_steps, noise in (("a", candidate, 500, 0.3), ("b", baseline, 200, 0.05)):
        folder = tmp_path / name
        (folder / "rollouts").mkdir(parents=True)
        (folder / "grades.json").write_text(json.dumps([dataclasses.replace(r, run_id="run").as_dict() for r in rows]))
        provenance = {"max_steps": max_steps, "graders": graders, "sim_args": {"noise": noise}}
        provenance["sim_factory"] = factories[name]
        recorded = {"run_id": "run", "provenance": provenance}
        (folder / "rollouts" / "task0-i0.json").write_text(json.dumps(recorded))
        other_run = {"run_id": "an earlier run", "provenance": {"max_steps": 7, "graders": []}}
        (folder / "rollouts" / "task0-i1.json").write_text(json.dumps(other_run))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "ran with max_steps 500 and" in err
    assert "with 200: their episodes pair up by task and seed" in err
    assert 'ran with sim_args {"noise": 0.3} and' in err
    assert "graders" not in err, "the same graders: nothing to say; results of other runs are not read"
    assert "sim_factory" not in err, "a file's relative and absolute paths name one factory"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a" / "grades.json")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note")]
    assert notes == [f"note: the folder {tmp_path / 'a'} is read as its last run wrote it; {FOLDER_NOTE}"]


def test_the_no_regression_check_does_not_pass_on_episodes_that_errored_where_the_baseline_answered(
    tmp_path: Path,
) -> None:
    from hud_pipelines.eval.checks import check_verdict
    from hud_pipelines.spec.grading import NoRegressionCheck

    baseline = [_row(slot, True) for slot in range(12)]
    (tmp_path / "baseline.json").write_text(json.dumps([r.as_dict() for r in baseline]))
    gate = NoRegressionCheck(baseline=str(tmp_path / "baseline.json"))
    diverged = [_row(slot, True, errored=slot >= 2) for slot in range(12)]  # answers 2, both succeed
    verdict = check_verdict(gate, diverged)
    assert not verdict.passed, "as answered it is inconclusive over 2 pairs; the 10 errored ones decide it"
    assert "undecided: 10 episode(s) errored on one side only (10 in this eval, 0 in the baseline); had they gone" in (
        verdict.description
    )
    assert "success -83.3%" in verdict.description
    steady = [_row(slot, True, errored=slot == 11) for slot in range(12)]
    assert check_verdict(gate, steady).passed, "one errored episode cannot make a regression of it"


def test_compare_fail_if_worse_does_not_pass_on_episodes_that_errored_where_the_baseline_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same numbers that fail ``no_regression`` as undecided passed ``compare --fail-if-worse`` (exit 0:
    "no detectable difference" over the 2 answered pairs), so a CI gate's verdict hung on which command it used."""
    from hud_pipelines.cli.main import main

    baseline = [_row(slot, True) for slot in range(12)]
    diverged = [_row(slot, True, errored=slot >= 2) for slot in range(12)]
    for name, rows in (("baseline", baseline), ("diverged", diverged)):
        (tmp_path / f"{name}.json").write_text(json.dumps([r.as_dict() for r in rows]))
    sides = [str(tmp_path / "diverged.json"), str(tmp_path / "baseline.json")]
    assert main(["compare", *sides, "--fail-if-worse"]) == 1
    out = capsys.readouterr().out
    assert "no detectable difference" in out, "as answered"
    assert "undecided: 10 episode(s) errored on one side only (10 in the candidate, 0 in the baseline); had they " in (
        out
    )
    assert main(["compare", *sides]) == 0, "a gate only with --fail-if-worse"
    assert "undecided: 10 episode(s)" in capsys.readouterr().out, "said all the same"
    assert main(["compare", *sides, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["undecided_by_errors"] is True
    steady = [_row(slot, True, errored=slot == 11) for slot in range(12)]
    (tmp_path / "diverged.json").write_text(json.dumps([r.as_dict() for r in steady]))
    assert main(["compare", *sides, "--fail-if-worse"]) == 0, "one errored episode cannot make it worse"
    assert "undecided" not in capsys.readouterr().out


def test_a_missing_grades_file_is_named_as_given(tmp_path: Path) -> None:
    from hud_pipelines.eval.result_sets import read_result_set

    for given in (tmp_path / "typo" / "grades.json", tmp_path / "typo"):
        with pytest.raises(HudPipelinesError, match=f"no grades at {given} \\("):  # not .../grades.json/grades.json
            read_result_set(str(given))
    with pytest.raises(HudPipelinesError, match=r"outputs/nameless/grades\.json"):
        read_result_set("nameless", outputs_root=tmp_path / "outputs")


def test_the_no_regression_check_does_not_pass_on_episodes_that_errored_in_the_baseline_only(tmp_path: Path) -> None:
    from hud_pipelines.eval.checks import check_verdict
    from hud_pipelines.spec.grading import NoRegressionCheck

    baseline = [_row(slot, True, errored=slot >= 6) for slot in range(12)]  # the baseline answered 6, all succeeded
    (tmp_path / "baseline.json").write_text(json.dumps([r.as_dict() for r in baseline]))
    gate = NoRegressionCheck(baseline=str(tmp_path / "baseline.json"))
    candidate = [_row(slot, slot < 6) for slot in range(12)]  # fails every episode the baseline did not answer
    verdict = check_verdict(gate, candidate)
    assert not verdict.passed, "had the baseline's 6 errored episodes succeeded, this is a regression"
    assert "errored on one side only (0 in this eval, 6 in the baseline)" in verdict.description
    both = [_row(slot, slot < 6, errored=slot >= 6) for slot in range(12)]
    assert check_verdict(gate, both).passed, "an episode errored on both sides says nothing of the difference"


def test_compare_judges_a_pipeline_it_is_given_by_name_or_file_as_report_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results of a policy file edited since are stale: ``compare`` pairs nothing with them and says why, as
    ``report`` would, instead of comparing results of code that no longer exists."""
    from hud_pipelines.cli.main import main
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    (tmp_path / "pipelines").mkdir()
    policy = tmp_path / "pipelines" / "lean.py"
    policy.write_text("import numpy as np\n\n\ndef act(observation):\n    return (observation['state'][:, 2] > 0)\n")
    pipeline = tmp_path / "pipelines" / "leaning.yaml"
    pipeline.write_text(
        "name: leaning\nsim: {factory: CartPole-v1, num_envs: 2}\n"
        "agent: {policy: {kind: scripted, target: lean.py:act}}\n"
        "tasks: [{name: balance, seed: 5}]\ngroup: 2\nmax_steps: 30\ngraders: [{kind: return, threshold: 20}]\n"
    )
    monkeypatch.chdir(tmp_path)
    outputs = tmp_path / "outputs"
    evaluate(load_pipeline(pipeline), outputs_dir=outputs, project_dir=tmp_path)
    kept = tmp_path / "before.json"
    kept.write_bytes((outputs / "leaning" / "grades.json").read_bytes())
    for side in ("leaning", str(pipeline)):
        assert main(["compare", side, str(kept), "--outputs", str(outputs), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["pairs"] == 4
    policy.write_text(policy.read_text() + "# tuned\n")
    for side in ("leaning", str(pipeline)):
        assert main(["compare", side, str(kept), "--outputs", str(outputs), "--json"]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out)["pairs"] == 0
        assert "note: 4 of 4 episode(s) of" in said.err
        assert "(2 instance(s)) have no current result" in said.err
        assert "--partition" not in said.err, "every stale instance runs again, not the first alone"
        assert "lean.py" in said.err, "the note says what changed"
    assert main(["compare", str(outputs / "leaning"), str(kept), "--json"]) == 0, "a folder is read as it was written"
    said = capsys.readouterr()
    assert json.loads(said.out)["pairs"] == 4
    assert f"note: the folder {outputs / 'leaning'} is read as its last run wrote it; give its pipeline" in said.err
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # no pipelines folder here: the name's grades, as written, and said so
    assert main(["compare", "leaning", str(kept), "--outputs", str(outputs), "--json"]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["pairs"] == 4
    assert "note: no pipeline file named leaning loads here" in said.err
    assert main(["compare", "leaning", "leaning", "--outputs", str(outputs), "--json"]) == 0
    assert capsys.readouterr().err.count("no pipeline file named leaning") == 1, "one name, one note"


def test_no_regression_against_results_gone_stale_says_so_not_that_tasks_or_seeds_differ() -> None:
    """Before, a baseline checkpoint whose weights were replaced (its rows ``not_run``) failed the check saying
    "no episode pairs up ... (same tasks and seeds?)": they were the same."""
    from hud_pipelines.eval.checks import regression_verdict
    from hud_pipelines.spec.grading import NoRegressionCheck

    stale = "instance task0-i0 last ran (run r1) before the pipeline's policy changed; run it with: hud-pipelines run p"
    gone = [
        dataclasses.replace(_row(slot, True), status=EpisodeStatus.ERRORED, fault=Fault.NOT_RUN, error=stale)
        for slot in range(12)
    ]
    candidate = [_row(slot, slot < 6) for slot in range(12)]
    gate = NoRegressionCheck(baseline="step_100")
    verdict = regression_verdict(gate, candidate, gone, baseline_name="checkpoint step_100")
    assert not verdict.passed
    why = "the baseline's rows have no current result, e.g. instance task0-i0 last ran (run r1) before the pipeline's"
    assert why in verdict.description, verdict.description
    assert "same tasks and seeds" not in verdict.description
    elsewhere = [dataclasses.replace(row, seed=(row.seed or 0) + 100) for row in candidate]  # other seeds: no pair
    assert "(same tasks and seeds?)" in regression_verdict(gate, elsewhere, candidate, baseline_name="b").description


def test_no_regression_where_every_episode_errored_says_so_not_that_tasks_or_seeds_differ() -> None:
    """Before, a candidate whose every episode errored (its grader returned no grade) failed the check saying
    "no episode pairs up ... (same tasks and seeds?)": they were the same, and errors are no answers to pair."""
    from hud_pipelines.eval.checks import regression_verdict
    from hud_pipelines.spec.grading import NoRegressionCheck

    said = "GraderError: grader returned 'yes', not a grade"
    broken = [
        dataclasses.replace(_row(slot, False), status=EpisodeStatus.ERRORED, fault=Fault.GRADER, error=said)
        for slot in range(12)
    ]
    baseline = [_row(slot, slot < 6) for slot in range(12)]
    verdict = regression_verdict(NoRegressionCheck(baseline="b"), broken, baseline, baseline_name="b")
    assert not verdict.passed
    assert f"(this eval's episodes all errored (12 in a run), e.g. {said})" in verdict.description, verdict.description
