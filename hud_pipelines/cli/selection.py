"""What a run is asked to run, settled before anything runs: the pipeline file, the instances and the queue.

Each refusal here costs nothing (no sim started, no checkpoint evaluated); the same names found
late would fail a run after it spent its time.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hud_pipelines.errors import DeploymentError, HudPipelinesError
from hud_pipelines.spec.problems import Problem, did_you_mean

if TYPE_CHECKING:
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.spec.models import PipelineSpec


def resolve_pipeline_file(pipeline: str, pipelines_dir: Path | None) -> Path:
    """A path as given, else ``<pipelines_dir>/<name>.yaml`` (or the file whose ``name`` matches)."""
    candidate = Path(pipeline)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():  # a folder of the name is no pipeline: a name
        if not candidate.is_file():
            raise HudPipelinesError(f"pipeline file {candidate} does not exist")
        return candidate.resolve()
    from hud_pipelines.dagster.definitions import default_pipelines_dir
    from hud_pipelines.spec.loader import load_file, pipeline_files

    directory = (pipelines_dir or default_pipelines_dir()).resolve()
    # by file name or by `name`: a broken file beside it must not stop the others from being found,
    # and a name two files declare is refused (the Dagster code location keeps only the first)
    loaded = [load_file(file) for file in pipeline_files(directory)] if directory.is_dir() else []
    specs = [file.spec for file in loaded if file.spec is not None and not file.problems]
    named = sorted(spec.source for spec in specs if spec.name == pipeline and spec.source is not None)
    if len(named) > 1:
        files = ", ".join(str(path.relative_to(directory)) for path in named)
        raise HudPipelinesError(f"pipeline name {pipeline!r} is declared by {len(named)} files ({files}); rename one")
    for suffix in (".yaml", ".yml"):
        if (directory / f"{pipeline}{suffix}").is_file():
            return directory / f"{pipeline}{suffix}"
    if named:
        return named[0]
    names = sorted(s.name for s in specs)
    broken = sorted(  # a file that does not load is a pipeline too: the one asked for may be it
        f"{Path(file.file).stem} (does not load: {_first_problem(file.problems)})"
        for file in loaded
        if file.spec is None or file.problems
    )
    known = ", ".join([*names, *broken]) or "none"
    hint = did_you_mean(pipeline, [*names, *(Path(file.file).stem for file in loaded if file.spec is None)])
    raise HudPipelinesError(f"no pipeline named {pipeline!r} in {directory}{hint} (known: {known})")


def _first_problem(problems: list[Problem]) -> str:
    first = problems[0] if problems else None
    if first is None:
        return "invalid"
    return f"{first.path}: {first.message}" if first.path else first.message


def refuse_misconfigured(path: Path, spec: PipelineSpec, outputs: EvalOutputs) -> None:
    """Refuse a pipeline the deployment file names one typo away or whose fields break the pipeline's rules,
    a sweep baseline one typo from a label, a baseline that is the pipeline's own results, and outputs that cannot
    be written.

    A sweep with a misspelled ``no_regression`` baseline would evaluate every checkpoint and then fail
    its check, and a deployment's ``forward_timeout_s: -1`` would fail the run's first step without a line
    of the file; ``validate`` reports the same lines. A baseline with results in ``outputs`` is no typo, though
    its files are gone since.
    """
    from hud_pipelines.dagster.deployed import deployed_spec, deployment_misfit
    from hud_pipelines.dagster.deployment import load_deployment, refuse_misspelled
    from hud_pipelines.spec.deep import misspelled_baselines
    from hud_pipelines.spec.loader import declared_name, located, pipeline_files

    deployment = load_deployment()
    refuse_misspelled(deployment, spec.name, [declared_name(file) for file in pipeline_files(path.parent)])
    misfit = deployment_misfit(spec, deployment)
    if misfit is not None:
        raise DeploymentError(misfit)
    deployed = deployed_spec(spec, Path.cwd())  # its {env: NAME} fields read now: an unset one is refused here
    if deployed.sim.fleet is not None:  # so is the fleet file's unset ${VAR} token, not in the run's first step
        from hud_pipelines.spec.fleet import load_fleet

        load_fleet(deployed.resolve_path(deployed.sim.fleet))
    misspelled = misspelled_baselines(spec, evaluated=evaluated_labels(spec, outputs))
    for index, message in [*misspelled, *own_baselines(spec, outputs)]:
        where = located(spec, ("checks", index, "baseline")) or f"{path}: checks[{index}].baseline"  # its line
        raise HudPipelinesError(f"{where}: {message}")
    unwritable = _unwritable(outputs.base)  # a file where the folder goes: said before any sim starts
    if unwritable is not None:
        raise HudPipelinesError(
            f"cannot write the outputs at {outputs.base}: {unwritable} (pick another --outputs or "
            "$HUD_PIPELINES_OUTPUTS)"
        )


def own_baselines(spec: PipelineSpec, outputs: EvalOutputs) -> list[tuple[int, str]]:
    """``(index in checks, message)`` of each ``no_regression`` whose baseline is the pipeline's own results."""
    from hud_pipelines.eval.judging import own_baseline
    from hud_pipelines.spec.grading import NoRegressionCheck

    checks = enumerate(spec.resolved_checks())
    found = [(index, own_baseline(c, outputs)) for index, c in checks if isinstance(c, NoRegressionCheck)]
    return [(index, message) for index, message in found if message is not None]


def _unwritable(path: Path) -> str | None:
    """Why no folder can be made at ``path`` (its closest existing ancestor is a file, or read-only), or
    ``None``; nothing is left behind, so a run refused later leaves no trace. A folder is made there and removed
    again: permissions alone pass where root may write but the file system makes no folders (``/proc``)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=existing))
    except OSError as exc:
        return f"no folder can be made in {existing} ({exc.strerror or exc})"
    return None


def evaluated_labels(spec: PipelineSpec, outputs: EvalOutputs) -> list[str]:
    """The labels of a sweep's checkpoints with results in ``outputs``, whether or not their files remain (none
    for a single policy); nothing is hashed."""
    from hud_pipelines.eval import sweep

    return [member.label for member in sweep.evaluated(spec, outputs, settled=())] if spec.is_sweep else []


def select_instances(
    spec: PipelineSpec, partitions: list[str] | None, checkpoints: list[str] | None
) -> tuple[list[str], list[str] | None]:
    """The instances to run, in order, and the checkpoints asked for (``--partition``, ``--checkpoint``).

    A sweep's ``<checkpoint>|<instance>`` keys (as its checks print them) name both. The instances
    must form a contiguous range: a Dagster run covers one partition range.
    """
    keys = spec.partition_keys()
    if spec.is_sweep and partitions and any("|" in p for p in partitions):
        from hud_pipelines.eval.sweep import split_partition_key

        pairs = [split_partition_key(p) for p in partitions]
        checkpoints = list(dict.fromkeys([*(checkpoints or []), *(label for label, _ in pairs)]))
        partitions = list(dict.fromkeys(instance for _, instance in pairs))
    selected = partitions or keys
    unknown = sorted(set(selected) - set(keys))
    if unknown:
        raise HudPipelinesError(f"{spec.name} has no instance(s) {unknown}; known: {', '.join(keys)}")
    ordered = [k for k in keys if k in selected]
    first = keys.index(ordered[0])
    if ordered != keys[first : first + len(ordered)]:
        raise HudPipelinesError(f"--partition values must form a contiguous range of {', '.join(keys)}")
    return ordered, checkpoints


def queue_for(pipeline: str, queue: str) -> str:
    """``queue``, once the deployment is known to run ``pipeline``'s units on Celery (where queues exist)."""
    from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV, deployment_path
    from hud_pipelines.dagster.execution import CELERY, load_execution

    where = deployment_path()
    executor = load_execution(where).for_pipeline(pipeline).executor if where else "in_process"
    if executor != CELERY:
        raise HudPipelinesError(
            f"--queue {queue}: {pipeline} runs its units {executor} here; queues route units to Celery "
            f"workers (set execution.executor: celery in the deployment file, ${DEPLOYMENT_ENV})"
        )
    if not queue.strip():
        raise HudPipelinesError("--queue: expected a queue name (e.g. gpu)")
    return queue.strip()


def asked_command(pipeline: str, pipelines_dir: Path | None, outputs_dir: Path | None, queue: str | None) -> list[str]:
    """``hud-pipelines run`` as this run was asked for, without its partitions: what re-runs its failed instances."""
    command = ["hud-pipelines", "run", pipeline]
    for flag, value in (("--pipelines-dir", pipelines_dir), ("--outputs", outputs_dir), ("--queue", queue)):
        if value is not None:
            command += [flag, str(value)]
    return command


_WORD = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|\\.|[^\s'"\\])+"""
COMMAND = re.compile(rf"hud-pipelines run {_WORD}(?: --outputs {_WORD})?")
"""The start of a command a step's failure gives: the pipeline as one shell word, quoted where it must be
(``shlex.quote`` writes a ``'`` inside a path as ``'"'"'``, so a word is a run of quoted and plain pieces), and
the outputs it names where they are not ``./outputs``."""


def as_invoked(said: str, invocation: Sequence[str]) -> str:
    """``said`` with each ``hud-pipelines run <pipeline>`` it gives replaced by the run as it was asked for."""
    return COMMAND.sub(lambda _: shlex.join(invocation), said)
