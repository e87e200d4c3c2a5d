"""A Celery worker lives across runs: it runs each run's steps with the pipeline files that run began with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository

from hud_pipelines.dagster.location import EVERY_FILE, LOCATION_MODULE, load_as_run, location_digests, run_digest
from hud_pipelines.errors import DeploymentError
from tests.dagster.support import WritePipeline


def test_a_worker_reloads_the_code_location_for_a_run_of_edited_files_and_refuses_a_run_they_changed_under(
    write_pipeline: WritePipeline, pipelines_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_pipeline("edited", max_steps=30)
    monkeypatch.setenv("HUD_PIPELINES_DIR", str(pipelines_dir))
    monkeypatch.delitem(sys.modules, LOCATION_MODULE, raising=False)  # this test's own import of the location
    job = ReconstructableRepository.for_module(LOCATION_MODULE, "defs").get_reconstructable_job("edited")
    assert run_digest(job) == "", "a process that has not loaded the location says nothing of it"

    load_as_run("edited", location_digests()["edited"])  # a worker's first step: it imports the location
    location = sys.modules[LOCATION_MODULE]
    first = run_digest(job)
    assert first == location_digests()["edited"]
    before = location.defs

    path.write_text(path.read_text().replace('"max_steps": 30', '"max_steps": 31'))  # edited, reloaded in the UI
    edited = location_digests()["edited"]
    assert edited != first
    load_as_run("edited", edited)  # the new run's step: the worker loads the files it began with
    assert location.defs is not before
    assert run_digest(job) == edited

    with pytest.raises(DeploymentError, match="differently from the run that sent the step: the run was launched with"):
        load_as_run("edited", first)  # a step of the run from before the edit: not run with the edited file

    every_asset = ReconstructableRepository.for_module(LOCATION_MODULE, "defs").get_reconstructable_job("__ASSET_JOB")
    whole = run_digest(every_asset)  # "Materialize all" runs Dagster's job of every asset: no one pipeline's
    assert whole == location_digests()[EVERY_FILE] != edited
    write_pipeline("another", max_steps=30)  # another pipeline's file: the whole location changed
    changed = location_digests()[EVERY_FILE]
    load_as_run("__ASSET_JOB", changed)
    assert run_digest(every_asset) == changed
    assert "another" in location.digests, "the worker reloaded the location for the run of every asset"
