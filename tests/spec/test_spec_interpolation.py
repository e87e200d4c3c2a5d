"""``${VAR}`` / ``${VAR:-default}`` expansion: only what is spelled out, and unset variables named."""

from __future__ import annotations

from pathlib import Path

import pytest

from hud_pipelines.spec.interpolation import interpolate
from hud_pipelines.spec.problems import SpecError

ENV = {"HOST": "10.0.0.5", "PORT": "8765", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("ws://${HOST}:${PORT}", "ws://10.0.0.5:8765"),
        ("${MISSING:-fallback}", "fallback"),
        ("${EMPTY:-fallback}", "fallback"),
        ("[${EMPTY}]", "[]"),
        ("${HOST:-unused}", "10.0.0.5"),
        ("${MISSING:-}", ""),
        ("cost: $5, $HOST, ~/data", "cost: $5, $HOST, ~/data"),
        ("literal $${HOST} and ${HOST}", "literal ${HOST} and 10.0.0.5"),
        ("a$$b", "a$$b"),
        ("no references", "no references"),
    ],
)
def test_expansion(text: str, expanded: str) -> None:
    assert interpolate(text, ENV) == (expanded, [])


def test_an_unset_variable_is_named_and_located() -> None:
    value, errors = interpolate("ws://${HOST}:${SIM_PORT}/x", ENV)
    assert value == "ws://10.0.0.5:${SIM_PORT}/x"
    [error] = errors
    assert "environment variable SIM_PORT is not set" in error.message
    assert "${SIM_PORT:-default}" in error.message
    assert (error.offset, error.length) == (13, len("${SIM_PORT}"))


@pytest.mark.parametrize(
    ("text", "message", "offset"),
    [
        ("${1X}", "malformed reference '${1X}'", 0),
        ("a ${}", "malformed reference '${}'", 2),
        ("${A:-${B}}", "malformed reference", 0),
        ("${A-b}", "malformed reference '${A-b}'", 0),
        ("x ${HOST", "unterminated '${'", 2),
    ],
)
def test_malformed_references(text: str, message: str, offset: int) -> None:
    _, errors = interpolate(text, ENV)
    assert [e.offset for e in errors] == [offset]
    assert message in errors[0].message


def test_every_problem_of_one_string_is_reported() -> None:
    _, errors = interpolate("${A}/${B}/${HOST}/${C:-ok}/${1}", {"HOST": "h"})
    assert [e.offset for e in errors] == [0, 5, 27]


def test_reading_results_needs_no_credential_but_every_other_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.spec.loader import load_pipeline, load_pipeline_for_results

    monkeypatch.delenv("HUDP_UNSET_TOKEN", raising=False)
    monkeypatch.delenv("HUDP_UNSET_ARG", raising=False)
    served = (
        "name: served\nsim: {url: 'ws://127.0.0.1:1', token: '${HUDP_UNSET_TOKEN}', num_envs: 2}\n"
        "agent: {policy: {kind: random}}\n"
    )
    (tmp_path / "served.yaml").write_text(served)
    with pytest.raises(SpecError, match="HUDP_UNSET_TOKEN is not set"):
        load_pipeline(tmp_path / "served.yaml")  # a run would reach the sim: it needs the token
    spec = load_pipeline_for_results(tmp_path / "served.yaml")
    assert spec.rollout_hash == load_pipeline(tmp_path / "served.yaml", env={"HUDP_UNSET_TOKEN": "t"}).rollout_hash
    (tmp_path / "argued.yaml").write_text(served.replace("num_envs: 2", "num_envs: 2, args: {x: '${HUDP_UNSET_ARG}'}"))
    with pytest.raises(SpecError, match="HUDP_UNSET_ARG is not set"):
        load_pipeline_for_results(tmp_path / "argued.yaml")  # a sim argument decides the results: never guessed


def test_a_reference_left_bare_in_a_flow_mapping_is_a_syntax_error_that_says_to_quote_it(tmp_path: Path) -> None:
    from hud_pipelines.spec.loader import load_pipeline

    text = "name: flow\nsim: {factory: CartPole-v1, num_envs: ${N:-4}}\nagent: {policy: {kind: random}}\n"
    (tmp_path / "bare.yaml").write_text(text)
    with pytest.raises(SpecError) as raised:
        load_pipeline(tmp_path / "bare.yaml")
    [problem] = raised.value.problems
    assert (problem.line, problem.column) == (2, 40)
    assert problem.message.endswith("quote an environment reference: '${VAR}'")
    (tmp_path / "quoted.yaml").write_text(text.replace("${N:-4}", "'${N:-4}'"))
    assert load_pipeline(tmp_path / "quoted.yaml", env={"N": "3"}).sim.num_envs == 3
