"""The Dagster resource of one pipeline: its spec, its sims, its output directory.

Keyed ``sim_<pipeline>`` (resource keys must be unique across a code location, so two pipelines
cannot share ``sim``). Set-up loads the spec and prepares a lazy :class:`~hud_pipelines.simpool.SimPool`:
no sim starts until an asset asks for one, because ``dagster job execute`` / ``dg launch``
initialise a job's resources once more after the run and an eager spawn would start a sim for
nothing. Tear-down closes every sim the run started (their process groups are killed); it runs on
success, failure and cancellation. Should set-up itself fail, it has started nothing, so there is
nothing for the missing tear-down to leak.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field, PrivateAttr

from hud_pipelines.eval import sim_settings
from hud_pipelines.outputs import EvalOutputs
from hud_pipelines.simpool import SimPool
from hud_pipelines.spec.loader import load_pipeline
from hud_pipelines.spec.models import PipelineSpec


def resource_key(pipeline: str) -> str:
    return f"sim_{pipeline}"


class PipelineResource(dg.ConfigurableResource):  # type: ignore[misc]
    """A pipeline's spec and the sims it runs on."""

    pipeline_file: str = Field(description="the pipeline YAML")
    outputs_dir: str = Field(description="root of results, traces, shards, grades and reports")
    project_dir: str = Field(description="directory the sim children start in (imports resolve from it)")

    _spec: PipelineSpec | None = PrivateAttr(default=None)
    _pool: SimPool | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._spec = load_pipeline(self.pipeline_file)
        self._pool = SimPool(sim_settings(self._spec, cwd=Path(self.project_dir)))

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._pool is not None:
            self._pool.close()

    @property
    def spec(self) -> PipelineSpec:
        if self._spec is None:
            self._spec = load_pipeline(self.pipeline_file)
        return self._spec

    @property
    def pool(self) -> SimPool:
        if self._pool is None:
            raise RuntimeError("the pipeline resource is used outside of a run (no set-up happened)")
        return self._pool

    @property
    def outputs(self) -> EvalOutputs:
        return EvalOutputs(Path(self.outputs_dir), self.spec.name)
