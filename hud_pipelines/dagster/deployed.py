"""A pipeline as a run of it is configured, known before the run: the deployment file's fields over the YAML's.

A run judges its earlier results by this configuration (a result of another one is not current), so
whatever the CLI says of those results before the run starts (the pairs a resumed sweep keeps) must
be judged by it too. Dagster reads an ``{env: NAME}`` field when a run starts; here it is read now.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg

from hud_pipelines.dagster.deployment import deployment_path, for_pipeline, load_deployment
from hud_pipelines.dagster.resources import effective_spec, pipeline_resources
from hud_pipelines.errors import DeploymentError
from hud_pipelines.spec.models import PipelineSpec


def deployed_spec(spec: PipelineSpec, project_dir: Path) -> PipelineSpec:
    """``spec`` with the deployment file's fields for it, as the run's resources will be configured."""
    fields = for_pipeline(load_deployment(), spec.name)
    read = {
        part: {key: _read(spec.name, part, key, value) for key, value in given.items()}
        for part, given in fields.items()
    }
    parts = pipeline_resources(spec, project_dir=project_dir, deployment=read)
    return effective_spec(spec, parts.sim, parts.contract, parts.agent, parts.graders)


def _read(pipeline: str, part: str, key: str, value: Any) -> Any:
    """An ``{env: NAME}`` field's value from the environment now (a run reads it when it starts)."""
    if not isinstance(value, dg.EnvVar):
        return value
    name = value.env_var_name
    if name not in os.environ:
        raise DeploymentError(
            f"deployment file {deployment_path()}: pipelines.{pipeline}.{part}.{key}: environment variable {name} "
            "is not set"
        )
    return os.environ[name]
