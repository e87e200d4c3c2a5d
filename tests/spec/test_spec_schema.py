"""The committed JSON Schema and YAML reference match the models, and the schema agrees with validation."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from hud_pipelines.spec import SpecError, load_pipeline, load_pipeline_text
from hud_pipelines.spec.schema import (
    EXAMPLE,
    REFERENCE_FILE,
    SCHEMA_FILE,
    pipeline_json_schema,
    render_json_schema,
    render_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
VALID = Path(__file__).parent / "valid"
BROKEN = Path(__file__).parent / "broken"
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(?P<path>\S+)$")
VALID_FILES = sorted([*VALID.glob("*.yaml"), *VALID.glob("*.yml")])
ENV = {"HUD_SIM_TOKEN": "t0ken"}


def _validator() -> Draft202012Validator:
    schema = pipeline_json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _plain_yaml(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def test_committed_schema_is_up_to_date() -> None:
    committed = (ROOT / SCHEMA_FILE).read_text(encoding="utf-8")
    assert committed == render_json_schema(), f"regenerate with: hud-pipelines schema -o {SCHEMA_FILE}"


def test_committed_reference_is_up_to_date() -> None:
    committed = (ROOT / REFERENCE_FILE).read_text(encoding="utf-8")
    assert committed == render_markdown(), f"regenerate with: hud-pipelines schema --markdown -o {REFERENCE_FILE}"


def test_the_reference_names_each_place_a_section_is_used_at_once() -> None:
    """Both sweepable policy kinds have ``checkpoints``: their entries were said to be used at the same key twice."""
    for line in render_markdown().splitlines():
        if line.startswith("Used at: "):
            places = line.removeprefix("Used at: ").rstrip(".").split(", ")
            assert len(places) == len(set(places)), line
    assert "Used at: `agent.policy.checkpoints[]`." in render_markdown()


def test_there_are_valid_examples_and_each_names_the_committed_schema() -> None:
    assert len(VALID_FILES) >= 3
    for path in VALID_FILES:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        match = MODELINE.match(first)
        assert match, f"{path.name} must start with '# yaml-language-server: $schema=...'"
        assert (path.parent / match["path"]).resolve() == (ROOT / SCHEMA_FILE).resolve()


@pytest.mark.parametrize("path", VALID_FILES, ids=[p.name for p in VALID_FILES])
def test_valid_examples_load_deeply_and_satisfy_the_schema(path: Path) -> None:
    spec = load_pipeline(path, deep=True, env=ENV)
    assert spec.source == path.resolve()
    errors = list(_validator().iter_errors(_plain_yaml(path)))
    assert not errors, [e.message for e in errors]


def test_the_documented_example_loads_and_satisfies_the_schema() -> None:
    spec = load_pipeline_text(EXAMPLE, source=ROOT / "pipelines" / "example.yaml")
    assert spec.name == "cartpole_pd"
    assert spec.partition_keys() == ["default-i0", "default-i1"]
    assert not list(_validator().iter_errors(YAML(typ="safe", pure=True).load(EXAMPLE)))
    assert EXAMPLE in render_markdown()


@pytest.mark.parametrize(
    "name",
    [
        "unknown_top_key",
        "unknown_sim_key",
        "unknown_policy_kind",
        "missing_policy_kind",
        "unknown_grader_kind",
        "unknown_check_kind",
        "out_of_range",
        "wrong_types",
        "bad_name",
        "hold_enum",
        "missing_name",
        "unknown_grader_key",
        "missing_check_value",
        "bool_for_number",
    ],
)
def test_the_schema_rejects_what_validation_rejects(name: str) -> None:
    path = BROKEN / f"{name}.yaml"
    with pytest.raises(SpecError):
        load_pipeline(path)
    assert list(_validator().iter_errors(_plain_yaml(path))), f"the schema accepts {name}.yaml"


def test_union_members_require_their_kind() -> None:
    schema = pipeline_json_schema()
    for name in ("SuccessGrader", "ReturnGrader", "MinSuccessRateCheck", "ScriptedPolicyConfig", "RandomPolicyConfig"):
        assert schema["$defs"][name]["required"][0] == "kind"
    document = json.loads(render_json_schema())
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def _own_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    own = {"": schema}
    own.update({k: v for k, v in schema["$defs"].items() if k.endswith(("Spec", "Grader", "Check"))})
    return own


def test_every_field_of_the_spec_models_is_described_and_documented() -> None:
    schema = pipeline_json_schema()
    reference = render_markdown()
    for name, definition in _own_definitions(schema).items():
        assert definition.get("description"), f"{name or 'PipelineSpec'} has no docstring"
        for key, prop in definition["properties"].items():
            assert prop.get("description"), f"{name or 'PipelineSpec'}.{key} has no description"
            assert f"| `{key}` |" in reference


def test_a_key_of_a_few_allowed_values_lists_them_in_the_reference() -> None:
    """Before, a ``Literal`` of several values (a success grader's ``at``) was typed "string" in the reference,
    where the schema and validation allow only its values."""
    schema = pipeline_json_schema()
    reference = render_markdown()
    listed = 0
    for definition in _own_definitions(schema).values():
        for key, prop in definition["properties"].items():
            if "enum" in prop:
                listed += 1
                assert f"| `{key}` | {' or '.join(f'`{v}`' for v in prop['enum'])} |" in reference, key
    assert listed, "a key with its values inline, or the test tells nothing"


def test_markdown_links_point_at_sections() -> None:
    reference = render_markdown()
    headings = {h.lower() for h in re.findall(r"^## (\S+)$", reference, flags=re.MULTILINE)}
    links = set(re.findall(r"\]\(#([^)]+)\)", reference))
    assert links
    assert links <= headings


def test_the_schema_document_is_not_mutated_between_calls() -> None:
    first = pipeline_json_schema()
    snapshot = copy.deepcopy(first)
    pipeline_json_schema()
    assert first == snapshot
