"""Fixtures for the Dagster tests: pipeline files in tmp, an ephemeral instance, outputs in tmp."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.dagster.support import REPO, WritePipeline, pipeline_text, sim_label


@pytest.fixture
def pipelines_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "pipelines"
    directory.mkdir()
    return directory


@pytest.fixture
def label(tmp_path: Path) -> str:
    """Marks this test's sim processes (see ``sim_processes``)."""
    return sim_label(tmp_path)


@pytest.fixture
def write_pipeline(pipelines_dir: Path, label: str) -> WritePipeline:
    def write(name: str, **overrides: Any) -> Path:
        path = pipelines_dir / f"{name}.yaml"
        path.write_text(pipeline_text(name, label, **overrides))
        return path

    return write


@pytest.fixture
def outputs_dir(tmp_path: Path) -> Path:
    return tmp_path / "outputs"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture(autouse=True)
def _project_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root so `envs.controllers` imports like it does for users."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
