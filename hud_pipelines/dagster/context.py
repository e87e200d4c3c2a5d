"""What a step of a pipeline's job reads from its run: the four resources, and the spec they configure."""

from __future__ import annotations

from typing import Any, Protocol

from hud_pipelines.dagster.resources import (
    AGENT,
    CONTRACT,
    GRADERS,
    SIM,
    AgentResource,
    ContractResource,
    GradersResource,
    SimResource,
    effective_spec,
    resource_key,
)
from hud_pipelines.eval.configuration import CurrentBy, judged_in_run
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.models import PipelineSpec


class StepContext(Protocol):
    """An asset's, an asset check's or an op's execution context: what holds the run's resources."""

    @property
    def resources(self) -> Any: ...


def sim_of(context: StepContext, spec: PipelineSpec) -> SimResource:
    return getattr(context.resources, resource_key(spec.name, SIM))


def graders_of(context: StepContext, spec: PipelineSpec) -> GradersResource:
    return getattr(context.resources, resource_key(spec.name, GRADERS))


def effective_of(context: StepContext, spec: PipelineSpec) -> PipelineSpec:
    """The spec as this run's four resources configure it (run-config overrides applied and validated)."""
    contract: ContractResource = getattr(context.resources, resource_key(spec.name, CONTRACT))
    agent: AgentResource = getattr(context.resources, resource_key(spec.name, AGENT))
    return effective_spec(spec, sim_of(context, spec), contract, agent, graders_of(context, spec))


def judged_of(context: StepContext, spec: PipelineSpec) -> PipelineSpec:
    """The spec with this run's graders and checks (what the grades-side steps need)."""
    graders = graders_of(context, spec)
    return spec.with_sections(graders=graders.graders, checks=graders.checks)


def judging_of(
    context: StepContext, spec: PipelineSpec, outputs: EvalOutputs, run_id: str, parent: str | None
) -> tuple[PipelineSpec, CurrentBy]:
    """The spec with this run's graders and checks, and what a result must match to count in run ``run_id``, which
    re-executes run ``parent`` if any (:func:`~hud_pipelines.eval.configuration.judged_in_run`)."""
    judged = judged_of(context, spec)
    return judged, judged_in_run(judged, outputs, run_id, parent)
