"""A k8s deployment: the executor configuration and the unit pods' resources that dagster-k8s would use.

No cluster here, so the proof stops where Kubernetes would start: the executor configuration the
project generates is valid for dagster-k8s's ``k8s_job_executor``, and the Job manifest dagster-k8s
builds for a unit step from the unit op's tags asks for the deployment's GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._config import validate_config
from dagster_k8s import k8s_job_executor
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from hud_pipelines.dagster import k8s
from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV, DeploymentError
from hud_pipelines.dagster.execution import load_execution
from hud_pipelines.errors import HudPipelinesError
from tests.dagster.support import REPO, WritePipeline

GPU = {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "2", "memory": "8Gi"}}


def _deployment(tmp_path: Path, **execution: object) -> Path:
    path = tmp_path / "deployment.yaml"
    path.write_text(json.dumps({"execution": {"executor": "k8s", **execution}}))
    return path


def _unit_op(job: dg.JobDefinition, name: str) -> dg.OpDefinition:
    nodes = job.graph.node_dict[f"{name}__eval"].definition.nodes  # type: ignore[attr-defined]
    return {node.name: node.definition for node in nodes}["unit"]


def test_the_generated_executor_configuration_validates_against_dagster_k8s(tmp_path: Path) -> None:
    path = _deployment(
        tmp_path, image="registry.example/evals:1", namespace="evals", env_secrets=["hud-tokens"], max_concurrent=8
    )
    settings = load_execution(path).default
    schema = k8s_job_executor.config_schema.as_field().config_type
    result = validate_config(schema, k8s.executor_config(settings))
    assert result.success, result.errors
    processed = result.value or {}
    assert processed["job_image"] == "registry.example/evals:1"
    assert processed["job_namespace"] == "evals"
    assert processed["env_secrets"] == ["hud-tokens"]
    assert processed["max_concurrent"] == 8


def test_a_k8s_deployment_puts_each_unit_in_a_pod_with_its_gpu_and_a_retry_per_lost_pod(
    write_pipeline: WritePipeline, outputs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dagster.definitions import definitions_for_file

    path = write_pipeline("on_pods", group=2)
    monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path, image="evals:1", unit_resources=GPU, retries=1)))
    job = definitions_for_file(path, outputs_dir=outputs_dir, project_dir=REPO).resolve_job_def("on_pods")
    assert job.executor_def.name == "hud_k8s"
    unit = _unit_op(job, "on_pods")
    assert unit.retry_policy == dg.RetryPolicy(max_retries=2), "one retry, then the attempt that records the loss"

    user_config = get_user_defined_k8s_config(unit.tags)  # what dagster-k8s reads from the step's tags
    manifest = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="evals:1", dagster_home="/opt/dagster/home"),
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-unit",
        user_defined_k8s_config=user_config,
    )
    [container] = manifest.spec.template.spec.containers
    assert container.resources.limits == {"nvidia.com/gpu": "1"}  # Kubernetes quantities are strings
    assert container.resources.requests == {"cpu": "2", "memory": "8Gi"}
    assert container.image == "evals:1"


def test_k8s_resources_that_are_not_resource_requirements_are_refused_naming_the_key(tmp_path: Path) -> None:
    path = _deployment(tmp_path, unit_resources={"limit": {"nvidia.com/gpu": 1}})
    with pytest.raises(DeploymentError) as refused:
        load_execution(path)
    message = str(refused.value)
    assert "execution.unit_resources" in message
    assert "'limit' is not a Kubernetes resource requirement; expected limits or requests" in message
    assert str(path) in message


def test_a_run_queue_is_refused_where_units_do_not_run_on_celery(
    write_pipeline: WritePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.cli.run import run_pipeline

    path = write_pipeline("local_only", group=1)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    with pytest.raises(HudPipelinesError, match=r"--queue gpu: local_only runs its units in_process here"):
        run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True, queue="gpu")
    monkeypatch.setenv(DEPLOYMENT_ENV, str(_deployment(tmp_path)))
    with pytest.raises(HudPipelinesError, match=r"runs its units k8s here; queues route units to Celery"):
        run_pipeline(str(path), outputs_dir=tmp_path / "out", quiet=True, queue="gpu")
    assert not (tmp_path / "out").exists(), "nothing ran"
