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


EVERY_FILE = "*"
"""The key of the whole location's digest (every pipeline file and the deployment file): a job that is no one
pipeline's (Dagster's job of every asset, which "Materialize all" and asset selections run) is held to it."""


def location_digests(directory: Path | None = None) -> dict[str, str]:
    """Each valid pipeline's digest (its file and the deployment file, as read now) by pipeline name, and the
    whole location's under :data:`EVERY_FILE`, of ``directory`` (by default the code location's:
    ``$HUD_PIPELINES_DIR`` or ``./pipelines``)."""
    directory = directory or default_pipelines_dir()
    files = pipeline_files(directory) if directory.is_dir() else []
    specs, _ = collect_pipelines(files)
    deployment = deployment_path()
    digests = {spec.name: files_digest(spec.source, deployment) for spec in specs if spec.source is not None}
    whole = hashlib.sha256("\0".join(files_digest(file, deployment) for file in sorted(files)).encode())
    return {**digests, EVERY_FILE: whole.hexdigest()[:16]}


def run_digest(job: ReconstructableJob) -> str:
    """The digest of ``job``'s pipeline (or of the whole location, for a job of no one pipeline) as this process
    loaded it, when the job comes from the code location module (``""`` for a job of ``hud-pipelines run``,
    which carries its own, or a module not loaded here)."""
    pointer = job.get_python_origin().get_repo_pointer()
    module = sys.modules.get(LOCATION_MODULE)
    if not isinstance(pointer, ModuleCodePointer) or pointer.module != LOCATION_MODULE or module is None:
        return ""
    return _digest_of(_digests(module), job.job_name)


def load_as_run(job_name: str, digest: str) -> None:
    """Make this worker's code location the one the run of ``job_name`` loaded (its ``digest``): refuse when the
    files now differ from the run's (read first: a refused step costs no rebuild), else reload the module when
    this worker loaded other files. The worker runs one step at a time (``--pool solo``): nothing else uses
    the module while it is replaced."""
    module = importlib.import_module(LOCATION_MODULE)
    if _digest_of(_digests(module), job_name) == digest:
        return
    if _digest_of(location_digests(), job_name) != digest:
        worker_file = deployment_path()
        raise DeploymentError(
            f"this worker sees the files of job {job_name!r} (its pipeline's or the deployment file, here "
            f"{worker_file or 'none: $HUD_PIPELINES_DEPLOYMENT is not set'}) differently from the run that sent "
            "the step: the run was launched with another deployment file, or a file was edited since it began; a "
            "run runs the configuration it began with: launch it with the workers' deployment file and files"
        )
    ReconstructableJob.get_repository_definition.cache_clear()  # Dagster keeps the last job it built
    ReconstructableJob.get_definition.cache_clear()
    importlib.reload(module)  # a reload that fails leaves the module's digests as they were: it is tried again


def _digest_of(digests: dict[str, str], job_name: str) -> str:
    return digests.get(job_name) or digests.get(EVERY_FILE, "")


def _digests(module: ModuleType) -> dict[str, str]:
    found: dict[str, str] = getattr(module, "digests", {})
    return found


def files_digest(pipeline: Path, deployment: Path | None) -> str:
    """A digest of the pipeline file and the deployment file, as this process reads them."""
    digest = hashlib.sha256(pipeline.read_bytes())
    if deployment is not None:
        digest.update(b"\0" + deployment.read_bytes())
    return digest.hexdigest()[:16]
