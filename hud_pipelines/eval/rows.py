"""Which rows a grade table holds: the latest current result of every partition, errored rows for the rest.

"Current" means the same configuration (rollout hash) and the same environment (provenance
fingerprint) as the latest run; anything else gives ``not_run`` rows that say why and how to run it,
so a table never mixes results that were produced differently. A sweep's table is every evaluated
checkpoint's, labelled, in sweep order.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from typing import Any

from hud_pipelines.errors import Fault
from hud_pipelines.eval import provenance, sweep
from hud_pipelines.eval.configuration import LATEST, CurrentBy, RolloutHashes, recorded_overrides
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult, unreached_rows
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.models import Partition, PipelineSpec


def collect_rows(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    *,
    current: CurrentBy = LATEST,
    rerun: Callable[[str], str] | None = None,
) -> list[GradeRow]:
    """One row per scheduled slot, from the latest result of every partition.

    Every row carries the run that produced it. A partition that never ran, or ran under another
    configuration (its rollout hash is none of ``current``'s, by default the latest run's), gives
    errored ``not_run`` rows saying so and how to run it: results of different configurations are
    never mixed in one table. Nor are results of another environment (by default the latest run's
    provenance: package versions, the sim's interpreter, the renderer). ``rerun`` says how
    to run an instance again, from its key (by default ``hud-pipelines run <name> --partition <key>``).
    """
    if spec.is_sweep:
        return _sweep_rows(spec, outputs, current)
    expected, environment = current.resolve(spec, outputs)
    scheduled = slots_as_run(spec, outputs, current.run_id) if current.hashes is None else spec  # as the graded run ran
    rows: list[GradeRow] = []
    for partition in spec.partitions():
        result, stale = _latest(spec, outputs, partition, expected, environment, rerun)
        if stale is None:
            assert result is not None
            rows.extend(result.rows)
        else:
            run_id = "" if result is None else result.run_id
            rows.extend(unreached_rows(scheduled, partition, stale, Fault.NOT_RUN, run_id=run_id))
    return rows


def slots_as_run(spec: PipelineSpec, outputs: EvalOutputs, run_id: str | None = None) -> PipelineSpec:
    """``spec`` with the slots per instance of the latest run, which may set ``sim.num_envs`` in its run
    configuration: an instance it did not run is still scheduled as that configuration runs it (its slots
    and seeds), not as the YAML does."""
    num_envs = recorded_overrides(outputs, run_id).get("sim.num_envs")
    if not isinstance(num_envs, int) or num_envs == spec.sim.num_envs:
        return spec
    return spec.with_sections(sim=spec.sim.model_copy(update={"num_envs": num_envs}))


def current_results(spec: PipelineSpec, outputs: EvalOutputs, current: CurrentBy = LATEST) -> dict[str, InstanceResult]:
    """Partition key -> its latest result, for the partitions whose latest result is current (as
    :func:`collect_rows` decides, with the same defaults): the shards a dataset may publish."""
    expected, environment = current.resolve(spec, outputs)
    found: dict[str, InstanceResult] = {}
    for partition in spec.partitions():
        result, stale = _latest(spec, outputs, partition, expected, environment)
        if stale is None and result is not None:
            found[spec.partition_key(*partition)] = result
    return found


def _latest(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    partition: Partition,
    expected: RolloutHashes,
    current: dict[str, Any],
    how: Callable[[str], str] | None = None,
) -> tuple[InstanceResult | None, str | None]:
    """A partition's latest result, and why it is not current (``None`` when it is).

    For a checkpoint of a sweep (``spec.checkpoint_hash`` set) ``current`` is the sweep's provenance, whose policy
    is the list of checkpoints and which has no weights: a reason holds the checkpoint's recorded policy and weights
    against its own (:func:`~hud_pipelines.eval.provenance.configuration`), or every stale checkpoint would say
    its policy and weights changed, whatever did.
    """
    if spec.checkpoint_hash is not None and current:
        own = provenance.configuration(spec)
        current = current | {name: own[name] for name in ("policy", "checkpoint_hash")}
    key = spec.partition_key(*partition)
    path = outputs.result(key)
    result = InstanceResult.read(path) if path.exists() else None

    def rerun() -> str:  # only for a row that is not current: the command resolves paths
        return (
            how(key) if how is not None else f"run it with: {shlex.join(outputs.run_command(spec))} --partition {key}"
        )

    if result is None:
        return None, f"instance {key} has not run yet; {rerun()}"
    task = spec.tasks[partition.task_index].name
    if not expected.current(task, result.rollout_hash):
        ran = result.provenance  # named where both runs recorded it (older results lack max_steps and graders)
        changed = [n for n in CONFIGURATION if n in ran and n in current and _of(task, n, ran) != _of(task, n, current)]
        what = ", ".join(changed) if changed else "sim, agent, tasks, max_steps or graders"
        run = result.run_id or "unknown"
        return result, f"instance {key} last ran (run {run}) before the pipeline's {what} changed; {rerun()}"
    if provenance.other_environment(result.provenance, current):
        return result, (
            f"instance {key} last ran (run {result.run_id or 'unknown'}) in another environment "
            f"({provenance.difference(result.provenance, current)}); {rerun()}"
        )
    return result, None


def _of(task: str, name: str, record: dict[str, Any]) -> object:
    """A configuration field as it bears on ``task``: of a per-task one (its seed, its args), only the task's."""
    value: Any = record[name]
    if name not in PER_TASK:
        return value
    mine: object = value.get(task) if value else None  # a task without args is absent from task_args
    return mine


PER_TASK = ("task_args", "seeds")
"""Configuration fields that hold every task's: another task added or edited changes none of a task's."""

CONFIGURATION = (
    "sim_factory",
    "sim_args",
    "task_args",
    "num_envs",
    "seeds",
    "group",
    "max_steps",
    "graders",
    "policy",
    "checkpoint_hash",
)
"""The provenance fields that are configuration: where one differs, a stale result's reason names it."""


def sweep_members(
    spec: PipelineSpec, outputs: EvalOutputs, current: CurrentBy = LATEST
) -> list[tuple[sweep.Member, CurrentBy]]:
    """A sweep's evaluated checkpoints, each with what its results must match to be current: the sweep's
    configuration with the checkpoint's weights, in the sweep's environment."""
    resolved = CurrentBy(*current.resolve(spec, outputs))
    return [(m, resolved.of_checkpoint(spec, outputs, m.content_hash)) for m in sweep.evaluated(spec, outputs)]


def _sweep_rows(spec: PipelineSpec, outputs: EvalOutputs, current: CurrentBy) -> list[GradeRow]:
    """Every evaluated checkpoint's rows in sweep order, labelled, each instance keyed ``<label>|<instance>``.

    A checkpoint whose files are gone keeps its answered episodes (they record what those weights did), and
    its stale ones say so (restoring its files runs it again); one that never loaded (a corrupt file, since
    deleted: no result of it on disk, current or stale, holds an answer) is left out, or it would stay the
    candidate whose errors fail every later run.
    """
    rows: list[GradeRow] = []
    for member, expected in sweep_members(spec, outputs, current):
        found = collect_rows(member.spec, member.outputs, current=expected, rerun=_rerun_of(member))
        if not member.path.exists() and not _answered_once(member):
            continue
        rows += [
            dataclasses.replace(row, checkpoint=member.label, group_id=member.partition_key(row.group_id))
            for row in found
        ]
    return rows


def _answered_once(member: sweep.Member) -> bool:
    """Whether a result of the checkpoint on disk, current or stale, holds an answered episode (it loaded once)."""
    for partition in member.spec.partitions():
        path = member.outputs.result(member.spec.partition_key(*partition))
        result = InstanceResult.read(path) if path.exists() else None
        if result is not None and any(row.status is not EpisodeStatus.ERRORED for row in result.rows):
            return True
    return False


def _rerun_of(member: sweep.Member) -> Callable[[str], str]:
    """How to run one instance of a sweep's checkpoint again, or why it cannot be (its files are gone)."""
    if not member.path.exists():
        return lambda key: f"checkpoint {member.label}'s files at {member.path} are gone: restore them to run it again"
    changed = f"checkpoint {member.label}'s files changed since it ran (other weights under its label); "
    changed = changed if member.changed else ""
    command = shlex.join(member.outputs.run_command(member.spec))
    return lambda key: f"{changed}run it with: {command} --checkpoint {member.label} --partition {key}"
