"""``hud-pipelines validate`` and ``hud-pipelines schema`` handlers, called directly and once as a process."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hud_pipelines.cli.validate import add_schema_arguments, add_validate_arguments, run_schema, run_validate
from hud_pipelines.spec.schema import render_json_schema, render_markdown

WriteYaml = Callable[..., Path]
SPEC_TESTS = Path(__file__).parent
ROOT = SPEC_TESTS.parents[1]


def validate(*argv: str | Path) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_validate_arguments(parser)
    out = io.StringIO()
    code = run_validate(parser.parse_args([str(a) for a in argv]), out)
    return code, out.getvalue()


def schema(*argv: str | Path) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_schema_arguments(parser)
    out = io.StringIO()
    code = run_schema(parser.parse_args([str(a) for a in argv]), out)
    return code, out.getvalue()


def test_validate_passes_the_valid_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUD_SIM_TOKEN", "t0ken")
    code, output = validate(SPEC_TESTS / "valid")
    assert code == 0, output
    lines = output.splitlines()
    assert sum(line.startswith("ok  ") for line in lines) == 4
    assert "cartpole_full (2 task(s) x group 3 = 6 partition(s) of 4 slot(s), 24 episodes)" in output
    assert lines[-1] == "4 pipelines valid (deep check)"


def test_validate_prints_every_problem_of_every_file_and_fails() -> None:
    files = [SPEC_TESTS / "broken" / name for name in ("many_problems.yaml", "out_of_range.yaml", "hold_enum.yaml")]
    code, output = validate(*files)
    assert code == 1
    assert output.startswith("9 problems in 3 files:")
    for needle in (
        "many_problems.yaml:8:3: sim.num_env: unknown key 'num_env'",
        "many_problems.yaml:15:8: group:",
        "out_of_range.yaml:15:20: rollout_timeout_s: expected a number > 0, got 0",
        "hold_enum.yaml:5:9: sim.hold:",
    ):
        assert needle in output


def test_deep_problems_are_skipped_with_no_deep() -> None:
    deep_only = SPEC_TESTS / "broken" / "deep_policy_target.yaml"
    assert validate(deep_only)[0] == 1
    code, output = validate("--no-deep", deep_only)
    assert code == 0
    assert output.splitlines()[-1] == "1 pipeline valid (shallow check)"


def test_validate_defaults_to_the_pipelines_directory(
    write_yaml: WriteYaml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = validate()
    assert code == 1
    assert "pipelines: no such file or directory" in output
    write_yaml("name: here\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: random}}\n", "pipelines/here.yaml")
    code, output = validate()
    assert code == 0
    assert "ok  pipelines/here.yaml: here" in output
    elsewhere = tmp_path / "elsewhere"
    write_yaml("name: there\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: random}}\n", "elsewhere/there.yaml")
    monkeypatch.setenv("HUD_PIPELINES_DIR", str(elsewhere))  # where run and the code location look: validate too
    code, output = validate()
    assert code == 0
    assert "ok  elsewhere/there.yaml: there" in output


def test_schema_prints_json_and_markdown() -> None:
    code, output = schema()
    assert code == 0
    assert output == render_json_schema()
    assert json.loads(output)["title"] == "hud-pipelines pipeline"
    code, output = schema("--markdown")
    assert code == 0
    assert output == render_markdown()


def test_schema_writes_and_checks_a_file(tmp_path: Path) -> None:
    target = tmp_path / "out" / "pipeline.schema.json"
    assert schema("--check", "-o", target)[0] == 1
    code, output = schema("-o", target)
    assert code == 0
    assert "wrote" in output
    assert target.read_text(encoding="utf-8") == render_json_schema()
    assert schema("--check", "-o", target) == (0, f"{target} is up to date\n")
    target.write_text("{}", encoding="utf-8")
    code, output = schema("--check", "-o", target)
    assert code == 1
    assert f"regenerate it with: hud-pipelines schema -o {target}" in output


def test_validate_as_a_process_reports_file_line_and_exit_code() -> None:
    broken = SPEC_TESTS / "broken" / "unknown_policy_kind.yaml"
    script = (
        "import argparse, sys\n"
        "from hud_pipelines.cli.validate import add_validate_arguments, run_validate\n"
        "parser = argparse.ArgumentParser()\n"
        "add_validate_arguments(parser)\n"
        "sys.exit(run_validate(parser.parse_args(sys.argv[1:])))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "--no-deep", str(broken)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert (
        "tests/spec/broken/unknown_policy_kind.yaml:7:11: agent.policy.kind: unknown policy kind 'scrpted'"
        in result.stdout
    )
    assert "    7 |     kind: scrpted\n      |           ^^^^^^^" in result.stdout


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback() -> None:
    """``hud-pipelines compare ... | head``: the command's output goes to a pipe its reader closed."""
    command = [sys.executable, "-m", "hud_pipelines.cli", "schema"]  # a long output, no setup
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        process.stdout.close()  # before it writes (it imports for a second first), as `head` that is done does
        _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr.decode(), stderr.decode()[-2000:]
    assert process.returncode in (1, -signal.SIGPIPE)
