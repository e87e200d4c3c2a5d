"""Definitions from every pipeline file of a directory (``$HUD_PIPELINES_DIR`` or ``./pipelines``).

One broken file must not take the whole code location down (every pipeline would vanish from the UI
and from ``dagster job list``): each file is loaded on its own, the valid ones become assets, checks
and jobs, and each broken one is logged as an error and shown in the UI as a marker asset of the
group :data:`BROKEN_GROUP`, whose description lists the file's problems (``file:line:column: key:
message``). A marker is in no pipeline's job and its materialization fails with the same problems;
an asset rather than definitions-level metadata because the UI shows assets and their descriptions
and does not show that metadata. ``hud-pipelines validate`` keeps failing for the file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from hud_pipelines.dagster.assets import build_pipeline_assets
from hud_pipelines.dagster.deployed import deployment_misfit
from hud_pipelines.dagster.deployment import (
    Deployment,
    deployment_path,
    for_pipeline,
    load_deployment,
    refuse_unknown_pipelines,
)
from hud_pipelines.dagster.execution import Execution, load_execution
from hud_pipelines.dagster.executors import executor_for
from hud_pipelines.dagster.resources import pipeline_resources
from hud_pipelines.dagster.sweeps import checkpoint_sensor
from hud_pipelines.errors import DeploymentError
from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
from hud_pipelines.spec.loader import (
    collect_pipelines,
    declared_name,
    default_pipelines_dir,
    load_pipeline,
    pipeline_files,
)
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, SpecError

BROKEN_GROUP = "broken_pipelines"
"""Asset group (and key prefix) of the markers of pipeline files that did not load."""

log = logging.getLogger(__name__)


def definitions_for(
    specs: list[PipelineSpec],
    *,
    outputs_dir: Path | None = None,
    project_dir: Path | None = None,
    broken: Sequence[Problem] = (),
    deployment: Deployment | None = None,
    execution: Execution | None = None,
    refused: str | None = None,
) -> dg.Definitions:
    """Assets, checks, jobs and resources of ``specs`` (each loaded from a file), plus a marker asset
    for each file that ``broken`` (the problems of files that did not load) names.

    Each pipeline gets its four resources (sim, contract, agent, graders) from its YAML, with the
    fields that ``deployment`` (default: the ``$HUD_PIPELINES_DEPLOYMENT`` file) replaces, and runs
    where ``execution`` (default: that file's ``execution:`` sections; else in process) says. ``refused``: why
    every run is refused before any sim starts (a deployment file naming a pipeline the folder does not declare).
    """
    outputs = (outputs_dir or default_outputs_root()).resolve()
    project = (project_dir or Path.cwd()).resolve()
    assets: list[dg.AssetsDefinition] = broken_file_assets(broken)
    checks: list[dg.AssetChecksDefinition] = []
    jobs: list[UnresolvedAssetJobDefinition] = []
    sensors: list[dg.SensorDefinition] = []
    resources: dict[str, object] = {}
    swaps = load_deployment() if deployment is None else deployment
    where = load_execution() if execution is None else execution
    for spec in specs:
        if spec.source is None:
            raise ValueError(f"pipeline {spec.name!r} was not loaded from a file")
        spec_outputs = EvalOutputs(outputs, spec.name)
        spec_assets, spec_checks, job = build_pipeline_assets(
            spec, outputs=spec_outputs, project_dir=project, execution=where.for_pipeline(spec.name), refused=refused
        )
        assets += spec_assets
        checks += spec_checks
        jobs.append(job)
        if spec.is_sweep:
            sensors.append(checkpoint_sensor(spec, spec_outputs))
        parts = pipeline_resources(spec, project_dir=project, deployment=for_pipeline(swaps, spec.name))
        resources.update(parts.by_key(spec.name))
    # Every launch, also an asset selection from the UI, runs its steps where the deployment says:
    # in one process by default (the multiprocess default would start a process, and a sim, per
    # step), or on its Celery workers.
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        resources=resources,
        executor=executor_for(where.default),
    )


def build_definitions(directory: Path | None = None, *, outputs_dir: Path | None = None) -> dg.Definitions:
    """Definitions of every valid pipeline file in ``directory``; each broken one is logged and marked."""
    directory = directory or default_pipelines_dir()
    files = pipeline_files(directory) if directory.is_dir() else []
    specs, problems = collect_pipelines(files)
    for file, found in _by_file(problems).items():
        log.error(
            "pipeline file %s is left out of the code location (the other pipelines load); fix it and reload:\n%s",
            file,
            SpecError(found).render(),
        )
    deployment = load_deployment()
    refused: str | None = None
    try:
        refuse_unknown_pipelines(
            deployment, [spec.name for spec in specs] + [declared_name(Path(p.file)) for p in problems]
        )
    except DeploymentError as exc:  # the other pipelines still load, their runs refused; the UI shows the marker
        log.error("%s", exc)
        problems, refused = [*problems, Problem(str(deployment_path()), 0, 0, "", str(exc))], str(exc)
    # a field that breaks a pipeline's rule: its runs would fail their first step, lineless (a "*" field: said once)
    misfits = dict.fromkeys(line for spec in specs for line in (deployment_misfit(spec, deployment) or "").splitlines())
    if misfits:
        log.error("%s", "\n".join(misfits))
        problems = [*problems, *(Problem(str(deployment_path()), 0, 0, "", line) for line in misfits)]
    project = directory.parent
    return definitions_for(
        specs, outputs_dir=outputs_dir, project_dir=project, broken=problems, deployment=deployment, refused=refused
    )


def broken_file_assets(problems: Sequence[Problem]) -> list[dg.AssetsDefinition]:
    """One marker asset per file among ``problems``: the file's problems, visible in the UI."""
    markers: list[dg.AssetsDefinition] = []
    taken: set[str] = set()
    for file, found in _by_file(problems).items():
        name = _marker_name(file, taken)
        taken.add(name)
        markers.append(_marker(file, name, SpecError(found)))
    return markers


def _marker(file: str, name: str, error: SpecError) -> dg.AssetsDefinition:
    rendered = error.render()
    deployment = deployment_path()
    what = (  # the deployment file's pipelines still load: their runs are refused or fail until it is fixed
        "is not a valid deployment file**: the runs it configures fail until it is fixed"
        if deployment is not None and file == str(deployment)
        else "is not a valid pipeline**: it is left out of this code location until it is fixed"
    )
    description = (
        f"**{file} {what} (check it with `hud-pipelines validate {file}`, then reload).\n\n```\n{rendered}\n```"
    )

    @dg.asset(
        key=dg.AssetKey([BROKEN_GROUP, name]),
        group_name=BROKEN_GROUP,
        description=description,
        kinds={"yaml"},
        metadata={"file": dg.MetadataValue.path(file), "problems": len(error.problems)},
    )
    def marker() -> None:
        raise dg.Failure(description=f"{rendered}\nfix {file} and reload the code location")

    return marker


def _by_file(problems: Sequence[Problem]) -> dict[str, list[Problem]]:
    grouped: dict[str, list[Problem]] = {}
    for problem in problems:
        grouped.setdefault(problem.file, []).append(problem)
    return grouped


def _marker_name(file: str, taken: set[str]) -> str:
    """An asset-key part for ``file`` (``bad.yaml`` -> ``bad_yaml``) that no other marker uses."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", Path(file).name)
    name, count = base, 1
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    return name


def definitions_for_file(
    path: Path, *, outputs_dir: Path | None = None, project_dir: Path | None = None
) -> dg.Definitions:
    return definitions_for([load_pipeline(path)], outputs_dir=outputs_dir, project_dir=project_dir)
