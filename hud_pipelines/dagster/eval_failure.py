"""The grades and report of a run whose eval step failed or was cancelled, written by that step.

A failed or cancelled eval step skips the ``grades`` and ``report`` steps after it, so the files on
disk would keep saying what an earlier run measured, all green, while the instances' results already
hold what this run did (``interrupted`` episodes, or the earlier results it kept: see
:func:`~hud_pipelines.eval.kept.kept_failure`). The step writes them itself before it fails,
saying why; ``instances_completed`` then fails with that reason. ``hud-pipelines run`` writes them
once its run ends, with every failed step's line, so a run it launched is left to it.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from hud_pipelines.dagster.context import judged_of, sim_of
from hud_pipelines.dagster.overlap import LAUNCHED_RUN_TAG
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.steps import failed_run_step
from hud_pipelines.spec.models import PipelineSpec

EVAL_STEP_SUFFIX = "__eval"
"""The eval step's name after its pipeline's: one step in one process; on workers, the graph of its ``plan``,
``unit[...]`` and ``finish`` steps (step keys ``<pipeline>__eval.plan``, ...)."""


def eval_step_name(pipeline: str) -> str:
    return f"{pipeline}{EVAL_STEP_SUFFIX}"


def is_eval_step(step_key: str) -> bool:
    """Whether ``step_key`` is (a step of) a pipeline's eval step, in one process or on workers."""
    return step_key.split(".", 1)[0].endswith(EVAL_STEP_SUFFIX)


CANCELLED = "the run was cancelled before its instances ended"
STOPPED = "the eval step was stopped before it ended"

EvalContext = dg.AssetExecutionContext | dg.OpExecutionContext
"""The eval step's context: the asset of a run in one process, or the op that collects the units of workers."""


@contextmanager
def graded_if_it_fails(context: EvalContext, spec: PipelineSpec, outputs: EvalOutputs) -> Generator[None]:
    """Around an eval step's work: if it raises (a cancel, a kept earlier result, a fault of ours) or is closed
    before its end (Dagster abandons a step it interrupted), write the grades and report of what is on disk with
    the reason, then let the step fail as it would."""
    try:
        yield
    except BaseException as exc:
        if not launched_by_the_cli(context):
            _write(context, spec, outputs, _reason(exc))
        raise


def launched_by_the_cli(context: EvalContext) -> bool:
    """Whether ``hud-pipelines run`` launched this run (it writes the grades itself when the run ends). A run
    the UI re-executes from one copies that run's tags, with the run id of the run the CLI launched."""
    return context.run.tags.get(LAUNCHED_RUN_TAG) == context.run.run_id


def _write(context: EvalContext, spec: PipelineSpec, outputs: EvalOutputs, failure: str) -> None:
    try:
        project_dir = Path(sim_of(context, spec).project_dir)
        failed_run_step(
            judged_of(context, spec), outputs, run_id=context.run.run_id, project_dir=project_dir, failure=failure
        )
    except Exception as exc:  # the step's own failure is the one to report; this one is said beside it
        context.log.warning(f"{spec.name}: the grades and report of this failed run could not be written: {exc}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt | dg.DagsterExecutionInterruptedError):
        return CANCELLED
    if isinstance(exc, GeneratorExit):
        return STOPPED
    if isinstance(exc, dg.Failure):
        return exc.description or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
