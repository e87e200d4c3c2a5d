"""Loading files and directories: positions, all problems at once, interpolation, cross-file names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec import SpecError, collect_pipelines, load_pipeline, load_pipeline_text, load_pipelines
from hud_pipelines.spec.loader import load_file
from hud_pipelines.spec.problems import closest, did_you_mean

WriteYaml = Callable[..., Path]
"""The ``write_yaml`` fixture (conftest.py): write YAML text to a file under tmp_path."""


def minimal(name: str) -> str:
    return f"name: {name}\nsim:\n  factory: CartPole-v1\nagent:\n  policy: {{kind: random}}\n"


def test_load_pipeline_returns_the_spec_with_its_source(write_yaml: WriteYaml) -> None:
    path = write_yaml(minimal("cartpole"), "pipelines/cartpole.yaml")
    spec = load_pipeline(path)
    assert spec.name == "cartpole"
    assert spec.source == path.resolve()
    assert spec.base_dir == path.parent.resolve()


def test_load_pipelines_reads_yaml_and_yml_sorted_and_ignores_other_files(write_yaml: WriteYaml) -> None:
    write_yaml(minimal("zeta"), "pipelines/a.yaml")
    write_yaml(minimal("alpha"), "pipelines/b.yml")
    write_yaml("not: a pipeline", "pipelines/notes.txt")
    write_yaml(minimal("nested"), "pipelines/sub/c.yaml")
    specs = load_pipelines(write_yaml("", "pipelines/.keep").parent)
    assert [s.name for s in specs] == ["zeta", "alpha"]


def test_an_empty_directory_has_no_pipelines_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    assert load_pipelines(tmp_path) == []
    with pytest.raises(SpecError, match="no such directory"):
        load_pipelines(tmp_path / "missing")


def test_problems_of_all_files_come_in_one_error(write_yaml: WriteYaml) -> None:
    write_yaml(minimal("fine"), "p/a_fine.yaml")
    write_yaml(minimal("bad_one") + "group: 0\nmax_steps: -1\n", "p/b_bad.yaml")
    write_yaml(minimal("Bad"), "p/c_bad.yaml")
    with pytest.raises(SpecError) as raised:
        load_pipelines(write_yaml("", "p/.keep").parent)
    error = raised.value
    assert isinstance(error, HudPipelinesError)
    assert [(Path(p.file).name, p.line, p.path) for p in error.problems] == [
        ("b_bad.yaml", 6, "group"),
        ("b_bad.yaml", 7, "max_steps"),
        ("c_bad.yaml", 1, "name"),
    ]
    text = str(error)
    assert text.startswith("3 problems in 2 files:\n")
    assert "b_bad.yaml:6:8: group: expected a number >= 1, got 0" in text


def test_a_name_used_twice_names_both_files(write_yaml: WriteYaml) -> None:
    first = write_yaml(minimal("same"), "p/first.yaml")
    write_yaml("# another eval with the same name\n" + minimal("same"), "p/second.yaml")
    with pytest.raises(SpecError) as raised:
        load_pipelines(first.parent)
    [problem] = raised.value.problems
    assert problem.file.endswith("second.yaml")
    assert (problem.line, problem.column) == (2, 7)
    assert "pipeline name 'same' is already used by" in problem.message
    assert f"{first.name}:1:7" in problem.message


def test_collect_pipelines_keeps_the_valid_specs_and_reports_missing_paths(
    write_yaml: WriteYaml, tmp_path: Path
) -> None:
    good = write_yaml(minimal("good"), "good.yaml")
    bad = write_yaml("name: [", "bad.yaml")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    specs, problems = collect_pipelines([good, bad, tmp_path / "nope.yaml", empty_dir, good])
    assert [s.name for s in specs] == ["good"]
    messages = sorted(p.message for p in problems)
    assert any(m.startswith("invalid YAML") for m in messages)
    assert "no such file or directory" in messages
    assert "no pipeline files (*.yaml, *.yml) here" in messages


def test_interpolation_feeds_typed_fields(write_yaml: WriteYaml) -> None:
    path = write_yaml(
        """\
        name: attached
        sim:
          url: ws://${SIM_HOST}:${SIM_PORT:-8765}
          token: ${SIM_TOKEN}
          num_envs: ${SLOTS}
        agent: {policy: {kind: random}}
        description: "cost $$5 and $${NOT_A_VAR}"
        """
    )
    spec = load_pipeline(path, env={"SIM_HOST": "10.1.2.3", "SIM_TOKEN": "s3cret", "SLOTS": "4"})
    assert spec.sim.url == "ws://10.1.2.3:8765"
    assert spec.sim.token is not None
    assert spec.sim.token.get_secret_value() == "s3cret"
    assert spec.sim.num_envs == 4
    assert spec.description == "cost $$5 and ${NOT_A_VAR}"


def test_interpolation_reads_the_process_environment_by_default(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUD_SPEC_TEST_MAX_STEPS", "77")
    spec = load_pipeline(write_yaml(minimal("env") + "max_steps: ${HUD_SPEC_TEST_MAX_STEPS}\n"))
    assert spec.max_steps == 77


def test_keys_are_never_interpolated(write_yaml: WriteYaml) -> None:
    path = write_yaml(minimal("keys") + "sim_args_probe: 1\n")
    with pytest.raises(SpecError, match="unknown key 'sim_args_probe'"):
        load_pipeline(path)
    spec = load_pipeline(
        write_yaml(
            "name: keys\nsim:\n  factory: CartPole-v1\n  args: {'${X}': 1}\nagent: {policy: {kind: random}}\n", "k.yaml"
        ),
        env={},
    )
    assert spec.sim.args == {"${X}": 1}


def test_anchors_and_merge_keys_with_explicit_keys_winning(write_yaml: WriteYaml) -> None:
    spec = load_pipeline(
        write_yaml(
            """\
            name: anchors
            sim: {factory: CartPole-v1}
            agent: {policy: {kind: random}}
            tasks:
              - &base {seed: 5, options: {x: 1}, prompt: shared}
              - <<: *base
                seed: 9
              - {<<: [*base], name: third}
            """
        )
    )
    assert [(t.name, t.seed, t.options, t.prompt) for t in spec.tasks] == [
        ("task0", 5, {"x": 1}, "shared"),
        ("task1", 9, {"x": 1}, "shared"),
        ("third", 5, {"x": 1}, "shared"),
    ]


def test_top_level_x_keys_hold_anchors_and_are_no_settings(write_yaml: WriteYaml) -> None:
    """As in Compose files; before, ``x-defaults`` was refused as an unknown key."""
    import json

    from jsonschema import Draft202012Validator
    from ruamel.yaml import YAML

    from hud_pipelines.spec.schema import pipeline_json_schema

    text = """\
        name: extended
        x-task: &task {seed: 5, prompt: shared}
        x-slots: &slots 4
        sim: {factory: CartPole-v1, num_envs: *slots}
        agent: {policy: {kind: random}}
        tasks: [{<<: *task, name: a}, {<<: *task, name: b, seed: 9}]
        """
    spec = load_pipeline(write_yaml(text))
    assert (spec.sim.num_envs, [(t.name, t.seed, t.prompt) for t in spec.tasks]) == (
        4,
        [("a", 5, "shared"), ("b", 9, "shared")],
    )
    plain = "name: extended\nsim: {factory: CartPole-v1, num_envs: 4}\nagent: {policy: {kind: random}}\n"
    plain += "tasks: [{name: a, seed: 5, prompt: shared}, {name: b, seed: 9, prompt: shared}]\n"
    assert spec.rollout_hash == load_pipeline_text(plain).rollout_hash, "nothing of them reaches the rollout"
    document = json.loads(json.dumps(YAML(typ="safe").load(text.replace("        ", ""))))
    assert not list(Draft202012Validator(pipeline_json_schema()).iter_errors(document)), "editors take them too"
    with pytest.raises(SpecError, match="y-task"):
        load_pipeline_text(plain + "y-task: {seed: 1}\n")


def test_yaml_scalars_become_plain_python_values(write_yaml: WriteYaml) -> None:
    spec = load_pipeline(
        write_yaml(
            minimal("scalars").replace(
                "factory: CartPole-v1",
                "factory: CartPole-v1\n  args: {a: 0x10, b: 1_000, c: .5, d: null, e: 2024-01-02, f: 'yes', g: true}",
            )
        )
    )
    args = spec.sim.args
    assert args == {"a": 16, "b": 1000, "c": 0.5, "d": None, "e": "2024-01-02", "f": "yes", "g": True}
    assert [type(v) for v in args.values()] == [int, int, float, type(None), str, str, bool]


def test_load_pipeline_text_anchors_paths_at_its_source(tmp_path: Path) -> None:
    text = minimal("text").replace("CartPole-v1", "CartPole-v1\n  contract: c.json")
    spec = load_pipeline_text(text, source=tmp_path / "virtual.yaml")
    assert spec.contract_path == tmp_path.resolve() / "c.json"
    with pytest.raises(SpecError) as raised:
        load_pipeline_text("name: 1\n")
    assert all(p.file == "<string>" for p in raised.value.problems)


def test_an_unreadable_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    assert "cannot read the file" in load_file(binary).problems[0].message
    assert load_file(tmp_path / "missing.yaml").problems[0].message == "no such file"


def test_a_recursive_alias_is_reported(write_yaml: WriteYaml) -> None:
    with pytest.raises(SpecError) as raised:
        load_pipeline(write_yaml(minimal("recursive") + "tasks: &loop [*loop]\n"))
    assert any("recursive alias" in p.message for p in raised.value.problems)


def test_a_short_name_one_edit_or_a_case_away_is_suggested_but_one_letter_is_not() -> None:
    assert closest("G0", ["Go", "push"]) == "Go"  # difflib's ratio alone gives 0.5: no suggestion
    assert closest("og", ["go", "push"]) == "go"  # two neighbours swapped
    assert closest("PUSH", ["pull", "push"]) == "push"
    assert closest("pus", ["push"]) == "push"
    assert closest("b", ["a", "c"]) is None
    assert closest("xy", ["push", "pull"]) is None
    assert did_you_mean("G0", ["Go"]) == " (did you mean 'Go'?)"
