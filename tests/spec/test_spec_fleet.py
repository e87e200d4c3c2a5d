"""``sim.fleet``: a file of served sims with their own tokens; every problem in it is named at its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hud_pipelines.eval.runner import sim_settings
from hud_pipelines.spec.fleet import fleet_problems, load_fleet
from hud_pipelines.spec.loader import load_file, load_pipeline_text, load_pipeline_to_run
from hud_pipelines.spec.problems import SpecError, display_path

ENV = {"LAB_TOKEN": "lab-secret", "B_TOKEN": "b-secret"}
FLEET = """\
token: ${LAB_TOKEN}
servers:
  - ws://sim-a:8765
  - url: ws://sim-b:8765
    token: ${B_TOKEN}
"""


def _pipeline(tmp_path: Path, **sim: object) -> str:
    text = {"name": "on_fleet", "sim": {"num_envs": 2, **sim}, "agent": {"policy": {"kind": "random"}}}
    path = tmp_path / "on_fleet.yaml"
    path.write_text(json.dumps(text))
    return str(path)


def test_each_server_gets_its_own_token_or_the_fleets(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(FLEET)
    fleet = load_fleet(tmp_path / "lab.yaml", ENV)
    assert fleet.resolved() == [("ws://sim-a:8765", "lab-secret"), ("ws://sim-b:8765", "b-secret")]
    assert "secret" not in repr(fleet), "tokens are secrets"


def test_a_pipeline_names_its_fleet_file_relative_to_itself_and_the_pool_attaches_with_its_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fleets").mkdir()
    (tmp_path / "fleets" / "lab.yaml").write_text(FLEET)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    path = _pipeline(tmp_path, fleet="fleets/lab.yaml")
    monkeypatch.chdir("/")
    loaded = load_file(Path(path), deep=True)
    assert loaded.problems == []
    assert loaded.spec is not None
    assert sim_settings(loaded.spec).servers == (("ws://sim-a:8765", "lab-secret"), ("ws://sim-b:8765", "b-secret"))
    rotated = load_pipeline_text(Path(path).read_text(), source=path)
    monkeypatch.setenv("B_TOKEN", "rotated")
    assert load_pipeline_text(Path(path).read_text(), source=path).rollout_hash == rotated.rollout_hash, (
        "a new token is not a new eval"
    )


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("servers:\n  - ws://sim-a:8765\n", 1, "ws://sim-a:8765 has no token"),
        ("token: ${LAB_TOKEN}\nservers:\n  - http://sim-a:8765\n", 3, "expected a ws:// or wss:// URL"),
        ("token: ${NOT_SET_ANYWHERE}\nservers: [ws://a:1]\n", 1, "NOT_SET_ANYWHERE is not set"),
        ("token: t\nservers: [ws://a:1, ws://a:1]\n", 1, "ws://a:1 is listed twice"),
        ("token: t\nservers: []\n", 2, "at least 1 item"),
        ("token: t\nserver: [ws://a:1]\n", 2, "server"),
        ("", 1, "the fleet file is empty"),
    ],
)
def test_a_fleet_file_problem_is_named_at_its_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(text)
    problems = fleet_problems(path, ENV)
    assert problems, text
    assert any(p.line == line and message in p.message for p in problems), [(p.line, p.message) for p in problems]
    assert all(p.file.endswith("lab.yaml") for p in problems)
    with pytest.raises(SpecError):
        load_fleet(path, ENV)


def test_validate_reports_a_missing_fleet_file_and_a_fleet_with_a_pipeline_token(tmp_path: Path) -> None:
    pipeline = Path(_pipeline(tmp_path, fleet="fleets/none.yaml"))
    missing = load_file(pipeline, deep=True)  # said at the pipeline's key, not as the missing file's own problem
    [problem] = missing.problems
    assert (problem.file, problem.path) == (display_path(pipeline), "sim.fleet"), problem
    assert problem.line > 0
    assert problem.message == f"no fleet file at {tmp_path / 'fleets' / 'none.yaml'}"
    with pytest.raises(SpecError, match=r"sim\.fleet: no fleet file at "):
        load_pipeline_to_run(pipeline)  # as a run refuses it, before it starts
    both = load_file(Path(_pipeline(tmp_path, fleet="lab.yaml", token="t")), deep=False)
    assert any("a sim fleet's tokens are in its file" in p.message for p in both.problems)
    with_url = load_file(Path(_pipeline(tmp_path, fleet="lab.yaml", url="ws://a:1", token="t")), deep=False)
    assert any("exclude each other" in p.message for p in with_url.problems)


def test_an_entry_that_is_a_url_or_a_mapping_gets_one_problem_in_the_fleet_files_own_words(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("token: t\nservers:\n  - http://sim-a:8765\n  - {url: ws://sim-b:8765, tokn: abc}\n")
    problems = [(p.line, p.path, p.message) for p in fleet_problems(path, ENV)]
    assert problems == [
        (3, "servers[0]", "expected a ws:// or wss:// URL or a mapping, got 'http://sim-a:8765'"),
        (4, "servers[1].tokn", "unknown key 'tokn' (did you mean 'token'?); expected one of: url, token"),
    ], problems
