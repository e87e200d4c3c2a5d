"""Pipeline files: YAML -> typed, frozen models, with every problem located at its file and line.

``load_pipeline`` / ``load_pipelines`` give :class:`PipelineSpec` models or raise one
:class:`SpecError` listing every problem; the models carry the helpers a runner needs (partitions,
seeds, per-slot task dicts, resolved paths, a content hash).
"""

from hud_pipelines.spec.grading import (
    CallableGrader,
    CheckSpec,
    GraderSpec,
    MaxErrorRateCheck,
    MinMeanScoreCheck,
    MinSuccessRateCheck,
    ReturnGrader,
    SuccessGrader,
)
from hud_pipelines.spec.loader import collect_pipelines, load_pipeline, load_pipeline_text, load_pipelines
from hud_pipelines.spec.models import Partition, PipelineSpec
from hud_pipelines.spec.problems import Problem, SpecError
from hud_pipelines.spec.sections import DatasetSpec, TaskSpec
from hud_pipelines.spec.sim_section import SimSpec

__all__ = [
    "CallableGrader",
    "CheckSpec",
    "DatasetSpec",
    "GraderSpec",
    "MaxErrorRateCheck",
    "MinMeanScoreCheck",
    "MinSuccessRateCheck",
    "Partition",
    "PipelineSpec",
    "Problem",
    "ReturnGrader",
    "SimSpec",
    "SpecError",
    "SuccessGrader",
    "TaskSpec",
    "collect_pipelines",
    "load_pipeline",
    "load_pipeline_text",
    "load_pipelines",
]
