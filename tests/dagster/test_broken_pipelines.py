"""A broken pipeline file costs only its own pipeline: the others load, and it is reported where people look."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from hud_pipelines.cli.validate import add_validate_arguments, run_validate
from hud_pipelines.dagster.definitions import BROKEN_GROUP, build_definitions
from tests.dagster.support import REPO, WritePipeline

BIN = Path(sys.executable).parent
BROKEN = "name: broken\nsim: {factory: CartPole-v1, num_env: 2}\nagent: {policy: {kind: random}}\n"
BROKEN_AT = "broken.yaml:2:29: sim.num_env: unknown key 'num_env' (did you mean 'num_envs'?)"
MARKER = dg.AssetKey([BROKEN_GROUP, "broken_yaml"])


@pytest.fixture
def mixed(write_pipeline: WritePipeline, pipelines_dir: Path) -> Path:
    """A pipelines directory with one good file, one broken file and one that reuses the good one's name."""
    write_pipeline("good")
    (pipelines_dir / "broken.yaml").write_text(BROKEN)
    (pipelines_dir / "twin.yaml").write_text((pipelines_dir / "good.yaml").read_text())
    return pipelines_dir


def test_the_good_pipelines_load_and_each_broken_file_is_logged_and_marked(
    mixed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="hud_pipelines.dagster.definitions"):
        defs = build_definitions(mixed)
    dg.Definitions.validate_loadable(defs)
    assert {job.name for job in defs.resolve_all_job_defs()} == {"good", "__ASSET_JOB"}
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {f"good/{asset}" for asset in ("contract", "rollouts", "grades", "report")} <= keys
    assert {k for k in keys if k.startswith(f"{BROKEN_GROUP}/")} == {
        f"{BROKEN_GROUP}/broken_yaml",
        f"{BROKEN_GROUP}/twin_yaml",
    }
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert BROKEN_AT in logged
    assert "twin.yaml:2:11: name: pipeline name 'good' is already used by" in logged

    marker = defs.resolve_assets_def(MARKER)
    description = marker.descriptions_by_key[MARKER]
    assert BROKEN_AT in description
    assert "is not a valid pipeline" in description
    assert marker.group_names_by_key[MARKER] == BROKEN_GROUP
    materialized = dg.materialize([marker], raise_on_error=False)
    assert not materialized.success
    failures = [e for e in materialized.all_events if e.event_type_value == "STEP_FAILURE"]
    assert BROKEN_AT in str(failures[0].event_specific_data)


def test_validate_still_fails_for_the_broken_file(mixed: Path) -> None:
    parser = argparse.ArgumentParser()
    add_validate_arguments(parser)
    out = io.StringIO()
    assert run_validate(parser.parse_args(["--no-deep", str(mixed)]), out) == 1
    assert BROKEN_AT in out.getvalue()


@pytest.mark.slow
def test_the_dagster_and_dg_clis_list_the_good_pipeline_beside_a_broken_one(mixed: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "HUD_PIPELINES_DIR": str(mixed), "DAGSTER_HOME": str(home), "HF_HUB_OFFLINE": "1"}

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)

    jobs = run(str(BIN / "dagster"), "job", "list", "-m", "hud_pipelines.definitions")
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    assert "Job: good" in jobs.stdout
    assert BROKEN_AT in jobs.stderr  # the load logs the broken file's problems

    listed = run(str(BIN / "dg"), "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    defs = json.loads(listed.stdout)
    assert "good" in {job["name"] for job in defs["jobs"]}
    (marker,) = [a for a in defs["assets"] if a["asset_key"] == MARKER.to_user_string()]
    assert BROKEN_AT in marker["description"]


def test_a_pipeline_is_found_by_its_name_beside_a_broken_file(
    write_pipeline: WritePipeline, pipelines_dir: Path
) -> None:
    from hud_pipelines.cli.selection import resolve_pipeline_file

    good = write_pipeline("named")
    renamed = pipelines_dir / "file_of_another_name.yaml"
    good.rename(renamed)  # looked up by its `name`, not its file name
    (pipelines_dir / "broken.yaml").write_text(BROKEN)
    assert resolve_pipeline_file("named", pipelines_dir) == renamed.resolve()


def test_a_pipeline_name_is_looked_up_though_a_folder_of_that_name_is_in_the_working_directory(
    write_pipeline: WritePipeline, pipelines_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, ``run reach`` beside a folder ``reach/`` (its outputs, its envs) said "pipeline file reach does not
    exist"."""
    from hud_pipelines.cli.selection import resolve_pipeline_file

    found = write_pipeline("reach")
    (tmp_path / "cwd" / "reach").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_pipeline_file("reach", pipelines_dir) == found


def test_a_name_two_files_declare_is_refused_by_the_cli(write_pipeline: WritePipeline, pipelines_dir: Path) -> None:
    from hud_pipelines.cli.selection import resolve_pipeline_file
    from hud_pipelines.errors import HudPipelinesError

    first = write_pipeline("twice")
    (pipelines_dir / "again.yaml").write_text(first.read_text())
    with pytest.raises(HudPipelinesError, match=r"'twice' is declared by 2 files \(again.yaml, twice.yaml\)"):
        resolve_pipeline_file("twice", pipelines_dir)
