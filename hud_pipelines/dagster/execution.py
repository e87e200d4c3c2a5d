"""Where a pipeline's steps run: the ``execution:`` sections of a deployment file.

In the process of the run (the default: no broker, no workers), each instance as a unit of work on
Celery workers, or each step as a Kubernetes Job. At the top level of the deployment file a section
holds for every pipeline; under a pipeline it replaces fields for that one (``queue: gpu``), except
the settings the whole fleet shares (:data:`FLEET_SETTINGS`). Each section is validated when it is
read, every problem at its line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from hud_pipelines.dagster.deployment import (
    EVERY_PIPELINE,
    EXECUTION,
    INTERPOLATION,
    deployment_path,
    located,
    read_file,
)
from hud_pipelines.errors import DeploymentError
from hud_pipelines.spec.messages import plain_message
from hud_pipelines.spec.problems import did_you_mean

IN_PROCESS, CELERY, K8S = "in_process", "celery", "k8s"
EXECUTORS = (IN_PROCESS, CELERY, K8S)
RESOURCE_REQUIREMENTS = ("limits", "requests")
"""The fields of a Kubernetes container's resources block (``unit_resources``)."""
K8S_SETTINGS = ("image", "namespace", "unit_resources", "env_secrets", "max_concurrent")
"""Execution settings only the k8s executor reads."""
FLEET_SETTINGS = frozenset({"broker", "backend", "lease_s"})
"""Execution settings of the whole deployment (the workers read them too), never set per pipeline."""


class ExecutionSettings(BaseModel):
    """Where a pipeline's steps run: the ``execution:`` section of a deployment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: str = Field(
        default=IN_PROCESS,
        description="in_process: every step in the run's process (one sim set for the run); celery: every "
        "instance is a unit of work on a Celery worker, with its own sim set; k8s: every step is a Kubernetes "
        "Job (a pod per unit)",
    )
    broker: str | None = Field(default=None, description="redis://host:port/db of the Celery broker (celery only)")
    backend: str | None = Field(default=None, description="Celery result backend; default: the broker")
    queue: str = Field(
        default="cpu", min_length=1, description="the Celery queue of the pipeline's units (e.g. cpu or gpu)"
    )
    control_queue: str = Field(
        default="cpu",
        min_length=1,
        description="the queue of the other steps: planning, collecting, grades, report, dataset, checks",
    )
    retries: int = Field(default=0, ge=0, description="times a unit whose worker was lost runs again")
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="a running unit whose worker has not renewed its lease for this long is taken as lost; a step "
        "that no worker has taken for this long is said (the run waits for a worker of its queue)",
    )

    image: str | None = Field(default=None, description="k8s: the image of the step pods (default: the run's)")
    namespace: str | None = Field(default=None, description="k8s: the namespace of the step Jobs")
    unit_resources: dict[str, dict[str, str | int]] = Field(
        default_factory=dict[str, dict[str, str | int]],
        description="k8s: the resources of each unit's container, e.g. {limits: {nvidia.com/gpu: 1}}",
    )
    env_secrets: list[str] = Field(
        default_factory=list[str], description="k8s: Secrets whose keys become the step pods' environment"
    )
    max_concurrent: int | None = Field(default=None, ge=1, description="k8s: step pods running at once at most")

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, value: str) -> str:
        if value not in EXECUTORS:
            raise ValueError(
                f"unknown executor {value!r}{did_you_mean(value, EXECUTORS)}; expected one of {', '.join(EXECUTORS)}"
            )
        return value

    @field_validator("broker", "backend")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        """A URL with a scheme, and ports in range (a sentinel list is ``;``-separated URLs): Celery would otherwise
        import ``not a url`` as a module, and a port of 99999 fail the run at its first connection."""
        if value is None:
            return value
        if "://" not in value:
            raise ValueError(f"{value!r} is not a URL (e.g. redis://host:6379/0)")
        for url in value.split(";"):
            try:
                urlsplit(url).port  # noqa: B018 - raises on a port out of range or not a number
            except ValueError as exc:
                encode = " (percent-encode a password's special characters)" if "cast" in str(exc) else ""
                raise ValueError(f"{value!r}: {exc}{encode}") from None
        return value

    @field_validator("unit_resources")
    @classmethod
    def _resource_requirements(cls, value: dict[str, dict[str, str | int]]) -> dict[str, dict[str, str | int]]:
        unknown = sorted(set(value) - set(RESOURCE_REQUIREMENTS))
        if unknown:
            expected = " or ".join(RESOURCE_REQUIREMENTS)
            raise ValueError(f"{unknown[0]!r} is not a Kubernetes resource requirement; expected {expected}")
        return value

    @property
    def distributed(self) -> bool:
        """Whether units run on workers or pods of their own (rather than in the run's process)."""
        return self.executor != IN_PROCESS

    @property
    def result_backend(self) -> str | None:
        return self.backend or self.broker


class Execution(BaseModel):
    """The execution settings of a deployment: for every pipeline, and replaced fields per pipeline."""

    model_config = ConfigDict(frozen=True)

    default: ExecutionSettings = ExecutionSettings()
    pipelines: dict[str, dict[str, Any]] = Field(default_factory=dict[str, dict[str, Any]])

    def for_pipeline(self, pipeline: str) -> ExecutionSettings:
        """The settings of ``pipeline``: its own fields over those for every pipeline."""
        every = self.pipelines.get(EVERY_PIPELINE, {})
        own = self.pipelines.get(pipeline, {})
        if not every and not own:
            return self.default
        return ExecutionSettings.model_validate({**self.default.model_dump(), **every, **own})


def load_execution(path: Path | None = None) -> Execution:
    """The ``execution:`` sections of the deployment file at ``path`` (default ``$HUD_PIPELINES_DEPLOYMENT``).

    Without a file, or without the section, everything runs in process as it always has. Each
    section is validated here, so a bad value is refused naming the file and the key.
    """
    if path is None:
        path = deployment_path()
        if path is None:
            return Execution()
    loaded = read_file(path)
    problems: list[str] = []  # every section's, all at once, as a pipeline file's
    try:
        default = _settings(path, EXECUTION, loaded.get(EXECUTION) or {}, {})
    except DeploymentError as exc:
        problems.append(str(exc))
        default = ExecutionSettings()  # the pipelines' sections are still checked, over the defaults
    per_pipeline: dict[str, dict[str, Any]] = {}
    pipelines = cast(dict[str, Any], loaded.get("pipelines") if isinstance(loaded.get("pipelines"), dict) else {})
    every_first = sorted(pipelines, key=lambda name: name != EVERY_PIPELINE)  # the others' sections go over its
    for pipeline in every_first:
        parts = pipelines[pipeline]
        own = cast(dict[str, Any], parts).get(EXECUTION) if isinstance(parts, dict) else None
        if own is None:
            continue
        where = f"pipelines.{pipeline}.{EXECUTION}"
        shared = sorted(set(cast(dict[str, Any], own) if isinstance(own, dict) else {}) & FLEET_SETTINGS)
        if shared:
            problems.append(
                f"deployment file {located(path, (*where.split('.'), shared[0]))}: {where}.{shared[0]}: set under the "
                "top-level 'execution:' only (every run and worker of a deployment share one broker and one lease)"
            )
            continue
        base = {**default.model_dump(), **(per_pipeline.get(EVERY_PIPELINE, {}) if pipeline != EVERY_PIPELINE else {})}
        try:  # over what the pipeline gets otherwise, as :meth:`Execution.for_pipeline` merges them
            settings = _settings(path, where, cast(object, own), base)
        except DeploymentError as exc:
            problems.append(str(exc))
            continue
        per_pipeline[str(pipeline)] = settings.model_dump(include=set(cast(dict[str, Any], own)))
    if problems:
        raise DeploymentError("\n".join(problems))
    return Execution(default=default, pipelines=per_pipeline)


def _setting_problem(path: Path, where: str, error: ErrorDetails) -> str:
    """``file:line:column: key: what is wrong``, in the words the pipeline files' errors use."""
    keys = (*where.split("."), *(str(part) for part in error["loc"]))
    key = ".".join(keys)
    message = plain_message(error)
    if error["type"] == "extra_forbidden":
        known = sorted(ExecutionSettings.model_fields)
        message += f"{did_you_mean(keys[-1], known)}; expected one of: {', '.join(known)}"
    return f"{located(path, keys)}: {key}: {message}"


def _settings(path: Path, where: str, section: object, base: dict[str, Any]) -> ExecutionSettings:
    """One ``execution:`` section over ``base``, validated; errors name the file and the key."""
    if not isinstance(section, dict):
        raise DeploymentError(f"deployment file {path}: {where}: expected a mapping of execution settings")
    given = cast(dict[str, Any], section)
    fields = {k: _resolved(path, f"{where}.{k}", v) for k, v in given.items()}
    written = [k for k, v in given.items() if INTERPOLATION.search(str(v))]
    if written:  # a pipeline file's interpolation, taken as written: a queue named '${QUEUE}' no worker reads
        raise DeploymentError(
            "\n".join(
                f"deployment file {located(path, (*where.split('.'), k))}: {where}.{k}: '${{...}}' is not expanded in "
                "a deployment file; read the environment with {env: NAME}"
                for k in written
            )
        )
    try:
        settings = ExecutionSettings.model_validate({**base, **fields})
    except ValidationError as exc:
        problems = "\n".join(f"deployment file {_setting_problem(path, where, error)}" for error in exc.errors())
        raise DeploymentError(problems) from exc
    k8s_only = [name for name in K8S_SETTINGS if name in fields]  # inherited ones: an executor set per pipeline
    if k8s_only and settings.executor != K8S:
        raise DeploymentError(
            f"deployment file {located(path, (*where.split('.'), k8s_only[0]))}: {where}.{k8s_only[0]}: "
            f"{', '.join(k8s_only)}: k8s setting(s), and the executor here is {settings.executor}"
        )
    if settings.executor == CELERY and not (settings.broker or "").startswith(("redis://", "rediss://")):
        whose = "" if where == EXECUTION else f" ({where} runs on celery)"
        raise DeploymentError(
            f"deployment file {located(path, (EXECUTION, 'broker'))}: {EXECUTION}.broker: the celery executor needs "
            "a Redis broker "
            f"(redis://host:port/db){whose}, got {settings.broker!r}"
        )
    return settings


def _resolved(path: Path, where: str, value: object) -> object:
    """``{env: NAME}`` read from the environment now (the broker's address must be the same on every side)."""
    mapping = cast(dict[str, Any], value) if isinstance(value, dict) else None
    if mapping is not None and set(mapping) == {"env"}:
        name = str(mapping["env"])
        if name not in os.environ:
            raise DeploymentError(f"deployment file {path}: {where}: environment variable {name} is not set")
        return os.environ[name]
    return cast(object, value)
