"""The eval from the outside: `dagster job execute`, `dg launch`, `hud-pipelines run`, the webserver."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import dagster as dg
import pytest

from hud_pipelines.cli.interrupts import how_to_resume, how_to_resume_sweep
from hud_pipelines.cli.main import main
from hud_pipelines.dagster.overlap import PID_TAG
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.loader import load_pipeline
from tests.dagster.support import REPO, SIMS, WritePipeline, sim_processes

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _env(pipelines_dir: Path, outputs_dir: Path, home: Path, *, new_home: bool = False) -> dict[str, str]:
    """The environment of a CLI run; ``new_home`` leaves the instance's settings to the CLI, as on a new machine."""
    if not new_home:
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {
        **os.environ,
        "HUD_PIPELINES_DIR": str(pipelines_dir),
        "HUD_PIPELINES_OUTPUTS": str(outputs_dir),
        "DAGSTER_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
    }


def test_dagster_job_execute_runs_the_eval_and_fails_on_a_blocking_check(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path
) -> None:
    pid_log = tmp_path / "pids.txt"
    write_pipeline("passing", group=1, sim={"args": {"pid_log": str(pid_log)}})
    write_pipeline(
        "failing",
        group=1,
        checks=[{"kind": "min_success_rate", "value": 1.0}],
        graders=[{"kind": "return", "threshold": 10_000}],
    )
    env = _env(pipelines_dir, outputs_dir, tmp_path / "home")
    command = [str(BIN / "dagster"), "job", "execute", "-m", "hud_pipelines.definitions", "-j"]
    passing = subprocess.run(
        [*command, "passing"], check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert passing.returncode == 0, passing.stderr[-3000:]
    # one sim for the whole run: the CLI initialises resources again after the run, which must not spawn
    assert len(set(pid_log.read_text().split())) == 1
    grades = json.loads((outputs_dir / "passing" / "grades.json").read_text())
    assert len(grades) == 2
    failing = subprocess.run(
        [*command, "failing"], check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert failing.returncode != 0
    assert "min_success_rate" in failing.stdout + failing.stderr


def test_a_dagster_run_cancelled_mid_eval_writes_grades_and_a_report_that_say_so(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path, label: str
) -> None:
    """A run cancelled outside ``hud-pipelines run`` (the UI's Terminate, or ^C on ``dagster job execute``) skipped
    the grades and report: they kept an earlier run's green verdicts while the instances were ``interrupted``."""
    write_pipeline("stopped", group=2, rollout_timeout_s=600, sim={"args": {"stall_seeds": [0, 2]}})
    command = [str(BIN / "dagster"), "job", "execute", "-m", "hud_pipelines.definitions", "-j", "stopped"]
    env = _env(pipelines_dir, outputs_dir, tmp_path / "home")
    run = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(sim_processes(label)) < 2 and time.monotonic() < deadline:  # both instances are stalled
            time.sleep(0.2)
        assert len(sim_processes(label)) == 2
        time.sleep(1.0)
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=60) != 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    outputs = EvalOutputs(outputs_dir, "stopped")
    assert {row["fault"] for row in json.loads(outputs.grades_json.read_text())} == {"interrupted"}
    completed = json.loads(outputs.checks_json.read_text())[0]
    assert (completed["name"], completed["passed"]) == ("instances_completed", False)
    assert completed["description"] == "this run failed: the run was cancelled before its instances ended"
    assert "this run failed, so these are the results it kept" in outputs.report_md.read_text()


def test_dg_launch_runs_a_job(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path
) -> None:
    write_pipeline("launched", group=2, max_concurrent=1)
    env = _env(pipelines_dir, outputs_dir, tmp_path / "home")
    done = subprocess.run(
        [str(BIN / "dg"), "launch", "--job", "launched"],
        check=False,
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (outputs_dir / "launched" / "rollouts").iterdir()) == [
        "task0-i0.json",
        "task0-i1.json",
    ]


@pytest.fixture(name="cli_home")
def cli_home_fixture(pipelines_dir: Path, outputs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment of an in-process ``hud-pipelines run`` (its pipelines, outputs and Dagster home)."""
    for key, value in _env(pipelines_dir, outputs_dir, tmp_path / "home").items():
        monkeypatch.setenv(key, value)
    return tmp_path / "home"


def test_a_partition_run_judges_its_tasks_success_signal_on_their_earlier_results_too(
    write_pipeline: WritePipeline, cli_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Re-running the instance whose seeds give no success signal warned that the task gave none, while the
    task's other instance, kept from the run before, had given it."""
    del cli_home
    write_pipeline("signalled", graders=[{"kind": "success"}], sim={"args": {"signal_seeds": [0, 1]}})
    assert main(["run", "signalled", "--quiet"]) == 0
    assert "success signal" not in capsys.readouterr().out
    assert main(["run", "signalled", "--quiet", "--partition", "task0-i1"]) == 0
    out = capsys.readouterr().out
    assert "failed 4" in out, "the summary counts the task's four current episodes"
    assert "success signal" not in out


def test_hud_pipelines_run_prints_a_summary_and_sets_the_exit_code(
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    outputs_dir: Path,
    tmp_path: Path,
    cli_home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_pipeline("summarised", group=2, checks=[{"kind": "min_success_rate", "value": 0.5}])
    assert main(["run", "summarised", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "summarised: per-slot grades" in out
    assert "succeeded 4" in out
    assert "run succeeded" in out
    assert (cli_home / "history").is_dir()  # the run was recorded on the local instance
    with dg.DagsterInstance.get() as instance:
        [recorded] = instance.get_runs(limit=1)
    assert recorded.tags[PID_TAG] == str(os.getpid()), "what tells a live run from one a killed process left"

    write_pipeline(
        "strict",
        group=1,
        checks=[{"kind": "min_success_rate", "value": 1.0}],
        graders=[{"kind": "return", "threshold": 10_000}],
        dataset={"repo_id": "local/strict"},
    )
    assert main(["run", str(pipelines_dir / "strict.yaml"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "run FAILED" in out
    assert "failed 2" in out
    assert "dataset not published (a blocking check failed): none was published before" in out, "none to take for it"
    assert "blocking check min_success_rate failed: min_success_rate: observed 0.0% (0/2), threshold 100.0%" in out
    assert main(["run", "no_such_pipeline", "--quiet"]) == 2
    assert "no pipeline named 'no_such_pipeline'" in capsys.readouterr().err
    assert main(["run", "stritc", "--quiet"]) == 2
    assert "no pipeline named 'stritc' in " in (err := capsys.readouterr().err)
    assert "(did you mean 'strict'?)" in err
    (pipelines_dir / "unloadable.yaml").write_text("name: unloadable\nsim: {factory: CartPole-v1, num_envs: 0}\n")
    assert main(["run", "unloadabel", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unloadable (does not load: agent: missing required key " in err, "listed, and why"
    assert "(did you mean 'unloadable'?)" in err
    (pipelines_dir / "unloadable.yaml").unlink()
    (pipelines_dir / "my_env.py").write_text("")
    missing = write_pipeline("missing", sim={"factory": "my_envs.py:make", "args": {}})
    assert main(["run", str(missing), "--quiet"]) == 2, "found before any sim starts"
    err = capsys.readouterr().err
    assert "missing.yaml:4:16: sim.factory: file " in err, err
    assert "my_envs.py does not exist (did you mean 'my_env.py'?)" in err
    assert not (outputs_dir / "missing").exists(), "nothing ran"
    (tmp_path / "a_file").write_text("")  # where the outputs folder would go: said before any sim starts
    assert main(["run", str(pipelines_dir / "strict.yaml"), "--quiet", "--outputs", str(tmp_path / "a_file")]) == 2
    err = capsys.readouterr().err
    assert (
        f"cannot write the outputs at {tmp_path / 'a_file' / 'strict'}: {tmp_path / 'a_file'} is not a directory" in err
    )
    proc = Path("/proc/no_such_pid")  # root may write there, but procfs makes no folders: it was a traceback
    assert main(["run", str(pipelines_dir / "strict.yaml"), "--quiet", "--outputs", str(proc)]) == 2
    err = capsys.readouterr().err
    assert "cannot write the outputs at /proc/no_such_pid/strict: " in err, err
    assert "no folder can be made in /proc" in err or "/proc is not writable" in err, err

    unstartable = write_pipeline(
        "unstartable", group=1, sim={"factory": f"{SIMS}:faulty", "args": {"fault": "raise_build"}}
    )
    elsewhere = tmp_path / "elsewhere outputs"
    root = logging.getLogger()
    configured = logging.StreamHandler(sys.stderr)  # as a library's module-level logging.info() sets up the root
    configured.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    root.addHandler(configured)
    try:
        assert main(["run", str(unstartable), "--outputs", str(elsewhere), "--quiet"]) == 1
    finally:
        root.removeHandler(configured)
    said = capsys.readouterr()
    assert "\ninstance task0-i0 of unstartable failed (sim_start): the sim did not start" in f"\n{said.err}", said.err
    assert "ERROR:hud_pipelines" not in said.err, "the run's lines read the same however logging was set up"
    lines = said.out.splitlines()
    rerun = shlex.join(
        ["hud-pipelines", "run", str(unstartable), "--outputs", str(elsewhere), "--partition", "task0-i0"]
    )
    [failed] = [line for line in lines if "check instances_completed failed" in line]  # one line, never folded
    assert failed.endswith(f"re-run them with: {rerun}"), "the command as this run was asked, quoted for a shell"
    written = json.loads(EvalOutputs(elsewhere, load_pipeline(unstartable).name).checks_json.read_text())
    [completed] = [check for check in written if check["name"] == "instances_completed"]
    kept = shlex.join(["hud-pipelines", "run", "unstartable", "--outputs", str(elsewhere), "--partition", "task0-i0"])
    assert completed["description"].endswith(f"re-run them with: {kept}"), "the file's runs where its results are"
    table = "\n".join(line for line in lines if line.startswith("│"))
    assert "the sim did not" in table
    assert "…" in table, "a reason cut to the table's cell says it was cut"

    outside = tmp_path / "elsewhere" / "outside.yaml"  # not in the pipelines directory: named by its path
    outside.parent.mkdir()
    outside.write_text(unstartable.read_text())
    assert main(["run", str(outside), "--quiet"]) == 1
    capsys.readouterr()
    name = load_pipeline(outside).name
    checks = json.loads(EvalOutputs(outputs_dir, name).checks_json.read_text())
    [completed] = [check for check in checks if check["name"] == "instances_completed"]
    again = f"re-run them with: hud-pipelines run {outside} --outputs {outputs_dir} --partition task0-i0"
    assert completed["description"].endswith(again), "named where $HUD_PIPELINES_OUTPUTS put them: a shell may lack it"


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""
RUN_STATUS = "query Status($runId: ID!) { runOrError(runId: $runId) { ... on Run { status } } }"
RESOURCES = """
query Resources($selector: RepositorySelector!) {
  allTopLevelResourceDetailsOrError(repositorySelector: $selector) {
    __typename
    ... on ResourceDetailsList { results { name description configuredValues { key value } } }
  }
}
"""


def _graphql(port: int, query: str, variables: dict[str, object]) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert "errors" not in answer, answer
    return answer["data"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_webserver_serves_every_pipelines_assets_and_launches_a_run(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path
) -> None:
    write_pipeline("shown_a")
    write_pipeline("shown_b")
    port = _free_port()
    env = _env(pipelines_dir, outputs_dir, tmp_path / "home")
    # no daemon here to dequeue runs: launch them directly, like `dagster dev` does through its daemon
    with (tmp_path / "home" / "dagster.yaml").open("a") as settings:
        settings.write("run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n")
    with (tmp_path / "webserver.log").open("w") as log:  # a file, so a chatty server never fills a pipe
        server = subprocess.Popen(
            [str(BIN / "dagster-webserver"), "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        query = json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode()
        deadline = time.monotonic() + 90
        keys: set[str] = set()
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/graphql", data=query, headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    nodes = json.loads(response.read())["data"]["assetNodes"]
                keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
                if keys:
                    break
            except OSError:
                time.sleep(0.5)
        for name in ("shown_a", "shown_b"):
            assert {f"{name}/{asset}" for asset in ("contract", "rollouts", "grades", "report")} <= keys
        # the UI's resources page: four resources per pipeline, described, configured from the YAML
        listed = _graphql(
            port,
            RESOURCES,
            {"selector": {"repositoryLocationName": "hud_pipelines.definitions", "repositoryName": "__repository__"}},
        )["allTopLevelResourceDetailsOrError"]
        resources = {r["name"]: r for r in listed["results"]}
        for part in ("sim", "contract", "agent", "graders"):
            assert resources[f"shown_a__{part}"]["description"]
        configured = {v["key"]: v["value"] for v in resources["shown_a__sim"]["configuredValues"]}
        assert configured["num_envs"] == "2"
        # launch a run the way the UI does, and wait for it
        launched = _graphql(
            port,
            LAUNCH,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": "hud_pipelines.definitions",
                        "repositoryName": "__repository__",
                        "jobName": "shown_a",
                    },
                    "mode": "default",
                }
            },
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        status = ""
        deadline = time.monotonic() + 180
        while status not in ("SUCCESS", "FAILURE", "CANCELED") and time.monotonic() < deadline:
            time.sleep(1.0)
            status = _graphql(port, RUN_STATUS, {"runId": run_id})["runOrError"]["status"]
        assert status == "SUCCESS"
        assert len(json.loads((outputs_dir / "shown_a" / "grades.json").read_text())) == 4
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _run_in_background(
    name: str, log: Path, pipelines_dir: Path, outputs_dir: Path, home: Path, *, new_home: bool = False
) -> subprocess.Popen[bytes]:
    """``hud-pipelines run <name>`` in a session of its own (a signal reaches it alone), its output in ``log``."""
    with log.open("w") as output:
        return subprocess.Popen(
            [str(BIN / "hud-pipelines"), "run", name, "--quiet"],
            env=_env(pipelines_dir, outputs_dir, home, new_home=new_home),
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


SLEEPY = {"kind": "scripted", "target": f"{REPO}/tests/eval/faulty_policies.py:Sleepy", "args": {"seconds": 600}}


def test_an_interrupted_sweep_says_that_the_same_command_evaluates_the_rest() -> None:
    command = ["hud-pipelines", "run", "my sweep.yaml"]
    assert how_to_resume(["a-i1", "b-i0"], command, ["a-i0", "a-i1", "b-i0"]) == (
        "; to run only those: hud-pipelines run 'my sweep.yaml' --partition a-i1 --partition b-i0"
    )
    asked = {"--checkpoint": ["002000"], "--partition": []}
    assert how_to_resume_sweep(4, command, asked, rerun=False) == (
        "; to evaluate the rest, run the same command again: hud-pipelines run 'my sweep.yaml' --checkpoint 002000"
    )
    assert "keep their current results" in how_to_resume_sweep(4, command, asked, rerun=True)
    assert how_to_resume_sweep(0, command, asked, rerun=False) == ""


@pytest.mark.parametrize("stalled", ["sim", "policy"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cancelling_a_run_leaves_no_sim_behind(
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    outputs_dir: Path,
    tmp_path: Path,
    label: str,
    signum: signal.Signals,
    stalled: str,
) -> None:
    stall: dict[str, Any] = (
        {"sim": {"args": {"stall_seeds": [0, 2]}}} if stalled == "sim" else {"agent": {"policy": SLEEPY}}
    )
    write_pipeline("cancelled", group=2, rollout_timeout_s=600, dataset={"repo_id": "local/cancelled"}, **stall)
    log = tmp_path / "run.log"
    run = _run_in_background("cancelled", log, pipelines_dir, outputs_dir, tmp_path / "home", new_home=True)
    try:
        deadline = time.monotonic() + 120
        while len(sim_processes(label)) < 2 and time.monotonic() < deadline:  # both instances are stalled
            time.sleep(0.2)
        assert len(sim_processes(label)) == 2, log.read_text()[-3000:]
        time.sleep(1.0)
        signalled = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(run.pid, signum)  # as a terminal's Ctrl-C: to the run's whole process group
        else:
            run.send_signal(signum)  # as `kill` or `docker stop`: to the run alone
        assert run.wait(timeout=60) == 128 + signum  # 130 for SIGINT, 143 for SIGTERM
        assert time.monotonic() - signalled < 20
        deadline = time.monotonic() + 15  # a sim whose parent is gone stops within its grace period
        while sim_processes(label) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sim_processes(label)
        printed = log.read_text()
        assert f"run interrupted by {signum.name} after 0 of 2 instance(s)" in printed, printed[-3000:]
        assert "DagsterExecutionInterruptedError" not in printed, "the interrupt is said once, in words"
        assert "Traceback" not in printed, "Dagster's log helpers in the run's group are not interrupted"
        assert "the instances it did not finish keep their earlier results" in " ".join(printed.split())
        assert "to run only those: hud-pipelines run cancelled --partition task0-i0 --partition task0-i1" in printed
        assert "this run: success rate n/a; scheduled 4 = succeeded 0 + failed 0 + errored 4" in printed
        outputs = EvalOutputs(outputs_dir, "cancelled")
        rows = json.loads(outputs.grades_json.read_text())
        assert {(r["fault"], r["run_id"] != "") for r in rows} == {("interrupted", True)}
        graded = [  # a trace's own grade line says what grades.json says (it said the sim crashed)
            json.loads(line)
            for path in outputs.base.joinpath("traces").rglob("*.jsonl")
            for line in path.read_text().splitlines()
            if '"type":"grade"' in line.replace(" ", "")
        ]  # an episode the interrupt cut before its end in the agent has none, as the moment falls
        assert {line["error"].splitlines()[0] for line in graded} <= {r["error"] for r in rows}, graded
        assert "(interrupted): the run was interrupted before instance" in outputs.report_md.read_text()
        checks = {c["name"]: c["passed"] for c in json.loads(outputs.checks_json.read_text())}
        assert checks["instances_completed"] is False
        staging = [p for p in outputs.base.rglob(".*") if p.is_dir()]
        assert not staging, staging
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_an_interrupted_cli_run_whose_instances_keep_earlier_results_writes_checks_that_fail(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path, label: str
) -> None:
    """The instances an interrupt cuts short keep their earlier complete results, which pass every check: the
    run said FAILED while its checks.json and report were all green, without a word of the interrupt."""
    hold = tmp_path / "hold"
    held = Path(__file__).with_name("celery_sims.py").resolve()
    sim = {"factory": f"{held}:held_cartpole", "args": {"hold_file": str(hold), "hold_seeds": [0, 2]}}
    write_pipeline("kept", group=2, rollout_timeout_s=600, dataset={"enabled": False}, sim=sim)
    home = tmp_path / "home"
    first = subprocess.run(
        [str(BIN / "hud-pipelines"), "run", "kept", "--quiet"],
        check=False,
        env=_env(pipelines_dir, outputs_dir, home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert first.returncode == 0, first.stdout[-3000:]
    hold.touch()  # the same configuration, now held at its fifth step
    log = tmp_path / "run.log"
    run = _run_in_background("kept", log, pipelines_dir, outputs_dir, home)
    try:
        deadline = time.monotonic() + 120
        while not hold.with_name("hold.held").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    outputs = EvalOutputs(outputs_dir, "kept")
    completed = json.loads(outputs.checks_json.read_text())[0]
    assert (completed["name"], completed["passed"]) == ("instances_completed", False), log.read_text()[-3000:]
    assert "the run was interrupted by SIGTERM before its instances ended" in completed["description"]
    assert "**Warning:** this run failed" in outputs.report_md.read_text()


def test_an_instance_the_interrupt_cuts_short_keeps_the_episodes_it_had_finished(
    write_pipeline: WritePipeline, pipelines_dir: Path, outputs_dir: Path, tmp_path: Path, label: str
) -> None:
    """Slot 1 (seed 1) ends at its first step, slot 0 (seed 0) stalls at its fifth; a SIGTERM then ends the
    run: the finished episode keeps its grade, the stalled one is ``interrupted`` (both were ``interrupted``)."""
    sim = {"args": {"stall_seeds": [0], "short_seeds": [1]}}
    write_pipeline("cut", group=1, rollout_timeout_s=600, dataset={"enabled": False}, sim=sim)
    log = tmp_path / "run.log"
    run = _run_in_background("cut", log, pipelines_dir, outputs_dir, tmp_path / "home")
    try:
        traces = EvalOutputs(outputs_dir, "cut").base / "traces"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any('"grade"' in t.read_text() for t in traces.rglob("*.jsonl")):
            time.sleep(0.2)  # until the short episode's trace has its grade: slot 0 stalls by then
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 128 + signal.SIGTERM, log.read_text()[-3000:]
        rows = json.loads(EvalOutputs(outputs_dir, "cut").grades_json.read_text())
        assert [(r["seed"], r["status"], r["fault"], r["steps"]) for r in rows] == [
            (0, "errored", "interrupted", 4),
            (1, "failed", None, 1),
        ], log.read_text()[-3000:]
        printed = log.read_text()
        assert "scheduled 2 = succeeded 0 + failed 1 + errored 1" in printed, printed[-3000:]
        assert "(one without records the episodes it finished); to run only those: hud-pipelines run cut" in printed
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_hud_pipelines_contract_writes_the_file_and_keeps_edits(
    write_pipeline: WritePipeline, pipelines_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pipeline("contracted", sim={"contract": "contracts/contracted.json"})
    written = pipelines_dir / "contracts" / "contracted.json"
    assert main(["contract", str(path)]) == 0
    assert "state" in capsys.readouterr().out
    edited = json.loads(written.read_text())
    edited["features"]["state"]["description"] = "cart position, velocity, pole angle, angular velocity"
    written.write_text(json.dumps(edited))
    assert main(["contract", str(path)]) == 0  # derived again: the edit survives
    assert json.loads(written.read_text())["features"]["state"]["description"].startswith("cart position")
    other = pipelines_dir / "elsewhere.json"
    assert main(["contract", str(path), "--out", str(other)]) == 0
    assert json.loads(other.read_text())["features"]["action"]["shape"] == [1]


def test_the_regression_gate_fails_every_entry_point_when_the_candidate_is_worse(
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    outputs_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``no_regression`` against a baseline on the same episodes: exit 1 through the CLI, dagster and dg."""
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.recording.events import EpisodeStatus

    env = _env(pipelines_dir, outputs_dir, tmp_path / "home")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    write_pipeline("gated", group=4, graders=[{"kind": "return", "threshold": 10_000}])  # every episode fails
    assert main(["run", "gated", "--quiet"]) == 0  # no gate yet: failed episodes fail no check
    rows = [GradeRow.from_dict(r) for r in json.loads((outputs_dir / "gated" / "grades.json").read_text())]
    assert {row.status for row in rows} == {EpisodeStatus.FAILED}
    baseline = [{**row.as_dict(), "status": "succeeded", "success": True, "score": 1.0} for row in rows]
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))  # the same episodes, all succeeded
    gate = [{"kind": "no_regression", "baseline": str(tmp_path / "baseline.json"), "max_drop": 0.05}]
    write_pipeline("gated", group=4, graders=[{"kind": "return", "threshold": 10_000}], checks=gate)

    assert main(["run", "gated", "--quiet"]) == 1
    for command in (
        [str(BIN / "dagster"), "job", "execute", "-m", "hud_pipelines.definitions", "-j", "gated"],
        [str(BIN / "dg"), "launch", "--job", "gated"],
    ):
        done = subprocess.run(command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert done.returncode != 0, f"{command[1]}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        assert "no_regression" in done.stdout + done.stderr


def test_a_run_that_failed_where_no_step_says_why_is_said_by_its_own_failure() -> None:
    """A step that died on a worker before it could start (its YAML names a variable that worker lacks) fails
    the run with no step failure of its own: the run's failure says why (only 'run FAILED' was printed)."""
    from dagster._core.events import DagsterEvent, JobFailureData
    from dagster_shared.error import SerializableErrorInfo

    from hud_pipelines.cli.run import _problems  # pyright: ignore[reportPrivateUsage]

    said = "During celery execution errors occurred in workers:\n[u0]: SpecError: sim.token: SIMTOK is not set\n"
    error = SerializableErrorInfo(message=said, stack=[], cls_name="DagsterSubprocessError")
    failure = DagsterEvent(
        event_type_value="PIPELINE_FAILURE",
        job_name="fleet",
        event_specific_data=JobFailureData(error=error, failure_reason=None),
    )

    class Failed:
        def __init__(self) -> None:
            self.all_events = [failure]

        def get_asset_check_evaluations(self) -> list[Any]:
            return []

    [line] = _problems(cast(Any, Failed()), ["hud-pipelines", "run", "fleet"], [], None)
    assert line == "run failed: " + " / ".join(said.strip().splitlines()), "in one line, the cause at its end"


def test_a_new_local_instance_runs_two_runs_at_a_time_without_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's sensor requests a run per new checkpoint: with Dagster's default of ten at once, the trial
    saw four runs, each with its sims, share two cores."""
    import dagster as dg

    from hud_pipelines.cli.run import ensure_dagster_home

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    home = ensure_dagster_home(tmp_path)
    assert home == tmp_path / ".dagster_home"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None
        assert queue.max_concurrent_runs == 2
        assert not instance.telemetry_enabled
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # the user's own settings are kept
    ensure_dagster_home(tmp_path)
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_a_run_says_when_another_live_run_of_its_pipeline_is_running() -> None:
    """Two `hud-pipelines run` of one pipeline at once ran the same instances twice, each unaware of the other.
    A run that a killed process left as STARTED is not one: its process is gone."""
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun

    from hud_pipelines.dagster.overlap import (
        HOST_TAG,
        PID_RUN_TAG,
        PID_TAG,
        PIPELINE_TAG,
        launcher_tags,
        overlapping_runs,
    )

    gone = subprocess.Popen(["true"])
    gone.wait()
    with dg.instance_for_test() as instance:
        assert overlapping_runs(instance, "cart") == []
        for run_id, pid, job in (
            ("live", os.getpid(), "cart"),
            ("dead", gone.pid, "cart"),
            ("other", os.getpid(), "x"),
        ):
            tags = {**launcher_tags(run_id), PID_TAG: str(pid)}
            instance.add_run(DagsterRun(job_name=job, run_id=run_id, status=dg.DagsterRunStatus.STARTED, tags=tags))
        elsewhere = {HOST_TAG: "another-host", PID_TAG: str(os.getpid())}
        instance.add_run(DagsterRun(job_name="cart", run_id="away", status=dg.DagsterRunStatus.STARTED, tags=elsewhere))
        done = DagsterRun(
            job_name="cart", run_id="done", status=dg.DagsterRunStatus.SUCCESS, tags=launcher_tags("done")
        )
        instance.add_run(done)
        [said] = overlapping_runs(instance, "cart")
        assert said.startswith(
            f"run live of cart, started by another `hud-pipelines run` (process {os.getpid()}), is still"
        )
        here = {HOST_TAG: launcher_tags("")[HOST_TAG], PID_TAG: str(os.getpid())}
        sensed = {**here, PID_RUN_TAG: "sensed", "dagster/sensor_name": "cart_sweep__checkpoints"}
        copied = {**launcher_tags("parent"), PIPELINE_TAG: "cart"}  # a re-execution's, copied from its parent run
        backfill = DagsterRun(
            job_name="__ASSET_JOB",
            run_id="ui",
            status=dg.DagsterRunStatus.STARTED,
            tags={**here, PID_RUN_TAG: "ui"},
            asset_selection=frozenset({dg.AssetKey(["cart", "rollouts"])}),  # "Materialize all": a backfill's run
        )
        instance.add_run(backfill)
        for run_id, tags in (("sensed", sensed), ("child", copied)):
            instance.add_run(DagsterRun(job_name="cart", run_id=run_id, status=dg.DagsterRunStatus.STARTED, tags=tags))
        said = sorted(overlapping_runs(instance, "cart"))
        assert len(said) == 3, "a re-execution's copied tags name no process of its own"
    assert said[1].startswith("run sensed of cart, launched by the sensor cart_sweep__checkpoints (process")
    assert said[2].startswith("run ui of cart, launched from Dagster (the UI, `dagster job execute` or `dg launch`)")


def test_an_interrupt_after_the_last_instance_ended_says_so_and_the_checks_judge_this_runs_results(
    write_pipeline: WritePipeline,
    outputs_dir: Path,
    cli_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, a Ctrl-C while the dataset was written said "after 2 of 2 instance(s); the instances it did not
    finish keep their earlier results", and the checks and report said the run failed before its instances
    ended, of instances that had all ended in this run."""
    write_pipeline("late", group=2, dataset={"repo_id": "local/late"})

    def interrupted(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C while the dataset is written
        time.sleep(5)

    monkeypatch.setattr("hud_pipelines.dagster.assets.dataset_step", interrupted)
    assert main(["run", "late", "--quiet"]) == 130
    printed = " ".join(capsys.readouterr().out.split())
    said = "run interrupted by SIGINT after 2 of 2 instance(s); every instance had ended, and their results are kept"
    assert said in printed, printed[-3000:]
    outputs = EvalOutputs(outputs_dir, "late")
    checks = {check["name"]: check for check in json.loads(outputs.checks_json.read_text())}
    assert checks["instances_completed"]["passed"], checks["instances_completed"]["description"]
    assert "this run failed" not in outputs.report_md.read_text()


def test_a_sigterm_while_an_interrupted_run_writes_its_files_lets_it_write_its_report(
    write_pipeline: WritePipeline, outputs_dir: Path, cli_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor that escalates a Ctrl-C with SIGTERM: the run's handlers were gone once its job returned, so the
    SIGTERM killed it between its checks and its report, and the report kept the earlier run's green verdict."""
    from hud_pipelines.eval import steps

    write_pipeline("escalated", group=2, dataset={"repo_id": "local/escalated"})
    assert main(["run", "escalated", "--quiet"]) == 0

    def interrupted(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C while the dataset is written
        time.sleep(5)

    def terminated(*args: Any, **kwargs: Any) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        assert handler not in (signal.SIG_DFL, None), "a SIGTERM now kills the run before its report"
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's, while the grades and checks are written
        real(*args, **kwargs)

    real = steps.failed_run_step
    monkeypatch.setattr("hud_pipelines.dagster.assets.dataset_step", interrupted)
    monkeypatch.setattr(steps, "failed_run_step", terminated)
    outputs = EvalOutputs(outputs_dir, "escalated")
    [first] = re.findall(r"^Run `([^`]+)` produced", outputs.report_md.read_text(), re.MULTILINE)
    assert main(["run", "escalated", "--quiet"]) == 130
    [second] = re.findall(r"^Run `([^`]+)` produced", outputs.report_md.read_text(), re.MULTILINE)
    assert second != first, "the report is the interrupted run's, not the earlier one's"


def test_finishing_a_run_notes_the_first_signal_and_stops_at_the_second() -> None:
    """The first signal after a run ended waits for its report; a second stops it at once (a big sweep's reports take
    a while), and the handlers of before come back after."""
    from hud_pipelines.cli.interrupts import catching_interrupts, finishing_despite_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with finishing_despite_signals() as late:
        with catching_interrupts():
            pass
        signal.raise_signal(signal.SIGTERM)  # its handler runs before raise_signal returns
        assert late == {"signal": signal.SIGTERM}, "noted, not acted on, once the run's own handlers are gone"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_runs_log_lines_go_to_stderr_as_it_is_when_they_come_and_leave_logging_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A progress bar puts a proxy on ``sys.stderr`` that prints a line above the bar: a handler holding the stream
    of the moment the run began wrote into the bar's line instead."""
    import io

    from hud_pipelines.cli.log_lines import plain_package_log

    logger = logging.getLogger("hud_pipelines")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with plain_package_log():
        swapped = io.StringIO()  # as rich's Progress swaps in its proxy once the bar starts
        monkeypatch.setattr(sys, "stderr", swapped)
        logging.getLogger("hud_pipelines.eval.runner").error("instance %s failed", "task0-i0")
        logging.getLogger("hud_pipelines.eval.runner").info("not at this level")
    assert swapped.getvalue() == "instance task0-i0 failed\n"
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
