"""What a sweep's report and summary warn of about its checkpoints, beside its table and checks.

Each warning names checkpoints whose place in the table is not what it seems: checkpoints after the candidate
that are not evaluated (a save under way, or one that never finished: the checks judge an older one), results
no current run produced (stale: counted errored), files gone since they were evaluated, policies of several
types compared as one training run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hud_pipelines.agent.checkpoints import run_names, sweep_order
from hud_pipelines.errors import CheckpointError, Fault
from hud_pipelines.eval.grades import GradeRow, not_run_parts
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.sweep import candidate_label, discover, evaluated, sources
from hud_pipelines.spec.models import PipelineSpec


def unevaluated_warning(spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow]) -> str | None:
    """A warning naming the checkpoints after the candidate (in training order) that are not evaluated, complete
    (not run yet: a run of other checkpoints, ``report`` before the next run) or not: the checks judge an older
    checkpoint than the run's latest. ``None`` when there is none, or when the checkpoints cannot be listed now
    (a pruned run: the table of what was evaluated stands on its own)."""
    try:
        found = discover(spec)
    except CheckpointError:
        return None
    candidate = candidate_label(rows)
    order = sweep_order(run_names(sources(spec)))
    placed = {m.label: order(m) for m in evaluated(spec, outputs, settled=())}  # its files may be gone since
    waiting = [(p.checkpoint, p.reason) for p in found.pending]
    waiting += [(c, "complete, not run yet") for c in found.complete if c.label not in placed]
    after = [(c, why) for c, why in waiting if candidate not in placed or order(c) > placed[candidate]]
    if not after:
        return None
    named = "; ".join(f"{c.label} ({why})" for c, why in sorted(after, key=lambda found: order(found[0])))
    judged = f"the checks judge {candidate}" if candidate is not None else "no checkpoint is judged"
    return (
        f"checkpoint(s) after the candidate are not evaluated, so {judged}: {named}; a complete one, or a save "
        "still under way, is evaluated by a later run, one that never finished stays so until its files are complete "
        "or removed"
    )


def stale_warning(rows: Sequence[GradeRow]) -> str | None:
    """A warning naming the checkpoints with episodes no current run produced (their files, or the pipeline,
    changed since they ran; or they never ran): the table counts them errored until a run evaluates them."""
    unrun: dict[str, list[GradeRow]] = {}
    for row in rows:
        if row.fault is Fault.NOT_RUN and row.checkpoint is not None:
            unrun.setdefault(row.checkpoint, []).append(row)
    if not unrun:
        return None
    named = "; ".join(
        f"{label}: {', '.join(not_run_parts(found, unit=' episode(s)'))}" for label, found in unrun.items()
    )
    why = next((row.error for found in unrun.values() for row in found if row.error), None)
    return (
        f"checkpoint(s) with episodes no current run produced, counted errored in the table until a run evaluates "
        f"them: {named}" + (f" (the first says: {why})" if why else "")
    )


def mixed_policy_types(spec: PipelineSpec, outputs: EvalOutputs) -> str | None:
    """A warning when the evaluated checkpoints are of several lerobot policy types (a diffusion folder copied
    into an ACT run): their table reads as one training run's progress, and it is not. ``None`` otherwise."""
    types: dict[str, list[str]] = {}
    for member in evaluated(spec, outputs):
        kind = _policy_type(member.path)
        if kind is not None:
            types.setdefault(kind, []).append(member.label)
    if len(types) < 2:
        return None
    listed = "; ".join(f"{kind} ({', '.join(labels)})" for kind, labels in types.items())
    return f"the checkpoints are of {len(types)} policy types, compared as one training run: {listed}"


def gone_warning(spec: PipelineSpec, outputs: EvalOutputs, rows: Sequence[GradeRow]) -> str | None:
    """A warning naming the checkpoints of the table (``rows``) whose files are gone (a training run restarted
    elsewhere, pruned): their results stand as evaluated, and the candidate may be one of them. ``None`` when
    none is."""
    shown = {row.checkpoint for row in rows}
    candidate = candidate_label(rows)
    gone = [m.label for m in evaluated(spec, outputs) if m.label in shown and not m.path.exists()]
    if not gone:
        return None
    judged = f"; the candidate {candidate} is one of them" if candidate in gone else ""
    return (
        f"the files of checkpoint(s) {', '.join(gone)} are gone: their results are kept as evaluated{judged} "
        f"(remove their folders under {outputs.checkpoints} to leave them out)"
    )


def _policy_type(path: Path) -> str | None:
    """A lerobot checkpoint's policy type (``act``, ``diffusion``) from its ``config.json``; ``None`` for a torch
    file, a folder that is gone or a config without one."""
    try:
        config: dict[str, object] = dict(json.loads((path / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):  # gone, not JSON, not an object
        return None
    kind = config.get("type")
    return kind if isinstance(kind, str) else None
