"""Where an eval's outputs go and what gates them: the outputs root, the dataset behind the checks, the CLI text."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.cli.main import build_parser
from hud_pipelines.errors import Fault
from hud_pipelines.eval.configuration import CurrentBy
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.seed_check import seed_warning
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.recording.events import EpisodeEnd, EpisodeStatus
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import Partition
from tests.conftest import signal_state
from tests.dagster.support import REPO


def _spec(tmp_path: Path, **fields: Any) -> Any:
    spec: dict[str, Any] = {
        "name": "placed",
        "sim": {"factory": "CartPole-v1", "num_envs": 2},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "group": 1,
        "max_steps": 20,
        "graders": [{"kind": "return", "threshold": 10}],
        "dataset": {"repo_id": "local/placed"},
        **fields,
    }
    return load_pipeline_text(json.dumps(spec), source=tmp_path / "placed.yaml")


def test_a_sweep_member_has_the_whole_layout_under_its_checkpoint_folder(tmp_path: Path) -> None:
    outputs = EvalOutputs(tmp_path, "sweep")
    member = outputs.member("step-10")
    assert outputs.base == tmp_path / "sweep"
    assert member.base == outputs.checkpoints / "step-10"
    for name, path in [
        ("grades.csv", member.grades_csv),
        ("report.md", member.report_md),
        ("checkpoint.json", member.checkpoint_json),
        ("contract.json", member.contract),
    ]:
        assert path == member.base / name
    assert outputs.comparison_csv == outputs.base / "comparison.csv", "the comparison sits beside the sweep's grades"
    assert member.result("t-i0") == member.base / "rollouts" / "t-i0.json"


def test_the_dataset_goes_under_the_outputs_root_unless_the_yaml_places_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    outputs = tmp_path / "elsewhere"
    evaluation = evaluate(_spec(tmp_path), outputs_dir=outputs, project_dir=tmp_path)
    assert evaluation.dataset is not None
    assert evaluation.dataset.path == outputs / "datasets" / "placed"
    assert not (tmp_path / "outputs").exists(), "nothing is written under the project's own outputs/"
    placed = evaluate(
        _spec(tmp_path, dataset={"repo_id": "local/placed", "root": "data/placed"}),
        outputs_dir=outputs,
        project_dir=tmp_path,
    )
    assert placed.dataset is not None
    assert placed.dataset.path == tmp_path / "data" / "placed"


def test_evaluate_runs_the_blocking_checks_before_it_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    failing = _spec(tmp_path, checks=[{"kind": "min_success_rate", "value": 1.0}], max_steps=5)
    evaluation = evaluate(failing, outputs_dir=tmp_path / "out", project_dir=tmp_path)
    assert {row.status for row in evaluation.rows} == {EpisodeStatus.FAILED}  # 5 steps never reach 10
    assert [(c.name, c.passed) for c in evaluation.checks] == [
        ("instances_completed", True),
        ("episodes_answered", True),
        ("min_success_rate", False),
    ]
    assert not evaluation.passed
    assert evaluation.dataset is None
    assert not (tmp_path / "out" / "datasets" / "placed").exists()
    checks = json.loads((tmp_path / "out" / "placed" / "checks.json").read_text())
    assert [c["passed"] for c in checks] == [True, True, False]
    assert "| min_success_rate | **FAILED** |" in (tmp_path / "out" / "placed" / "report.md").read_text()
    # the dataset asset materialized on its own (the UI, `dagster asset materialize`): before, it published
    from hud_pipelines.errors import HudPipelinesError
    from hud_pipelines.eval.publishing import dataset_step

    with pytest.raises(HudPipelinesError, match=r"not published while a blocking check fails .*\(min_success_rate;"):
        dataset_step(failing, evaluation.outputs, project_dir=tmp_path, run_id="alone")
    assert not (tmp_path / "out" / "datasets" / "placed").exists()


@pytest.mark.parametrize(
    ("argv", "outputs"),
    [
        (["run", "cartpole"], True),
        (["report", "cartpole"], True),
        (["contract", "cartpole"], False),
    ],
)
def test_every_pipeline_command_takes_a_name_a_pipelines_dir_and_its_outputs_root(
    argv: list[str], outputs: bool
) -> None:
    options = ["--pipelines-dir", "elsewhere", *(["--outputs", "out"] if outputs else [])]
    args = build_parser().parse_args([*argv, *options])
    assert (args.pipeline, args.pipelines_dir) == ("cartpole", Path("elsewhere"))
    assert getattr(args, "outputs", None) == (Path("out") if outputs else None)


def test_compare_takes_the_outputs_root_its_names_are_found_under() -> None:
    args = build_parser().parse_args(["compare", "candidate", "baseline", "--outputs", "out"])
    assert (args.candidate, args.baseline, args.outputs) == ("candidate", "baseline", Path("out"))


def test_the_cli_summary_prints_reasons_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    from hud_pipelines.cli.run import _print_summary  # pyright: ignore[reportPrivateUsage]

    row = GradeRow(
        "p", "t", 0, 0, "t-i0", 0, 1, EpisodeStatus.ERRORED, 0.0, False, 0.0, 0, error="self.envs[slot].step([x])"
    )
    _print_summary("p", [row], False, "run-1", Path("out"), ["step p__eval failed: a[0] [red]not markup[/red]"])
    printed = capsys.readouterr().out
    assert "self.envs[slot].step([x])" in printed
    assert "[red]not markup[/red]" in printed


def test_grades_traces_dataset_and_report_agree_on_every_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from hud_pipelines.recording.trace_reader import read_trace

    monkeypatch.chdir(REPO)
    # CartPole reports no success: the return grader decides, and some episodes miss its threshold
    fields: dict[str, Any] = {
        "group": 2,
        "agent": {"policy": {"kind": "random", "seed": 1}},
        "graders": [{"kind": "return", "threshold": 20}],
    }
    evaluation = evaluate(_spec(tmp_path, max_steps=40, **fields), outputs_dir=tmp_path / "out", project_dir=tmp_path)
    graded = {row.trace_id: row.success for row in evaluation.rows}
    assert set(graded.values()) == {True, False}, "both verdicts occur, so agreement is not trivial"

    traces = {t.trace_id: t for t in map(read_trace, evaluation.outputs.traces(evaluation.run_id).rglob("*.jsonl"))}
    assert {tid: bool(t.grade and t.grade["success"]) for tid, t in traces.items()} == graded

    assert evaluation.dataset is not None
    root = evaluation.dataset.path
    sidecar = [json.loads(line) for line in (root / "meta" / "hud_episodes.jsonl").read_text().splitlines()]
    assert {line["trace_id"]: line["success"] for line in sidecar} == graded
    frames = pq.read_table(sorted((root / "data").rglob("*.parquet"))).to_pydict()
    by_episode: dict[int, bool] = {}
    for episode, success in zip(frames["episode_index"], frames["next.success"], strict=True):
        by_episode[episode] = by_episode.get(episode, False) or bool(success)
    assert {line["trace_id"]: by_episode[line["episode_index"]] for line in sidecar} == graded
    assert all(line["terminated"] or line["truncated"] for line in sidecar), "how each episode ended, told apart"
    assert all(line["truncated"] == (line["steps"] == 40) for line in sidecar)

    succeeded = sum(graded.values())
    assert f"succeeded {succeeded} + failed {len(graded) - succeeded}" in evaluation.outputs.report_md.read_text()

    # another max_steps, and only one instance re-run: the other's episodes are stale in every output
    shorter = _spec(tmp_path, max_steps=6, **fields)
    again = evaluate(shorter, outputs_dir=tmp_path / "out", project_dir=tmp_path, partitions=[Partition(0, 0)])
    current = {row.trace_id for row in again.rows if row.status is not EpisodeStatus.ERRORED}
    assert len(current) == 2
    assert {row.fault for row in again.rows if row.trace_id not in current} == {Fault.NOT_RUN}
    assert again.dataset is not None
    sidecar = [json.loads(line) for line in (root / "meta" / "hud_episodes.jsonl").read_text().splitlines()]
    assert {line["trace_id"] for line in sidecar} == current, "the stale instance's shard stays out"
    frames = pq.read_table(sorted((root / "data").rglob("*.parquet"))).to_pydict()
    assert max(frames["frame_index"]) < 6
    assert {(line["steps"], line["truncated"]) for line in sidecar} == {(6, True)}, "cut off at max_steps, and said"
    last = {episode: done for episode, done in zip(frames["episode_index"], frames["next.done"], strict=True)}
    assert set(last.values()) == {True}, "each episode's last frame ends it, cut off by max_steps or not"


BLINKING_ENV = """
import gymnasium as gym
import numpy as np


class Blinking(gym.Env):
    \"\"\"Reports success on its steps 3 to 5 only, then runs on to step 8.\"\"\"

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 0.0, False, self.t >= 8, {"is_success": 3 <= self.t <= 5}
"""


def test_a_traces_steps_say_the_envs_success_on_each_step_beside_a_grade_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace's steps said "succeeded so far" (true from step 3 to the last), where the grade at the end said
    the episode failed: the two disagreed on the last step."""
    import pyarrow.parquet as pq

    from hud_pipelines.recording.trace_reader import read_trace

    monkeypatch.chdir(REPO)
    (tmp_path / "blinking.py").write_text(BLINKING_ENV)
    graders = [{"kind": "success", "at": "end"}, {"kind": "success", "name": "ever", "at": "any"}]
    sim = {"factory": "blinking.py:Blinking", "num_envs": 2}
    spec = _spec(tmp_path, sim=sim, agent={"policy": {"kind": "constant"}}, max_steps=10, graders=graders)
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=tmp_path)
    assert {row.status for row in evaluation.rows} == {EpisodeStatus.FAILED}
    traces = [read_trace(p) for p in evaluation.outputs.traces(evaluation.run_id).rglob("*.jsonl")]
    assert len(traces) == 2
    for trace in traces:
        said = [(line["step"], line["success"]) for line in trace.of_type("reward")]
        assert said == [(step, 3 <= step + 1 <= 5) for step in range(8)]
    assert evaluation.dataset is not None
    frames = pq.read_table(sorted((evaluation.dataset.path / "data").rglob("*.parquet"))).to_pydict()
    assert not any(frames["next.success"]), "a failed episode's frames say no success, as its grade does"


@pytest.mark.parametrize(
    ("video", "cap", "kept"),
    [("failed", 16, {1, 3}), ("all", 16, {0, 1, 2, 3}), ("all", 1, 2), ("none", 16, set[int]())],
)
def test_traces_keep_the_videos_the_yaml_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, video: str, cap: int, kept: set[int] | int
) -> None:
    from hud_pipelines.recording.trace_reader import read_trace

    monkeypatch.chdir(REPO)
    grader = f"{REPO / 'tests' / 'eval' / 'faulty_policies.py'}:even_seed"
    spec = _spec(
        tmp_path,
        sim={"factory": f"{REPO / 'envs' / 'camera_pendulum.py'}:camera_pendulum", "num_envs": 2},
        agent={"policy": {"kind": "random", "seed": 2}},
        group=2,
        max_steps=8,
        graders=[{"kind": "callable", "target": grader}],
        traces={"video": video, "max_videos": cap},
        dataset={"enabled": False},
    )
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=tmp_path)
    traces = [read_trace(p) for p in evaluation.outputs.traces(evaluation.run_id).rglob("*.jsonl")]
    filmed = {t.header["seed"] for t in traces if t.videos}
    if isinstance(kept, int):  # a cap per instance: that many of each instance's episodes
        assert len(filmed) == kept
    else:
        assert filmed == kept


def test_hud_pipelines_report_writes_and_serves_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re
    import subprocess
    import sys
    import urllib.request

    from hud_pipelines.cli.main import main

    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, dataset={"enabled": False})
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json")))
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=tmp_path)
    page = evaluation.outputs.base / "report.html"
    page.unlink()
    assert main(["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out")]) == 0
    assert page.is_file()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "typo")]) == 2
    assert f"no results of placed at {tmp_path / 'typo' / 'placed'}: run it first" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists(), "a mistyped folder gets no report of nothing run"
    edited = spec.model_dump(mode="json") | {"max_steps": 25}  # the results are now another configuration's
    (tmp_path / "placed.yaml").write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out")]) == 1, "as a run would"
    assert "blocking check episodes_answered failed: " in capsys.readouterr().err
    grades = json.loads((evaluation.outputs.base / "grades.json").read_text())
    assert {row["fault"] for row in grades} == {"not_run"}, "the grades say what the report says"
    assert "errored 2" in (evaluation.outputs.base / "report.md").read_text()
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json")))
    monkeypatch.setattr("webbrowser.open", lambda url: False)  # a machine without a browser: said, not silent
    assert main(["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out"), "--open"]) == 0
    assert f"no browser to open here: open {page.as_uri()} where there is one" in capsys.readouterr().err

    command = [sys.executable, "-m", "hud_pipelines.cli", "report", str(tmp_path / "placed.yaml")]
    served = subprocess.Popen(
        [*command, "--outputs", str(tmp_path / "out"), "--serve"], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert served.stdout is not None
        line = ""
        while "serving" not in line:
            line = served.stdout.readline()
            assert line, "the server printed no address"
        found = re.search(r"(http://127\.0\.0\.1:\d+/placed/report\.html)", line)  # rooted at the outputs
        assert found is not None, line
        with urllib.request.urlopen(found.group(1), timeout=10) as response:
            assert response.status == 200
            assert "placed" in response.read().decode()
        assets = found.group(1).replace("report.html", "report_files/dataset.js")
        with urllib.request.urlopen(assets, timeout=10) as response:
            assert response.read().decode() == "window.HUD_DATASET = null;\n", "no dataset: no episode links"
        port = found.group(1).split(":")[2].split("/")[0]  # taken: said in a line, not a traceback
        capsys.readouterr()
        assert main(["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out"), "--serve", port]) == 2
        assert f"cannot serve on port {port}: Address already in use; give another" in capsys.readouterr().err
    finally:
        served.terminate()
        try:
            served.wait(timeout=10)
        except subprocess.TimeoutExpired:
            state = signal_state(served.pid)
            served.kill()
            served.wait()
            pytest.fail(f"the report server did not end within 10 s of SIGTERM: {state}")
        if served.stdout is not None:
            served.stdout.close()


def test_report_after_an_edit_says_the_published_dataset_holds_episodes_its_grades_no_longer_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report`` writes no dataset: before, the grades counted one instance while the dataset held two, unsaid."""
    from hud_pipelines.cli.main import main

    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, group=2)
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json")))
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=tmp_path)
    assert evaluation.dataset is not None
    report = ["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out")]
    capsys.readouterr()
    assert main(report) == 0
    assert "note: the dataset" not in capsys.readouterr().out, "the dataset holds what the grades count"
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json") | {"group": 1}))
    assert main(report) == 0
    grades = json.loads((evaluation.outputs.base / "grades.json").read_text())
    assert len(grades) == 2, "one instance of two slots"
    dataset = tmp_path / "out" / "datasets" / "placed"
    said = (
        f"the published dataset {dataset} holds 2 of its 4 episode(s) from results these grades no longer count "
        "(an earlier run's: the configuration changed since, or a later run's dataset was held back): a run that "
        "passes its blocking checks publishes it again"
    )
    assert f"note: {said}" in capsys.readouterr().out
    assert f"**Warning:** {said}." in (evaluation.outputs.base / "report.md").read_text(), "the report says it too"


def test_a_success_grade_of_an_env_that_never_reports_success_warns_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    silent = _spec(tmp_path, graders=[{"kind": "success"}], dataset={"enabled": False})  # CartPole has no signal
    evaluation = evaluate(silent, outputs_dir=tmp_path / "silent")
    assert [row.success_reported for row in evaluation.rows] == [False, False]
    report = (tmp_path / "silent" / "placed" / "report.md").read_text()
    assert "**Warning:** no episode reported a success signal (info['is_success']" in report
    assert "![per-slot outcomes](report.png)" in report, "the plot is the file beside the report"
    assert "data:image" not in report, "report.md stays readable in a terminal"
    page = (tmp_path / "silent" / "placed" / "report.html").read_text()
    assert '<p class="warning"><strong>Warning:</strong> no episode reported a success signal' in page
    opens = page.index('<p class="warning">') < page.index('<section id="summary">')
    assert opens, "the page opens with it, as report.md does"
    assert report.index("**Warning:**") < report.index("**Success rate:**")

    reporting = _spec(
        tmp_path,
        sim={"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 2},
        agent={"policy": {"kind": "constant"}},
        graders=[{"kind": "success"}],
        dataset={"enabled": False},
    )
    evaluation = evaluate(reporting, outputs_dir=tmp_path / "reporting")
    assert [row.success_reported for row in evaluation.rows] == [True, True], "it says False at every step"
    assert "**Warning:**" not in (tmp_path / "reporting" / "placed" / "report.md").read_text()
    assert 'class="warning"' not in (tmp_path / "reporting" / "placed" / "report.html").read_text()


def test_a_callable_grader_that_returns_a_score_on_an_env_without_a_success_signal_warns_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its success is left to the env's signal, which CartPole never gives: 0 % read as the policy's, unsaid."""
    monkeypatch.chdir(REPO)
    (tmp_path / "score_only_grader.py").write_text(
        "def by_return(episode):\n    return episode['total_reward']\n"
        "def own_verdict(episode):\n    return {'score': episode['total_reward'], 'success': False}\n"
    )
    scored = _spec(
        tmp_path,
        graders=[{"kind": "callable", "name": "ret", "target": "score_only_grader:by_return"}],
        dataset={"enabled": False},
    )
    evaluation = evaluate(scored, outputs_dir=tmp_path / "scored")
    assert [(row.success_reported, row.success_by_signal) for row in evaluation.rows] == [(False, True)] * 2
    report = (tmp_path / "scored" / "placed" / "report.md").read_text()
    assert "**Warning:** no episode reported a success signal" in report
    assert "the ret grader counts all 2 answered episode(s) it left to that signal as failed" in report
    grades = json.loads((tmp_path / "scored" / "placed" / "grades.json").read_text())
    assert [row["success_by_signal"] for row in grades] == [True, True], "recorded in the rows"

    judging = _spec(
        tmp_path,
        graders=[{"kind": "callable", "name": "own", "target": "score_only_grader:own_verdict"}],
        dataset={"enabled": False},
    )
    evaluation = evaluate(judging, outputs_dir=tmp_path / "judging")
    assert [row.success_by_signal for row in evaluation.rows] == [False, False]
    assert "**Warning:**" not in (tmp_path / "judging" / "placed" / "report.md").read_text(), "its own failures"


UNSEEDED_ENV = '''\
import gymnasium as gym
import numpy as np


class Unseeded(gym.Env):
    """Starts from the global generator, not from self.np_random: its seed changes nothing."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = np.random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self.position, {}

    def step(self, action):
        return self.position, 0.0, False, False, {}


class NoisyStep(gym.Env):
    """Starts from its seed, then steps with the global generator's noise: each run of a seed goes its own way."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self.position, {}

    def step(self, action):
        assert action == 0, "the check steps a whole-number action at its lower bound"
        if self.np_random.random() < 2.0:  # its own generator, as it should: every run the same
            self.position = self.position + np.random.normal(0.0, 0.1, 2).astype(np.float32)
        return self.position, 1.0, False, False, {}
'''


def _seed_checked(tmp_path: Path, env_class: str) -> tuple[dict[str, Any], str]:
    """Evaluate ``UNSEEDED_ENV``'s ``env_class`` (two slots, a constant policy) into ``tmp_path/<env_class>``: its
    seed check and its report."""
    (tmp_path / "unseeded_env.py").write_text(UNSEEDED_ENV)
    spec = _spec(
        tmp_path,
        sim={"factory": f"unseeded_env.py:{env_class}", "num_envs": 2},
        agent={"policy": {"kind": "constant"}},
        dataset={"enabled": False},
    )
    evaluate(spec, outputs_dir=tmp_path / env_class)
    check = json.loads((tmp_path / env_class / "placed" / "seed_check.json").read_text())
    return check, (tmp_path / env_class / "placed" / "report.md").read_text()


def test_a_sim_that_does_not_repeat_its_start_for_a_seed_is_named_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    check, report = _seed_checked(tmp_path, "Unseeded")
    assert (check["seeds"], check["differing"]) == ([0, 1], {"0": ["state"], "1": ["state"]})
    outputs = EvalOutputs(tmp_path / "Unseeded", "placed")
    assert seed_warning(outputs, check["rollout_hash"]) is not None
    assert seed_warning(outputs, "another configuration") is None, "the check speaks for what it checked"
    assert (
        "**Warning:** the sim does not repeat an episode's start for the same seed: two resets with seed 0 gave "
        "different state (2 of the first instance's 2 seeds differed)"
    ) in report
    page = (tmp_path / "Unseeded" / "placed" / "report.html").read_text()
    assert "<strong>Warning:</strong> the sim does not repeat an episode&#x27;s start" in page

    seeded = _spec(tmp_path, dataset={"enabled": False})  # CartPole starts from self.np_random
    evaluate(seeded, outputs_dir=tmp_path / "seeded")
    check = json.loads((tmp_path / "seeded" / "placed" / "seed_check.json").read_text())
    assert (check["seeds"], check["differing"]) == ([0, 1], {})
    assert "does not repeat" not in (tmp_path / "seeded" / "placed" / "report.md").read_text()


def test_a_sim_whose_step_draws_from_an_unseeded_generator_is_named_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check only reset the sim: an env whose step used the global np.random passed it, run after run."""
    monkeypatch.chdir(REPO)
    check, report = _seed_checked(tmp_path, "NoisyStep")
    assert check["differing"] == {"0": ["state after step 1"], "1": ["state after step 1"]}, "its start repeats"
    assert (
        "**Warning:** the sim does not repeat an episode for the same seed and actions: two resets with seed 0, "
        "each stepped with the same action, gave different state after step 1 (2 of the first instance's 2 seeds "
        "differed)"
    ) in " ".join(report.split())


def test_a_seed_check_in_which_no_slot_started_has_no_verdict() -> None:
    """Every slot's reset raised: no observation was compared, so nothing may say the sim repeats its start (the
    second reset builds the envs anew, and its probe raises as the check's reset: no verdict either)."""
    from hud_pipelines.errors import RemoteError
    from hud_pipelines.eval.seed_check import SeedCheck, check_seeded_reset
    from hud_pipelines.sim.bridge import GymBridge
    from hud_pipelines.sim.client import SimClient
    from tests.conftest import FAULTY

    tasks = [{"seed": 0}, {"seed": 1}]
    checked: list[object] = []
    for fault_seed in (None, 1):  # every slot's reset raises / slot 1's alone
        build = {"fault": "raise_reset", "fault_seed": fault_seed}
        with GymBridge(FAULTY, 2, build_args=build) as bridge, SimClient.in_process(bridge) as client:
            try:
                checked.append(check_seeded_reset(client, tasks, rollout_hash="h"))
            except RemoteError:  # a reset of the check failed
                checked.append(None)
    nothing, one_started = checked
    assert nothing is None
    assert isinstance(one_started, SeedCheck)
    assert one_started.repeats, "slot 0 started twice the same: a verdict"


def test_every_grader_after_the_first_is_a_column_of_the_grades_and_a_line_of_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    monkeypatch.chdir(REPO)
    even = f"{REPO / 'tests' / 'eval' / 'faulty_policies.py'}:even_seed"
    spec = _spec(
        tmp_path,
        group=2,
        graders=[{"kind": "return", "threshold": 10}, {"kind": "callable", "name": "even", "target": even}],
        dataset={"enabled": False},
    )
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    table = list(csv.DictReader(evaluation.outputs.grades_csv.read_text().splitlines()))
    assert [row["seed"] for row in table] == ["0", "1", "2", "3"]
    assert [row["even_success"] for row in table] == ["True", "False", "True", "False"]
    assert [row["even_score"] for row in table] == ["1.0", "0.0", "1.0", "0.0"]
    assert [row["fault"] for row in table] == [""] * 4
    assert {row["run_id"] for row in table} == {evaluation.run_id}
    assert [row["trace_id"] for row in table] == [row.trace_id for row in evaluation.rows]
    report = evaluation.outputs.report_md.read_text()
    assert "## Other graders" in report
    assert "| even | 50.0% (95% CI 15.0%-85.0%, 2/4) | 0.5 |" in report
    page = (evaluation.outputs.base / "report.html").read_text()
    assert "<li>even: 50.0% (95% CI 15.0%-85.0%, 2/4), mean score 0.5</li>" in page


def test_a_success_grader_at_the_end_counts_only_episodes_that_held_their_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    graders = [{"kind": "success"}, {"kind": "success", "name": "at_end", "at": "end"}]
    sims = {
        "one sim": {"factory": f"{REPO / 'envs' / 'held_goal.py'}:make", "num_envs": 2},
        "two shards": {"factory": f"{REPO / 'envs' / 'held_goal.py'}:make", "num_envs": 2, "shards": 2},
    }
    for label, sim in sims.items():
        fields = {"sim": sim, "agent": {"policy": {"kind": "constant"}}, "graders": graders, "group": 2}
        spec = _spec(tmp_path, **fields, dataset={"enabled": False}, name=label.replace(" ", "_"))
        evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
        rows = sorted(evaluation.rows, key=lambda row: row.seed or 0)
        assert [row.seed for row in rows] == [0, 1, 2, 3], label
        assert [row.success for row in rows] == [True] * 4, label  # every episode reached its goal once
        assert [row.metrics["at_end_success"] for row in rows] == [True, False, True, False], label
        report = evaluation.outputs.report_md.read_text()
        assert "| at_end | 50.0% (95% CI 15.0%-85.0%, 2/4) | 0.5 |" in report, label
        assert "Graded by success: the env's success signal at any step of the episode." in report, label
        page = (evaluation.outputs.base / "report.html").read_text()
        assert "Graded by success: the env&#x27;s success signal at any step of the episode." in page, label


def test_the_datasets_episodes_come_in_task_and_instance_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    tasks = [{"name": "zeta", "seed": 0}, {"name": "alpha", "seed": 100}]  # partition keys sort the other way
    evaluation = evaluate(_spec(tmp_path, tasks=tasks, group=2), outputs_dir=tmp_path / "out", project_dir=tmp_path)
    assert evaluation.dataset is not None
    sidecar = (evaluation.dataset.path / "meta" / "hud_episodes.jsonl").read_text().splitlines()
    order = [(line["task"], line["instance"]) for line in map(json.loads, sidecar)]
    assert order == sorted(order), order
    assert {t for t, _ in order} == {0, 1}
    named = {(line["task"], line["task_name"]) for line in map(json.loads, sidecar)}
    assert named == {(0, "zeta"), (1, "alpha")}, "an episode names its task, not only its index"


def test_writers_of_one_file_at_once_each_replace_it_whole(tmp_path: Path) -> None:
    """Two runs of one pipeline (a backfill's partitions) write grades.json, checks.json... at once."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    from hud_pipelines.eval.outputs import write_atomically

    path = tmp_path / "grades.json"
    texts = [json.dumps({"writer": writer, "rows": ["x" * 1000] * 50}) for writer in range(8)]

    def write(text: str) -> None:
        for _ in range(50):
            write_atomically(path, text)

    with ThreadPoolExecutor(max_workers=8) as threads:
        list(threads.map(write, texts))  # raises if one writer's rename took another's file
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=write_atomically, args=(path, text)) for text in texts[:2]]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [p.exitcode for p in processes] == [0, 0]
    assert path.read_text() in texts, "one writer's whole text, never a mix"
    assert [p.name for p in tmp_path.iterdir()] == ["grades.json"], "no temporary file is left"


def test_a_cut_short_run_judges_what_to_leave_in_place_under_the_instances_lock(tmp_path: Path) -> None:
    """Before, it judged the result file outside the lock: a run of the instance ending between its look and its
    write lost its finished result to an ``interrupted`` one."""
    import threading

    from hud_pipelines.eval.results import InstanceResult, unreached_result
    from hud_pipelines.eval.rollouts import _record_interrupted  # pyright: ignore[reportPrivateUsage]

    spec = _spec(tmp_path, group=1)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    (only,) = spec.partitions()
    finished = unreached_result(spec, only, "a finished result, here as a stand-in", Fault.ENV, run_id="other")
    holding, release = threading.Event(), threading.Event()

    def other_run() -> None:  # puts its result in place, as rollouts.put_in_place does
        with outputs.instance_lock(finished.key):
            holding.set()
            release.wait(10)
            finished.write(outputs.result(finished.key))

    other = threading.Thread(target=other_run)
    other.start()
    assert holding.wait(10)
    cutter = threading.Thread(target=_record_interrupted, args=(spec, outputs, "cut", [only], KeyboardInterrupt()))
    cutter.start()
    cutter.join(0.5)
    waited = cutter.is_alive()
    release.set()
    other.join(10)
    cutter.join(10)
    assert waited, "it waits for the run that holds the instance"
    assert InstanceResult.read(outputs.result(finished.key)) == finished, "and leaves what that run finished"


def test_an_interrupted_run_leaves_every_earlier_result_in_place_whatever_configuration_made_it(
    tmp_path: Path,
) -> None:
    from hud_pipelines.eval.results import InstanceResult, unreached_result
    from hud_pipelines.eval.rollouts import _record_interrupted  # pyright: ignore[reportPrivateUsage]

    spec = _spec(tmp_path, group=3)
    earlier = _spec(tmp_path, group=3, max_steps=30)  # the YAML before an edit: another rollout hash
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    first, second, third = spec.partitions()
    kept = unreached_result(earlier, first, "a finished result, here as a stand-in", Fault.ENV, run_id="old")
    kept.write(outputs.result(kept.key))
    current = unreached_result(spec, second, "another stand-in", Fault.ENV, run_id="old")
    current.write(outputs.result(current.key))

    _record_interrupted(spec, outputs, "cut", [first, second, third], KeyboardInterrupt())
    assert InstanceResult.read(outputs.result(kept.key)) == kept, "the run measured nothing to replace it"
    assert InstanceResult.read(outputs.result(current.key)) == current
    written = InstanceResult.read(outputs.result(spec.partition_key(*third)))
    assert (written.fault, written.run_id) == (Fault.INTERRUPTED, "cut"), "no result before: it says why"
    assert written.error == "the run was interrupted before instance task0-i2 finished"
    _record_interrupted(spec, outputs, "cut again", [first, second, third], KeyboardInterrupt())
    again = InstanceResult.read(outputs.result(written.key))  # which run cut it short last: the sweep sensor's key
    assert (again.fault, again.run_id) == (Fault.INTERRUPTED, "cut again"), "another cut-short run's is replaced"
    assert InstanceResult.read(outputs.result(kept.key)) == kept, "a finished one never is"

    from dagster._core.errors import DagsterExecutionInterruptedError

    outputs.result(written.key).unlink()  # a termination from Dagster's UI is an interruption too
    _record_interrupted(spec, outputs, "cut", [third], DagsterExecutionInterruptedError())
    assert InstanceResult.read(outputs.result(written.key)).error == written.error

    outputs.result(written.key).unlink()  # a step that failed on a fault of its own was not interrupted: it says so
    _record_interrupted(spec, outputs, "cut", [third], OSError(36, "File name too long"))
    failed = InstanceResult.read(outputs.result(spec.partition_key(*third)))
    assert failed.error == (
        "the run's eval step failed before instance task0-i2 finished: OSError: [Errno 36] File name too long"
    )


def test_instances_that_kept_their_results_are_said_in_a_line_a_fault_with_the_command_last(tmp_path: Path) -> None:
    """Hung sims' reasons differ by port, process and stack dump: one line says them all, and the command stays.
    The whole reason is in the run's log: grades.json holds the kept earlier rows, which never saw it."""
    import dataclasses

    from hud_pipelines.eval.kept import kept_failure
    from hud_pipelines.eval.results import unreached_result

    spec = _spec(tmp_path, group=3)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    attempts = []
    for index, partition in enumerate(spec.partitions()):
        finished = unreached_result(spec, partition, "stand-in", Fault.ENV, run_id="first")
        dataclasses.replace(finished, error=None, fault=None).write(outputs.result(finished.key))
        dump = f"sim at 127.0.0.1:{4000 + index} (pid {900 + index}) hung\nstderr tail:\n  File 'x.py', line {index}"
        attempts.append(unreached_result(spec, partition, dump, Fault.SIM_HUNG, run_id="second"))
    said = kept_failure(spec, outputs, attempts)
    assert said is not None
    lines = said.splitlines()
    assert lines == [
        "instance(s) task0-i0, task0-i1, task0-i2 did not complete (sim_hung: sim at 127.0.0.1:4000 (pid 900) hung "
        "(full reason in the run's log)); their results of run first are kept, as nothing ran to replace them",
        f"run them again once they can start: hud-pipelines run {tmp_path / 'placed.yaml'} --outputs {outputs.root} "
        "--partition task0-i0 --partition task0-i1 --partition task0-i2",  # where its results are
    ]


def test_an_attempt_that_did_not_start_after_an_edit_replaces_the_earlier_result_instead_of_keeping_it(
    tmp_path: Path,
) -> None:
    """A sim that no longer starts after an edit of its code: the earlier result is of another environment (stale
    whatever happens), so the attempt's own error is what its rows say, not a ``not_run`` naming the edit."""
    import dataclasses

    from hud_pipelines.eval.kept import kept_failure, kept_result
    from hud_pipelines.eval.results import unreached_result

    spec = _spec(tmp_path)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    (partition, *_) = spec.partitions()
    ran_in = {"fingerprint": "0123", "sources": {"env.py": "digest-before"}}
    finished = unreached_result(spec, partition, "stand-in", Fault.ENV, run_id="first")
    dataclasses.replace(finished, error=None, fault=None, provenance=ran_in).write(outputs.result(finished.key))
    broken = unreached_result(spec, partition, "ImportError: broken after an edit", Fault.SIM_START, run_id="second")
    unchanged = dataclasses.replace(broken, provenance=ran_in)
    assert kept_result(unchanged, outputs) is not None, "the same environment: a sim down keeps what it served"
    edited = dataclasses.replace(broken, provenance={"fingerprint": "4567", "sources": {"env.py": "digest-after"}})
    assert kept_result(edited, outputs) is None
    assert kept_failure(spec, outputs, [edited]) is None, "nothing kept: the run's error is the attempt's own"


def test_a_stale_result_names_what_of_the_configuration_changed_where_the_runs_recorded_it(tmp_path: Path) -> None:
    import dataclasses

    from hud_pipelines.eval.results import unreached_result
    from hud_pipelines.eval.rows import collect_rows

    spec = _spec(tmp_path, tasks=[{"name": "task0", "seed": 40}])
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    (partition,) = spec.partitions()
    earlier = unreached_result(spec, partition, "a stand-in", Fault.ENV, run_id="old")
    recorded = {"seeds": {"task0": 0}, "group": 1, "num_envs": 2}
    dataclasses.replace(earlier, rollout_hash="another", provenance=recorded).write(outputs.result(earlier.key))
    latest = {"seeds": {"task0": 40}, "group": 1, "num_envs": 2}  # what the latest run recorded
    rows = collect_rows(spec, outputs, current=CurrentBy(environment=latest))
    assert {row.fault for row in rows} == {Fault.NOT_RUN}
    assert all("last ran (run old) before the pipeline's seeds changed" in (row.error or "") for row in rows)
    edited = latest | {"seeds": {"task0": 0}, "max_steps": 50, "graders": [{"name": "binary_success"}]}
    was = recorded | {"max_steps": 30, "graders": [{"name": "return"}]}
    dataclasses.replace(earlier, rollout_hash="another", provenance=was).write(outputs.result(earlier.key))
    rows = collect_rows(spec, outputs, current=CurrentBy(environment=edited))
    assert all("before the pipeline's max_steps, graders changed" in (row.error or "") for row in rows)
    rows = collect_rows(spec, outputs, current=CurrentBy(environment={}))  # nothing recorded to tell: said in general
    assert all("before the pipeline's sim, agent, tasks, max_steps or graders changed" in (r.error or "") for r in rows)


def test_a_stale_result_names_what_the_yaml_changed_since_the_latest_run(tmp_path: Path) -> None:
    """Before, the reason held a result against the latest run's configuration, which the edit left as it was: an
    edit of max_steps read "sim, agent, tasks, max_steps or graders changed", naming nothing."""
    import dataclasses

    from hud_pipelines.eval import provenance
    from hud_pipelines.eval.configuration import record_configuration
    from hud_pipelines.eval.results import unreached_result
    from hud_pipelines.eval.rows import collect_rows

    spec = _spec(tmp_path)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    record_configuration(spec, spec, outputs, run_id="old")
    (partition,) = spec.partitions()
    ran = unreached_result(spec, partition, "a stand-in", Fault.ENV, run_id="old")
    dataclasses.replace(ran, provenance=provenance.for_run(spec)).write(outputs.result(ran.key))
    assert {row.fault for row in collect_rows(spec, outputs)} == {Fault.ENV}, "its own rows: current before the edit"
    rows = collect_rows(_spec(tmp_path, max_steps=21), outputs)
    assert {row.fault for row in rows} == {Fault.NOT_RUN}
    assert all("last ran (run old) before the pipeline's max_steps changed; " in (row.error or "") for row in rows)


def test_a_run_records_the_episode_length_and_the_graders_it_scored_with(tmp_path: Path) -> None:
    from hud_pipelines.eval import provenance

    spec = _spec(tmp_path, max_steps=30)
    record = provenance.for_run(spec)
    assert record["max_steps"] == 30
    assert [grader["name"] for grader in record["graders"]] == [grader.name for grader in spec.graders]


def test_adding_or_editing_a_task_leaves_the_other_tasks_results_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result carries its task's rollout hash: a task added to a benchmark (or a matrix value) runs alone."""
    import dataclasses

    from hud_pipelines.eval import provenance
    from hud_pipelines.eval.results import InstanceResult
    from hud_pipelines.eval.rows import collect_rows

    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    near, mid, far = {"name": "near", "seed": 0}, {"name": "mid", "seed": 50}, {"name": "far", "seed": 100}
    first = evaluate(_spec(tmp_path, tasks=[near, mid], dataset=None), outputs_dir=out)
    assert {(row.fault, row.run_id) for row in first.rows} == {(None, first.run_id)}

    grown = _spec(tmp_path, tasks=[near, mid, far], dataset=None)
    rows = collect_rows(grown, EvalOutputs(out, grown.name), current=CurrentBy(environment=provenance.for_run(grown)))
    assert {(row.fault, row.run_id) for row in rows if row.task != "far"} == {(None, first.run_id)}, "still current"
    assert {row.fault for row in rows if row.task == "far"} == {Fault.NOT_RUN}
    second = evaluate(grown, outputs_dir=out, partitions=[Partition(2, 0)])
    assert {(row.task, row.fault, row.run_id) for row in second.rows} == {
        ("near", None, first.run_id),
        ("mid", None, first.run_id),
        ("far", None, second.run_id),
    }

    reseeded = _spec(tmp_path, tasks=[near, mid, {**far, "seed": 200}], dataset=None)
    rows = collect_rows(
        reseeded, EvalOutputs(out, reseeded.name), current=CurrentBy(environment=provenance.for_run(reseeded))
    )
    assert {(row.fault, row.run_id) for row in rows if row.task != "far"} == {(None, first.run_id)}
    stale = [row for row in rows if row.task == "far"]
    assert {row.fault for row in stale} == {Fault.NOT_RUN}, "its own seed changed: far is run again"
    assert all("before the pipeline's seeds changed" in (row.error or "") for row in stale)
    longer = _spec(tmp_path, tasks=[near, mid, {**far, "seed": 200}, {"name": "farther", "seed": 300}], max_steps=25)
    rows = collect_rows(
        longer, EvalOutputs(out, longer.name), current=CurrentBy(environment=provenance.for_run(longer))
    )
    said = {row.task: row.error or "" for row in rows}
    assert "before the pipeline's max_steps changed;" in said["near"], "another task's new seed is none of near's"
    assert "before the pipeline's seeds, max_steps changed;" in said["far"], said["far"]

    # a result recorded before tasks were hashed alone carries the pipeline's hash: current while it holds
    outputs = EvalOutputs(out, grown.name)
    path = outputs.result(grown.partition_key(0, 0))
    dataclasses.replace(InstanceResult.read(path), rollout_hash=grown.rollout_hash).write(path)
    rows = collect_rows(grown, outputs, current=CurrentBy(environment=provenance.for_run(grown)))
    assert {(row.fault, row.run_id) for row in rows if row.task == "near"} == {(None, first.run_id)}
    rows = collect_rows(reseeded, outputs, current=CurrentBy(environment=provenance.for_run(reseeded)))
    assert {row.fault for row in rows if row.task == "near"} == {Fault.NOT_RUN}, "the pipeline's hash changed"


def test_the_grades_say_how_each_answered_episode_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A success of Reach2D ends the episode (terminated); a miss runs into ``max_steps`` (truncated); the
    column is in grades.csv and survives grades.json."""
    import csv

    monkeypatch.chdir(REPO)
    sim = {"factory": "tests.eval.sweep_sims:Reach2D", "num_envs": 4, "args": {"reach": 0.9}}
    fields = {"name": "reach_ends", "sim": sim, "agent": {"policy": {"kind": "constant", "value": [0.0, 0.0]}}}
    spec = load_pipeline_text(json.dumps({**fields, "max_steps": 3, "group": 4}))
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    succeeded = [row.success for row in evaluation.rows]
    assert 0 < sum(succeeded) < len(succeeded), "both ends happen: the test would tell nothing otherwise"
    assert [row.ended for row in evaluation.rows] == [
        EpisodeEnd.TERMINATED if success else EpisodeEnd.TRUNCATED for success in succeeded
    ]
    table = list(csv.DictReader(evaluation.outputs.grades_csv.read_text().splitlines()))
    assert [line["ended"] for line in table] == [str(row.ended) for row in evaluation.rows]
    stored = json.loads(evaluation.outputs.grades_json.read_text())
    assert [GradeRow.from_dict(row) for row in stored] == list(evaluation.rows)


@pytest.mark.parametrize(
    "given",
    ["cartpole_pd", "/tmp/my evals/cartpole.yaml", "/tmp/it's/cartpole.yaml", '/tmp/"quoted"/cartpole.yaml'],
)
def test_a_command_a_failure_gives_is_rewritten_whole_as_the_run_was_asked(given: str) -> None:
    """The pipeline word of the printed command is replaced whole, however ``shlex`` quoted it."""
    from hud_pipelines.cli.selection import as_invoked, asked_command

    asked = asked_command(given, None, Path("/tmp/out put"), "gpu")
    for written in ([given], [given, "--outputs", "/tmp/out put"]):  # the outputs it names are the run's too
        printed = shlex.join(["hud-pipelines", "run", *written, "--partition", "a/0"])
        rewritten = as_invoked(f"1 instance(s) failed; re-run them with: {printed}", asked)
        assert rewritten.endswith("re-run them with: " + shlex.join([*asked, "--partition", "a/0"]))
        assert shlex.split(rewritten.split("re-run them with: ")[1]) == [*asked, "--partition", "a/0"]


def test_a_dataset_section_that_does_not_fit_the_sims_contract_is_refused_before_any_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.errors import ContractError

    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, dataset={"repo_id": "local/placed", "state_features": ["state", "joints"]})
    with pytest.raises(ContractError, match=r"placed: the dataset section does not fit the sim's contract: .*'joints'"):
        evaluate(spec, outputs_dir=tmp_path / "out", project_dir=REPO)
    assert not list((tmp_path / "out").rglob("rollouts/*.json")), "no episode ran only for its dataset to be refused"
    from hud_pipelines.cli.main import main

    yaml = tmp_path / "placed.yaml"
    yaml.write_text(json.dumps(spec.model_dump(mode="json", exclude_none=True, by_alias=True)))
    assert main(["run", str(yaml), "--outputs", str(tmp_path / "dagster"), "--quiet"]) == 1
    said = capsys.readouterr().out
    at = re.escape(f"{yaml.resolve()}:1:") + r"\d+: dataset\.state_features: "  # its line, as validate names it
    assert re.search(at + "the dataset section does not fit the sim's contract", said), said
    assert not list((tmp_path / "dagster").rglob("rollouts/*.json")), "nor in a Dagster run"


@pytest.mark.parametrize("shards", [1, 2])
def test_a_spawned_sims_frame_limit_is_the_yamls(tmp_path: Path, shards: int) -> None:
    """A reset of 512 CartPole slots is a frame of about 25 kB (13 kB a shard): over a limit of 0.01 MiB the instance
    ends as ``sim_link`` naming the key that raises it, and with that key raised the episodes run."""

    def run(name: str, limit: float) -> list[GradeRow]:
        sim = {"factory": "CartPole-v1", "num_envs": 512, "shards": shards, "max_frame_mb": limit}
        spec = _spec(tmp_path, name=name, sim=sim, max_steps=2, dataset=None)
        return evaluate(spec, outputs_dir=tmp_path / name, project_dir=REPO).rows

    refused = run("small", 0.01)
    assert {(row.status, row.fault) for row in refused} == {(EpisodeStatus.ERRORED.value, Fault.SIM_LINK.value)}
    said = refused[0].error or ""
    assert "a message exceeded the frame limit" in said, said
    assert "sim.max_frame_mb" in said, said
    assert {(row.status, row.steps) for row in run("raised", 0.1)} == {(EpisodeStatus.FAILED.value, 2)}, "graded"


NARROW_CAMERA = '''
import gymnasium as gym
import numpy as np


class Narrow(gym.Env):
    """A 16-pixel-wide camera and a position."""

    observation_space = gym.spaces.Dict(
        {
            "pixels": gym.spaces.Box(0, 255, (24, 16, 3), np.uint8),
            "state": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observation(), {}

    def step(self, action):
        return self._observation(), 0.0, False, False, {}

    def _observation(self):
        return {"pixels": np.zeros((24, 16, 3), np.uint8), "state": np.zeros(2, np.float32)}
'''


def test_a_camera_too_narrow_for_the_datasets_codec_is_refused_before_any_rollout(tmp_path: Path) -> None:
    """SVT-AV1 ended the eval's process (SIGFPE) at the first episode's video: no grade, no report."""
    from hud_pipelines.errors import ContractError

    (tmp_path / "narrow.py").write_text(NARROW_CAMERA)
    spec = _spec(
        tmp_path,
        sim={"factory": f"{tmp_path / 'narrow.py'}:Narrow", "num_envs": 1},
        agent={"policy": {"kind": "random"}},
        max_steps=3,
        graders=[{"kind": "return"}],
        dataset={"repo_id": "local/placed", "video": True, "codec": "libsvtav1"},
    )
    with pytest.raises(ContractError, match="camera 'pixels' is 16 pixels wide: codec libsvtav1 crashes the process"):
        evaluate(spec, outputs_dir=tmp_path / "out", project_dir=REPO)
    assert not list((tmp_path / "out").rglob("rollouts/*.json"))
