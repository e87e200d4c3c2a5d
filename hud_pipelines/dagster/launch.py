"""Run one pipeline's job where its deployment says: in this process, or its steps on Celery workers.

In process, the job runs with ``execute_in_process`` as it always has. On workers, every step is
rebuilt by the worker that runs it, so the job must be *reconstructable*: the run hands each worker
a pointer to :func:`pipeline_job` with the pipeline file, the outputs and project folders and the
deployment file, plus a digest of both files. A worker rebuilds the same job from the same files
(it must see them at the same paths: a shared checkout or image), and refuses to run a step of a
run whose files it sees differently, instead of running another configuration. The digest is also
part of the pointer, so a long-lived worker never reuses a job it built before a file changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.execution.api import execute_run
from dagster._core.execution.execution_result import ExecutionResult

from hud_pipelines.dagster.deployment import deployment_path, load_deployment
from hud_pipelines.dagster.execution import Execution, ExecutionSettings, load_execution
from hud_pipelines.dagster.location import files_digest
from hud_pipelines.errors import DeploymentError
from hud_pipelines.spec.loader import load_pipeline

BROKER_TIMEOUT_S = 5.0


def pipeline_job(
    path: str, outputs_dir: str, project_dir: str, deployment: str | None = None, digest: str = ""
) -> dg.JobDefinition:
    """The job of the pipeline file ``path`` as the run that hands out its steps built it."""
    pipeline, deployment_file = Path(path), Path(deployment) if deployment else None
    found = files_digest(pipeline, deployment_file)
    if digest and found != digest:
        raise DeploymentError(
            f"this worker sees {pipeline}"
            + (f" or {deployment_file}" if deployment_file else "")
            + " differently from the run that sent the step; give every worker the run's files"
        )
    from hud_pipelines.dagster.definitions import definitions_for

    spec = load_pipeline(pipeline)
    defs = definitions_for(
        [spec],
        outputs_dir=Path(outputs_dir),
        project_dir=Path(project_dir),
        deployment=load_deployment(deployment_file) if deployment_file else {},
        execution=load_execution(deployment_file) if deployment_file else Execution(),
    )
    return defs.resolve_job_def(spec.name)


def reconstructable_pipeline_job(
    path: Path, *, outputs_dir: Path, project_dir: Path, deployment: Path | None = None
) -> ReconstructableJob:
    """A pointer to :func:`pipeline_job` for ``path`` that a worker can rebuild the job from."""
    kwargs: dict[str, object] = {
        "path": str(path.resolve()),
        "outputs_dir": str(outputs_dir.resolve()),
        "project_dir": str(project_dir.resolve()),
        "deployment": str(deployment.resolve()) if deployment else None,
        "digest": files_digest(path, deployment),
    }
    return dg.build_reconstructable_job(__name__, pipeline_job.__name__, reconstructable_kwargs=kwargs)


def distributed(pipeline: str, deployment: Path | None = None) -> bool:
    """Whether the deployment (default ``$HUD_PIPELINES_DEPLOYMENT``) runs ``pipeline``'s steps on workers."""
    where = deployment or deployment_path()
    return where is not None and load_execution(where).for_pipeline(pipeline).distributed


def execute_pipeline_job(
    job: dg.JobDefinition,
    path: Path,
    *,
    instance: dg.DagsterInstance,
    outputs_dir: Path,
    project_dir: Path,
    tags: Mapping[str, str],
    run_config: Mapping[str, Any],
    run_id: str,
) -> ExecutionResult:
    """Run ``job`` (the pipeline file ``path``'s) as run ``run_id``: in process, or on the deployment's workers.

    Failures are results, never exceptions (``raise_on_error=False`` either way).
    """
    deployment = deployment_path()
    if not distributed(job.name, deployment):
        return job.execute_in_process(
            instance=instance, tags=dict(tags), run_config=dict(run_config), raise_on_error=False, run_id=run_id
        )
    assert deployment is not None
    _check_broker(load_execution(deployment).for_pipeline(job.name), deployment)
    recon = reconstructable_pipeline_job(path, outputs_dir=outputs_dir, project_dir=project_dir, deployment=deployment)
    rebuilt = recon.get_definition()
    run = instance.create_run_for_job(
        job_def=rebuilt,
        run_id=run_id,
        run_config=dict(run_config),
        tags={**rebuilt.run_tags, **tags},  # the job's default range, as execute_in_process applies it
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance, raise_on_error=False)


def _check_broker(settings: ExecutionSettings, deployment: Path) -> None:
    """Refuse to start a run whose broker does not answer (its steps would fail one by one, unexplained)."""
    import redis

    url = settings.broker or ""
    client = redis.Redis.from_url(url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise DeploymentError(
            f"deployment file {deployment}: execution.broker: {url} does not answer ({exc}); start it "
            "(redis-server) or unset HUD_PIPELINES_DEPLOYMENT to run in process"
        ) from exc
    finally:
        client.close()
