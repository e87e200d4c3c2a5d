"""A pipeline as a run of it is configured, known before the run: the deployment file's fields over the YAML's.

A run judges its earlier results by this configuration (a result of another one is not current), so
whatever the CLI says of those results before the run starts (the pairs a resumed sweep keeps) must
be judged by it too. Dagster reads an ``{env: NAME}`` field when a run starts; here it is read now.

The same sections are what a deployment's fields must make valid: a field of the right type can still
break a pipeline's rule (a timeout of -1, an ``http://`` sim URL, a served sim beside the YAML's build
``args``). :func:`deployment_misfit` names such a field at its line of the deployment file, for
``validate`` and before a run starts, where the run itself would fail its first step with no line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from hud_pipelines.dagster.deployment import (
    CONTRACT,
    EVERY_PIPELINE,
    GRADERS,
    Deployment,
    accepts,
    deployment_path,
    field_adapter,
    for_pipeline,
    load_deployment,
    located,
)
from hud_pipelines.dagster.resources import effective_spec, pipeline_resources
from hud_pipelines.errors import ConfigurationError, DeploymentError
from hud_pipelines.spec.loader import refuse_unrunnable
from hud_pipelines.spec.messages import plain_message
from hud_pipelines.spec.model_paths import key_path
from hud_pipelines.spec.models import PipelineSpec


def deployed_spec(spec: PipelineSpec, project_dir: Path) -> PipelineSpec:
    """``spec`` with the deployment file's fields for it, as the run's resources will be configured."""
    deployment = load_deployment()
    fields = for_pipeline(deployment, spec.name)
    read = {
        part: {key: _read(_setting_key(deployment, spec.name, part, key), value) for key, value in given.items()}
        for part, given in fields.items()
    }
    return _configured(spec, read, project_dir, deployment)


def _setting_key(deployment: Deployment, pipeline: str, part: str, key: str) -> tuple[str, ...]:
    """The keys of the deployment file that set ``part.key`` for ``pipeline``: under its name, or under ``*``."""
    setter = pipeline if key in deployment.get(pipeline, {}).get(part, {}) else EVERY_PIPELINE
    return ("pipelines", setter, part, key)


def deployment_misfit(spec: PipelineSpec, deployment: Deployment, path: Path | None = None) -> str | None:
    """What is wrong with the sections that ``deployment``'s fields make with ``spec``'s YAML, each problem at
    its line of the file at ``path`` (default ``$HUD_PIPELINES_DEPLOYMENT``); ``None`` when they are valid.

    A field read from the environment (``{env: NAME}``) is read when a run starts, maybe on another machine:
    it stands here as a text of its own (a ``token`` given), and what is said of its value alone is left out.
    """
    given = for_pipeline(deployment, spec.name)
    if not any(given.values()):
        return None
    placeholders = {  # a field of another type (a number) is left at the YAML's value until it is read
        part: {
            k: _stand_in(k, v.env_var_name) if isinstance(v, dg.EnvVar) else v
            for k, v in own.items()
            if not isinstance(v, dg.EnvVar) or accepts(field_adapter(part, k), "text")
        }
        for part, own in given.items()
    }
    from_env = {(part, k) for part, own in given.items() for k, v in own.items() if isinstance(v, dg.EnvVar)}
    try:
        _configured(spec, placeholders, Path.cwd(), deployment, path, frozenset(from_env))
    except DeploymentError as exc:
        return str(exc)
    return None


def _stand_in(field: str, variable: str) -> str:
    """What a field read from the environment stands as until it is read: a text naming the variable, a URL for
    ``url`` (so that the rules of a served sim, a factory beside it, are still judged)."""
    return f"ws://${{{variable}}}" if field == "url" else f"${{{variable}}}"


def _configured(
    spec: PipelineSpec,
    fields: dict[str, dict[str, Any]],
    project_dir: Path,
    deployment: Deployment,
    path: Path | None = None,
    unread: frozenset[tuple[str, str]] = frozenset(),
) -> PipelineSpec:
    """``spec`` with ``fields`` over its YAML; a problem names the deployment file's line. ``unread``: the
    (part, field) pairs whose value is not known yet (read from the environment later): their values are not
    judged, the rules of their section (a ``url`` beside the YAML's ``factory``) are."""
    parts = pipeline_resources(spec, project_dir=project_dir, deployment=fields)
    try:
        return effective_spec(spec, parts.sim, parts.contract, parts.agent, parts.graders)
    except ConfigurationError as exc:
        judged = [e for e in exc.errors if e["type"] == "spec_rule" or _resource_field(e)[:2] not in unread]
        if exc.errors and not judged:
            return spec  # only values to be read later were found wanting: the run judges them
        where = path or deployment_path() or Path("deployment file")
        problems = (_problem(spec.name, deployment, where, error) for error in judged)
        raise DeploymentError("\n".join(dict.fromkeys(problems)) or str(exc)) from None


def _problem(pipeline: str, deployment: Deployment, path: Path, error: ErrorDetails) -> str:
    """``deployment file path:line:column: pipelines.<name>.<part>.<field>: what is wrong``: the key that set the
    value, under the pipeline's own name or under ``*``; the pipeline is named when the value broke a rule
    only beside its YAML's other fields."""
    part, field, rest = _resource_field(error)
    names = (pipeline, EVERY_PIPELINE)
    if field and any(field in deployment.get(name, {}).get(part, {}) for name in names):
        keys, beside = (*_setting_key(deployment, pipeline, part, field), *rest), ""
    else:  # a rule of the section as a whole, broken by the deployment's fields beside the YAML's
        owner = next((name for name in names if part in deployment.get(name, {})), pipeline)
        keys, beside = tuple(key for key in ("pipelines", owner, part) if key), f" (with pipeline {pipeline}'s YAML"
        beside += (
            f"; set {part}: {{{field}: {_unset(error)}}} under pipelines.{pipeline} to clear it)" if field else ")"
        )
    return f"deployment file {located(path, keys)}: {'.'.join(keys)}: {plain_message(error)}{beside}"


def _unset(error: ErrorDetails) -> str:
    """The value that leaves the YAML's key ``error`` is about as if it were not set (its default), in YAML."""
    keys = [str(key) for key in key_path(error, PipelineSpec)]
    model: Any = PipelineSpec
    try:
        for key in keys[:-1]:
            model = model.model_fields[key].annotation
        return json.dumps(model.model_fields[keys[-1]].get_default(call_default_factory=True))
    except (AttributeError, KeyError, IndexError, TypeError):  # not a plain model's field: the user knows best
        return "..."


def _resource_field(error: ErrorDetails) -> tuple[str, str, tuple[str, ...]]:
    """The resource part, its field and the keys below it that hold the pipeline key ``error`` is about
    (``sim.contract`` is the contract resource's ``file``; ``checks.0`` the graders resource's ``checks``)."""
    match tuple(str(key) for key in key_path(error, PipelineSpec)):
        case ("sim", "contract", *rest):
            return CONTRACT, "file", tuple(rest)
        case ("graders" | "checks" as field, *rest):
            return GRADERS, field, tuple(rest)
        case (part, field, *rest):
            return part, field, tuple(rest)
        case (part,):
            return part, "", ()
        case _:
            return "", "", ()


def _read(keys: tuple[str, ...], value: Any) -> Any:
    """An ``{env: NAME}`` field's value from the environment now (a run reads it when it starts); a problem names
    the line of the file that set it (``keys``)."""
    if not isinstance(value, dg.EnvVar):
        return value
    name = value.env_var_name
    where = f"deployment file {located(deployment_path() or Path('deployment file'), keys)}: {'.'.join(keys)}"
    if name not in os.environ:
        raise DeploymentError(f"{where}: environment variable {name} is not set")
    text = os.environ[name]
    try:  # a number read for a number field ("3" for num_envs), as Dagster's EnvVar would give it
        return field_adapter(keys[-2], keys[-1]).validate_python(text)
    except ValidationError as exc:
        raise DeploymentError(
            f"{where}: environment variable {name} holds {text!r}: "
            f"{'; '.join(plain_message(error) for error in exc.errors())}"
        ) from None


def refuse_before_a_run(spec: PipelineSpec, as_run: PipelineSpec, refused: str | None) -> None:
    """What a Dagster run refuses before any sim starts, as ``hud-pipelines run`` does: ``refused``, why the code
    location refuses every run (its deployment file names a pipeline the folder does not declare: the typo would
    leave the pipeline it meant on its YAML's own resources, local sims instead of the fleet, silently; a job
    built for one file, as the CLI's, has none: the CLI judged the names itself), then what the YAML itself would
    fail on (:func:`refuse_unrunnable`)."""
    if refused is not None:
        raise DeploymentError(refused)
    refuse_unrunnable(spec, as_run)
