"""Definitions from every pipeline file of a directory (``$HUD_PIPELINES_DIR`` or ``./pipelines``)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from hud_pipelines.dagster.assets import build_pipeline_assets
from hud_pipelines.dagster.resources import PipelineResource, resource_key
from hud_pipelines.outputs import default_outputs_root
from hud_pipelines.spec.loader import load_pipeline, load_pipelines
from hud_pipelines.spec.models import PipelineSpec

PIPELINES_ENV = "HUD_PIPELINES_DIR"


def default_pipelines_dir() -> Path:
    configured = os.environ.get(PIPELINES_ENV)
    return Path(configured).expanduser().resolve() if configured else (Path.cwd() / "pipelines").resolve()


def definitions_for(
    specs: list[PipelineSpec], *, outputs_dir: Path | None = None, project_dir: Path | None = None
) -> dg.Definitions:
    """Assets, checks, jobs and resources of ``specs`` (each loaded from a file)."""
    outputs = (outputs_dir or default_outputs_root()).resolve()
    project = (project_dir or Path.cwd()).resolve()
    assets: list[dg.AssetsDefinition] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs: list[UnresolvedAssetJobDefinition] = []
    resources: dict[str, PipelineResource] = {}
    for spec in specs:
        if spec.source is None:
            raise ValueError(f"pipeline {spec.name!r} was not loaded from a file")
        spec_assets, spec_checks, job = build_pipeline_assets(spec)
        assets += spec_assets
        checks += spec_checks
        jobs.append(job)
        resources[resource_key(spec.name)] = PipelineResource(
            pipeline_file=str(spec.source), outputs_dir=str(outputs), project_dir=str(project)
        )
    # Every launch, also an asset selection from the UI, runs its steps in one process: the
    # multiprocess default would start a process, and a sim, per step.
    return dg.Definitions(
        assets=assets, asset_checks=checks, jobs=jobs, resources=resources, executor=dg.in_process_executor
    )


def build_definitions(directory: Path | None = None, *, outputs_dir: Path | None = None) -> dg.Definitions:
    """Definitions of every pipeline file in ``directory`` (all problems reported at once)."""
    directory = directory or default_pipelines_dir()
    specs = load_pipelines(directory) if directory.is_dir() else []
    return definitions_for(specs, outputs_dir=outputs_dir, project_dir=directory.parent)


def definitions_for_file(
    path: Path, *, outputs_dir: Path | None = None, project_dir: Path | None = None
) -> dg.Definitions:
    return definitions_for([load_pipeline(path)], outputs_dir=outputs_dir, project_dir=project_dir)
