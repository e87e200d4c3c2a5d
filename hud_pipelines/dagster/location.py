"""The code location's pipeline files as a worker sees them, and a worker's reload when they change.

A run launched from Dagster (the UI, a sensor, ``dagster job execute``) points its steps at the code
location module, :mod:`hud_pipelines.definitions`, which builds ``defs`` once per process, at import.
A Celery worker lives across runs, so after a YAML edit (and a reload in the UI) it would go on running
the steps of new runs with the configuration it imported first. So the run hands each step the digest
of its pipeline's file and the deployment file as the run's own process loaded them
(:func:`run_digest`), and the worker (:func:`load_as_run`) reloads the module when it has loaded them
otherwise, and refuses a step whose files have changed since its run began, as a worker refuses a step
of a ``hud-pipelines run`` whose files it sees differently (:func:`~.launch.pipeline_job`).
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path
from types import ModuleType

from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.definitions.reconstruct import ReconstructableJob

from hud_pipelines.dagster.deployment import deployment_path
from hud_pipelines.errors import DeploymentError
from hud_pipelines.spec.loader import collect_pipelines, default_pipelines_dir, pipeline_files

LOCATION_MODULE = "hud_pipelines.definitions"
LOCATION_DIGEST = "hud_pipelines_location_digest"
"""The key of the run's digest in a step's job pointer (dagster-celery's task takes no other argument)."""


def location_digests(directory: Path | None = None) -> dict[str, str]:
    """Each valid pipeline's digest (its file and the deployment file, as read now) by pipeline name, of
    ``directory`` (by default the code location's: ``$HUD_PIPELINES_DIR`` or ``./pipelines``)."""
    directory = directory or default_pipelines_dir()
    specs, _ = collect_pipelines(pipeline_files(directory) if directory.is_dir() else [])
    deployment = deployment_path()
    return {spec.name: files_digest(spec.source, deployment) for spec in specs if spec.source is not None}


def run_digest(job: ReconstructableJob) -> str:
    """The digest of ``job``'s pipeline as this process loaded it, when the job comes from the code location
    module (``""`` for a job of ``hud-pipelines run``, which carries its own, or a module not loaded here)."""
    pointer = job.get_python_origin().get_repo_pointer()
    module = sys.modules.get(LOCATION_MODULE)
    if not isinstance(pointer, ModuleCodePointer) or pointer.module != LOCATION_MODULE or module is None:
        return ""
    return _digests(module).get(job.job_name, "")


def load_as_run(job_name: str, digest: str) -> None:
    """Make this worker's code location the one the run of ``job_name`` loaded (its ``digest``): reload the
    module when this worker loaded other files; refuse when the files now differ from the run's."""
    module = importlib.import_module(LOCATION_MODULE)
    if _digests(module).get(job_name) == digest:
        return
    module = importlib.reload(module)
    ReconstructableJob.get_repository_definition.cache_clear()  # Dagster keeps the last job it built
    ReconstructableJob.get_definition.cache_clear()
    if _digests(module).get(job_name) != digest:
        raise DeploymentError(
            f"this worker sees the file of pipeline {job_name!r} or the deployment file differently from the run "
            "that sent the step (edited since the run began?); a run runs the configuration it began with: "
            "launch a new run, and give every worker the same files"
        )


def _digests(module: ModuleType) -> dict[str, str]:
    found: dict[str, str] = getattr(module, "digests", {})
    return found


def files_digest(pipeline: Path, deployment: Path | None) -> str:
    """A digest of the pipeline file and the deployment file, as this process reads them."""
    digest = hashlib.sha256(pipeline.read_bytes())
    if deployment is not None:
        digest.update(b"\0" + deployment.read_bytes())
    return digest.hexdigest()[:16]
