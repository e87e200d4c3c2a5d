"""The executor of a pipeline's job (in process, on Celery workers, as Kubernetes Jobs) and where units go.

Import-light on purpose: every code location and CLI run builds its jobs through here, and only a
job that runs on workers imports Celery (:mod:`hud_pipelines.dagster.celery_executor`) or
dagster-k8s (:mod:`hud_pipelines.dagster.k8s`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import dagster as dg

from hud_pipelines.dagster import k8s
from hud_pipelines.dagster.execution import K8S, ExecutionSettings

EXECUTOR_CONFIG: dict[str, Any] = {
    "broker": dg.Field(str, description="redis://host:port/db of the broker the workers listen to"),
    "backend": dg.Field(str, is_required=False, description="Celery result backend (default: the broker)"),
    "control_queue": dg.Field(str, default_value="cpu", description="queue of the steps that are not units"),
    "retries": dg.Field(int, default_value=0, description="times a step whose worker was lost runs again"),
    "lease_s": dg.Field(float, default_value=30.0, description="a worker silent for this long is taken as lost"),
}


@dg.executor(
    name="hud_celery",
    config_schema=EXECUTOR_CONFIG,
    requirements=dg.multiple_process_executor_requirements(),
)
def hud_celery_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """Each step on a Celery worker (dagster-celery), a step whose worker died retried or failed by the run."""
    from hud_pipelines.dagster.celery_executor import leased_executor  # celery is imported only where it runs

    config = cast(Mapping[str, Any], init_context.executor_config)
    broker = str(config["broker"])
    return leased_executor(
        broker,
        str(config.get("backend") or broker),
        str(config["control_queue"]),
        int(config["retries"]),
        float(config["lease_s"]),
    )


def executor_for(settings: ExecutionSettings) -> dg.ExecutorDefinition:
    """The executor of a pipeline's job: in process (the default) or on the deployment's Celery workers."""
    if not settings.distributed:
        return dg.in_process_executor
    if settings.executor == K8S:
        return k8s.executor(settings)
    config: dict[str, Any] = {
        "broker": settings.broker,
        "backend": settings.result_backend,
        "control_queue": settings.control_queue,
        "retries": settings.retries,
        "lease_s": settings.lease_s,
    }
    return hud_celery_executor.configured(config, name="hud_celery")


@dataclass(frozen=True)
class UnitPlacement:
    """What a unit op carries so that its executor puts it where the deployment says."""

    where: str
    """Where each unit runs, in words (the op's description)."""
    unit_tags: dict[str, str] = field(default_factory=dict[str, str])
    unit_retry_policy: dg.RetryPolicy | None = None

    @classmethod
    def of(cls, settings: ExecutionSettings) -> UnitPlacement:
        if settings.executor == K8S:
            return cls("a Kubernetes pod of its own", k8s.unit_tags(settings), k8s.unit_retry_policy(settings))
        return cls(f"a worker of the {settings.queue} queue")
