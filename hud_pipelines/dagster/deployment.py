"""Deployment settings: replace a pipeline's resources per deployment, never touching the eval's YAML.

``$HUD_PIPELINES_DEPLOYMENT`` names a YAML file that sets resource fields per pipeline (or for every
pipeline under ``"*"``), the way Dagster projects pick resources by deployment name::

    pipelines:
      cartpole_pd:
        sim:                      # attach to a sim served on another machine instead of spawning one
          factory: null
          url: ws://simhost:8765
          token: {env: SIM_TOKEN}  # read from the environment when the run starts (a Dagster EnvVar)
        agent:
          torch_threads: 4

The eval's YAML stays the one file that says *what* is evaluated; the deployment file says *where*
and *with what* it runs (a served sim fleet, a GPU agent). Fields are those of the resources in
:mod:`hud_pipelines.dagster.resources`; a run's configuration is validated as the YAML is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import dagster as dg
from ruamel.yaml import YAML

from hud_pipelines.dagster.resources import AGENT, CONTRACT, GRADERS, SIM
from hud_pipelines.errors import DeploymentError

DEPLOYMENT_ENV = "HUD_PIPELINES_DEPLOYMENT"
EVERY_PIPELINE = "*"
PARTS = (SIM, CONTRACT, AGENT, GRADERS)

Deployment = dict[str, dict[str, dict[str, Any]]]
"""pipeline (or ``*``) -> resource part -> fields."""


def load_deployment(path: Path | None = None) -> Deployment:
    """The deployment file at ``path`` (default ``$HUD_PIPELINES_DEPLOYMENT``); ``{}`` when there is none."""
    if path is None:
        configured = os.environ.get(DEPLOYMENT_ENV)
        if not configured:
            return {}
        path = Path(configured).expanduser()
    try:
        loaded: object = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DeploymentError(f"deployment file {path}: {exc.strerror or exc}") from exc
    pipelines = cast(dict[str, Any], loaded).get("pipelines") if isinstance(loaded, dict) else None
    if not isinstance(pipelines, dict):
        raise DeploymentError(f"deployment file {path}: expected a 'pipelines:' mapping of pipeline -> resources")
    deployment: Deployment = {}
    for pipeline, parts in cast(dict[str, Any], pipelines).items():
        if not isinstance(parts, dict):
            raise DeploymentError(f"deployment file {path}: pipelines.{pipeline}: expected a mapping of resources")
        deployment[str(pipeline)] = {}
        for part, fields in cast(dict[str, Any], parts).items():
            if part not in PARTS:
                raise DeploymentError(
                    f"deployment file {path}: pipelines.{pipeline}.{part}: not a resource; expected one of {PARTS}"
                )
            if not isinstance(fields, dict):
                raise DeploymentError(f"deployment file {path}: pipelines.{pipeline}.{part}: expected a mapping")
            deployment[str(pipeline)][part] = {k: _value(v) for k, v in cast(dict[str, Any], fields).items()}
    return deployment


def for_pipeline(deployment: Deployment, pipeline: str) -> dict[str, dict[str, Any]]:
    """The resource fields the deployment sets for ``pipeline`` (its own over those for every pipeline)."""
    every = deployment.get(EVERY_PIPELINE, {})
    own = deployment.get(pipeline, {})
    return {part: {**every.get(part, {}), **own.get(part, {})} for part in PARTS if part in every or part in own}


def _value(value: Any) -> Any:
    """``{env: NAME}`` becomes a Dagster ``EnvVar`` (read when the run starts, never stored)."""
    if isinstance(value, dict):
        mapping = cast(dict[str, Any], value)
        if set(mapping) == {"env"}:
            return dg.EnvVar(str(mapping["env"]))
        return mapping
    return cast(object, value)
