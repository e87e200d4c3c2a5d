"""Steps as Kubernetes Jobs: a deployment's ``executor: k8s`` settings as dagster-k8s configuration.

With dagster-k8s's ``k8s_job_executor`` every step of a run is a Kubernetes Job, so each unit (an
instance of the eval, with its own sims) gets a pod, and the units of a GPU pipeline get a GPU
through the ``dagster-k8s/config`` op tag. Kubernetes says when a pod died and the executor fails
that step, so there is no lease: the unit op's retry policy gives the same rule as on Celery (run
again ``retries`` times, then one last attempt that records the instance as ``worker_lost``).

The deployment file's own model refuses a resource block that is not Kubernetes resource
requirements; what it accepts is checked here against dagster-k8s's schema and Kubernetes models
when the job is built, so a bad value is refused before the first pod is created. dagster-k8s (and
the kubernetes client it brings) is imported only here, only for a k8s deployment.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from hud_pipelines.dagster.execution import ExecutionSettings
from hud_pipelines.errors import DeploymentError

K8S_CONFIG_TAG = "dagster-k8s/config"
"""dagster-k8s's op tag: Kubernetes configuration merged into that op's step Job."""


def executor_config(settings: ExecutionSettings) -> dict[str, Any]:
    """The ``k8s_job_executor`` configuration of ``settings`` (only the fields the deployment sets)."""
    config: dict[str, Any] = {}
    if settings.image:
        config["job_image"] = settings.image
    if settings.namespace:
        config["job_namespace"] = settings.namespace
    if settings.env_secrets:
        config["env_secrets"] = list(settings.env_secrets)
    if settings.max_concurrent is not None:
        config["max_concurrent"] = settings.max_concurrent
    return config


def unit_tags(settings: ExecutionSettings) -> dict[str, str]:
    """The op tags that give each unit's pod its resources (none when the deployment sets none)."""
    if not settings.unit_resources:
        return {}
    return {K8S_CONFIG_TAG: json.dumps({"container_config": {"resources": settings.unit_resources}})}


def unit_retry_policy(settings: ExecutionSettings) -> dg.RetryPolicy:
    """A unit whose pod died runs ``retries`` more times, then once more to record the loss."""
    return dg.RetryPolicy(max_retries=settings.retries + 1)


def problems(settings: ExecutionSettings) -> list[str]:
    """What dagster-k8s would refuse in ``settings``: ``"<key>: <why>"`` per problem (empty: valid)."""
    from dagster._config import validate_config
    from dagster_k8s import k8s_job_executor
    from dagster_k8s.job import get_user_defined_k8s_config
    from dagster_k8s.models import k8s_model_from_dict
    from kubernetes.client import V1ResourceRequirements

    found: list[str] = []
    schema = k8s_job_executor.config_schema.as_field().config_type
    result = validate_config(schema, executor_config(settings))
    found += [f"executor configuration: {error.message}" for error in result.errors or []]
    try:
        container = get_user_defined_k8s_config(unit_tags(settings)).container_config
        k8s_model_from_dict(V1ResourceRequirements, dict(container.get("resources", {})))
    except Exception as exc:  # dagster-k8s raises bare Exception for unknown model keys
        found.append(f"unit_resources: {exc} (expected Kubernetes resource requirements: limits, requests)")
    return found


def executor(settings: ExecutionSettings) -> dg.ExecutorDefinition:
    """dagster-k8s's ``k8s_job_executor`` configured from the deployment."""
    from dagster_k8s import k8s_job_executor

    found = problems(settings)
    if found:
        raise DeploymentError("execution (k8s): " + "; ".join(found))
    return k8s_job_executor.configured(executor_config(settings), name="hud_k8s")
