"""Sweeps: every checkpoint of a training run, evaluated on exactly the same episodes.

A sweep pipeline names ``agent.policy.checkpoints`` instead of one policy. Each checkpoint is a
*member*: the pipeline with that checkpoint's weights and the same sim, tasks, instances, slots and
seeds, so any two checkpoints compare on paired episodes. A member is an eval of its own on disk
(``<name>/checkpoints/<label>/``: results per instance, traces, shards, grades, report), which is what
makes a sweep resumable: a (checkpoint, instance) pair with a current result is not run again, and a
checkpoint that appears later is evaluated alone.

A member's results are current while the sweep's rollout hash and the checkpoint's *content* are
unchanged (:func:`~hud_pipelines.spec.models.checkpoint_rollout_hash`): a moved run directory keeps its
results, retrained weights under the same label do not. The content hash is kept in the member's
``checkpoint.json`` with the size and modification time of every file, so a sweep hashes each
checkpoint once, not on every run.

Checks of a sweep judge its *candidate*, the latest checkpoint evaluated; a ``no_regression``
baseline may name another checkpoint of the sweep by its label.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hud_pipelines.agent.checkpoints import (
    DEFAULT_SETTLE_S,
    Checkpoint,
    CheckpointSource,
    Discovery,
    discover_checkpoints,
    label_named,
    run_names,
    several_named,
    sources_of,
    sweep_order,
)
from hud_pipelines.errors import CheckpointError, Fault
from hud_pipelines.eval.checks import (
    RERUN_HINT,
    CheckVerdict,
    answered_verdict,
    check_verdict,
    instances_verdict,
    regression_verdict,
)
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.spec.agent import CheckpointEntry, LeRobotPolicyConfig, TorchPolicyConfig
from hud_pipelines.spec.grading import CheckSpec, NoRegressionCheck
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import did_you_mean

PARTITION_SEPARATOR = "|"
"""Between the checkpoint and the instance in a sweep's partition keys (Dagster's multi-partition keys)."""
_HASHED: dict[str, str] = {}
"""A checkpoint's path and file signature -> its content hash, for the checkpoints changed since they ran."""


@dataclass(frozen=True)
class Member:
    """One checkpoint of a sweep as an eval: its label and weights, its spec and where its files go."""

    label: str
    step: int | None
    run: str | None
    path: Path
    content_hash: str
    spec: PipelineSpec
    outputs: EvalOutputs
    changed: bool = False
    """Its files are not those its results were recorded with (other weights saved under the same label):
    its spec is of the weights there now, so those results are stale until it runs again."""
    signature: list[list[Any]] | None = None
    """Its files' signature as read before ``content_hash`` was (files written since must not take that hash)."""

    def described(self, sweep: str, description: str) -> str:
        """Its own report's description: which weights it evaluated, and where they are, then the sweep's."""
        step = f" (step {self.step})" if self.step is not None else ""
        weights = f"Checkpoint {self.label}{step} of the sweep {sweep}: weights at {self.path}."
        return f"{weights} {description}" if description else weights

    def partition_key(self, instance_key: str) -> str:
        """The Dagster partition of one of this checkpoint's instances: ``<label>|<task>-i<instance>``."""
        return f"{self.label}{PARTITION_SEPARATOR}{instance_key}"


def sources(spec: PipelineSpec) -> list[CheckpointSource]:
    """The sweep's checkpoint sources, paths resolved against the pipeline file."""
    policy = spec.agent.policy
    if not isinstance(policy, LeRobotPolicyConfig | TorchPolicyConfig) or policy.checkpoints is None:
        raise ValueError(f"pipeline {spec.name!r} is not a sweep (its policy names no checkpoints)")
    kind = "torch" if isinstance(policy, TorchPolicyConfig) else "lerobot"
    return sources_of(policy.checkpoints, kind, spec.resolve_path)


def discover(spec: PipelineSpec, *, settle_s: float = DEFAULT_SETTLE_S) -> Discovery:
    """The sweep's complete and pending checkpoints now (steps given by hand applied)."""
    found = discover_checkpoints(sources(spec), settle_s=settle_s)
    policy = spec.agent.policy
    listed = policy.checkpoints if isinstance(policy, LeRobotPolicyConfig | TorchPolicyConfig) else None
    entries = listed if isinstance(listed, list) else []
    steps = {e.label: e.step for e in entries if isinstance(e, CheckpointEntry)}
    if not any(step is not None for step in steps.values()):
        return found

    def stepped(checkpoint: Checkpoint) -> Checkpoint:
        step = steps.get(checkpoint.label)
        return checkpoint if step is None else dataclasses.replace(checkpoint, step=step)

    return Discovery(
        tuple(stepped(c) for c in found.complete),
        tuple(dataclasses.replace(p, checkpoint=stepped(p.checkpoint)) for p in found.pending),
    )


def member(spec: PipelineSpec, outputs: EvalOutputs, checkpoint: Checkpoint) -> Member:
    """The member for ``checkpoint`` (its content hashed unless ``checkpoint.json`` already knows it)."""
    member_outputs = outputs.member(checkpoint.label)
    signature = _signature(checkpoint.path)
    recorded = _read_record(member_outputs)
    if recorded is not None and recorded.get("signature") == signature and recorded.get("content_hash"):
        content_hash = str(recorded["content_hash"])
    else:
        content_hash = checkpoint.content_hash()
    return Member(
        label=checkpoint.label,
        step=checkpoint.step,
        run=checkpoint.run,
        path=checkpoint.path,
        content_hash=content_hash,
        spec=spec.for_checkpoint(checkpoint.path, content_hash),
        outputs=member_outputs,
        signature=signature,
    )


def members(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    *,
    settle_s: float = DEFAULT_SETTLE_S,
    labels: Sequence[str] | None = None,
) -> list[Member]:
    """A member for every complete checkpoint found now (of ``labels`` only, when given), in sweep order."""
    found = discover(spec, settle_s=settle_s).complete
    return [member(spec, outputs, c) for c in found if labels is None or c.label in labels]


def select(found: Sequence[Member], labels: Sequence[str] | None) -> list[Member]:
    """The members ``labels`` name (all when None); an unknown label is an error listing the known ones."""
    if labels is None:
        return list(found)
    known = {m.label: m for m in found}
    labels = [label_named(label, list(known)) for label in labels]
    unknown = [label for label in labels if label not in known]
    if unknown:
        listed = ", ".join(known) or "none complete yet"
        hint = several_named(unknown[0], list(known)) or did_you_mean(unknown[0], list(known))
        raise CheckpointError(f"no checkpoint labelled {', '.join(map(repr, unknown))}{hint}; known: {listed}")
    return [m for m in found if m.label in labels]


def record(member: Member) -> None:
    """Write the member's ``checkpoint.json`` (what it evaluated), before its first result lands, with the signature
    its hash was taken at: weights written since then are hashed anew at the next look."""
    member.outputs.base.mkdir(parents=True, exist_ok=True)
    signature = _signature(member.path) if member.signature is None else member.signature
    data = {"label": member.label, "step": member.step, "run": member.run, "path": str(member.path)}
    data |= {"content_hash": member.content_hash, "signature": signature}
    write_atomically(member.outputs.checkpoint_json, json.dumps(data, indent=1))


def not_evaluated(spec: PipelineSpec, outputs: EvalOutputs) -> list[str]:
    """The checkpoints found now that have no results yet, each with why: a report says what it lacks.

    Incomplete ones say what they miss (or that they are still being written); complete ones were
    saved after the last run (the next run or the sensor evaluates them). Nothing when the sweep's
    sources cannot be read now: the table of what was evaluated stands on its own.
    """
    try:
        found = discover(spec)
    except CheckpointError:
        return []
    done = {m.label for m in evaluated(spec, outputs)}
    waiting = [f"{p.checkpoint.label}: {p.reason}" for p in found.pending if p.checkpoint.label not in done]
    return [*waiting, *(f"{c.label}: complete, not run yet" for c in found.complete if c.label not in done)]


def evaluated(
    spec: PipelineSpec,
    outputs: EvalOutputs,
    *,
    settled: Collection[str] | None = None,
    found: Sequence[Checkpoint] | None = None,
) -> list[Member]:
    """The members with results on disk, in sweep order (runs as the YAML lists them, then step, then label),
    whether or not their folder remains.

    A label the sources hold now (``found``, discovered now by default) is read at the path and step the YAML
    gives it (a run moved, a step corrected, an entry pointed at other weights), not where it was recorded. A
    member whose folder holds other files than it recorded (new weights under the same label) is ``changed``,
    with the new content's hash, so its earlier results show as stale (the report, ``compare``) and the next run
    or the sensor evaluates it again. ``settled``: the only labels whose changed files are hashed (the complete
    ones, for the sensor: one still being written would be hashed again at every look).
    """
    now_found = {c.label: c for c in (_found_now(spec) if found is None else found)}
    members: list[Member] = []
    for path in sorted(outputs.checkpoints.glob("**/checkpoint.json")):
        data = json.loads(path.read_text())
        label = str(data["label"])
        recorded = Checkpoint(label, Path(str(data["path"])), data.get("step"), data.get("run"))
        checkpoint = now_found.get(label, recorded)
        content_hash = str(data["content_hash"])
        now = _content_now(checkpoint, data, path) if settled is None or label in settled else None
        members.append(
            Member(
                label=label,
                step=checkpoint.step,
                run=checkpoint.run,
                path=checkpoint.path,
                content_hash=now or content_hash,
                spec=spec.for_checkpoint(checkpoint.path, now or content_hash),
                outputs=outputs.member(label),
                changed=now is not None and now != content_hash,
            )
        )
    return sorted(members, key=sweep_order(run_names(sources(spec))))


def _found_now(spec: PipelineSpec) -> tuple[Checkpoint, ...]:
    """The complete checkpoints of the sweep's sources now; none when they cannot be read (the records stand)."""
    try:
        return discover(spec).complete
    except (CheckpointError, OSError):  # a folder it may not read, a mount gone
        return ()


def rerun_key(member: Member) -> str:
    """A key for evaluating a changed member again, one per write of its files: ``<label>@<content>.<files>``.

    The content alone would not do: weights A, then B, then A and B again (two training runs taking turns in
    one directory) would repeat a key, and a scheduler that runs each key once (Dagster's run keys) would
    leave the last version unevaluated. The files' names, sizes and times change with every write, and
    not while nothing writes, so one version of the files gets one key however often it is looked at.
    """
    files = hashlib.sha256(json.dumps(_signature(member.path)).encode()).hexdigest()
    return f"{member.label}@{member.content_hash[:16]}.{files[:8]}"


def _content_now(checkpoint: Checkpoint, recorded: dict[str, Any], record: Path) -> str | None:
    """The content hash of a recorded checkpoint's files as they are now, where they differ from the recorded
    ones by name, size or time (``None``: unchanged, gone, or unreadable now; the recorded hash stands).

    Files only touched (copied without their times) hash as before: ``record`` (the checkpoint's
    ``checkpoint.json``) then takes their new signature, so no later process hashes them again.
    """
    try:
        signature = _signature(checkpoint.path)
    except OSError:  # a file pruned while we looked: as recorded, until the next look
        return None
    if not signature or signature == recorded.get("signature"):
        return None
    key = f"{checkpoint.path}\0{json.dumps(signature)}"
    if key not in _HASHED:  # once per version of the files in a process: a report reads the members often
        try:
            _HASHED[key] = checkpoint.content_hash()
        except (CheckpointError, OSError):
            return None
    if _HASHED[key] == recorded.get("content_hash"):  # the same weights (moved, or touched): where they are now
        moved = {"path": str(checkpoint.path), "signature": signature}
        write_atomically(record, json.dumps({**recorded, **moved}, indent=1))
    return _HASHED[key]


def split_partition_key(key: str) -> tuple[str, str]:
    """``<label>|<instance key>`` -> (label, instance key); a ``KeyError`` for a key without a checkpoint."""
    label, separator, instance = key.rpartition(PARTITION_SEPARATOR)
    if not separator or not label:
        raise KeyError(f"{key!r} is not a sweep partition (expected <checkpoint>{PARTITION_SEPARATOR}<instance>)")
    return label, instance


# -- checks ------------------------------------------------------------------------------------------


def candidate_label(rows: Sequence[GradeRow]) -> str | None:
    """The checkpoint a sweep's checks judge: the last one of the table (rows come in sweep order)."""
    labels = [row.checkpoint for row in rows if row.checkpoint is not None]
    return labels[-1] if labels else None


def completed(rows: Sequence[GradeRow], command: Sequence[str]) -> CheckVerdict:
    """``instances_completed`` on every checkpoint; one that cannot load (``setup``, where others of the sweep
    did: the fault is its own, not a grader's or the pipeline's) fails it on every run until it loads, so the
    description says how to leave such a checkpoint out: its results leave the table with its files
    (:func:`evaluated`)."""
    judged = instances_verdict(rows, command)
    labels = list(dict.fromkeys(row.checkpoint for row in rows if row.checkpoint))
    setup = {row.checkpoint for row in rows if row.fault is Fault.SETUP}
    unloadable = [label for label in labels if label in setup]
    if judged.passed or not unloadable or len(unloadable) == len(labels):  # none loaded: the pipeline's fault
        return judged
    named = ", ".join(unloadable)
    hint = (
        f"; checkpoint(s) {named} could not be loaded where others were, and fail this check on every run until they "
        "load: to leave one out, remove its files from the training run or its `checkpoints:` entry (its errored "
        "results leave the table with it)"
    )
    said, command_line = judged.description.rsplit(RERUN_HINT, 1)  # the CLI puts its own command after the hint
    return dataclasses.replace(judged, description=f"{said}{hint}{RERUN_HINT}{command_line}")


def answered(rows: Sequence[GradeRow]) -> CheckVerdict:
    """``episodes_answered`` on the candidate: a latest checkpoint whose every episode errored has no result."""
    candidate = candidate_label(rows)
    judged = answered_verdict([row for row in rows if row.checkpoint == candidate])
    if candidate is None:
        return dataclasses.replace(judged, description="no checkpoint of the sweep has been evaluated yet")
    return dataclasses.replace(judged, description=f"{candidate}: {judged.description}")


def verdict(
    spec: PipelineSpec, check: CheckSpec, rows: Sequence[GradeRow], score_bounds: tuple[float, float] | None = None
) -> CheckVerdict:
    """One YAML check on the candidate's rows; a ``no_regression`` baseline naming a label is that checkpoint."""
    candidate = candidate_label(rows)
    mine = [row for row in rows if row.checkpoint == candidate]
    if isinstance(check, NoRegressionCheck):
        label = _baseline_label(spec, check, rows)
        if label is not None:
            return _against_label(check, mine, [row for row in rows if row.checkpoint == label], candidate, label)
        if not Path(check.baseline).exists():  # neither a checkpoint nor a file: most likely a mistyped label
            return CheckVerdict(check.name, False, check.blocking, _no_baseline(spec, check, rows))
    judged = check_verdict(check, mine, score_bounds)
    return dataclasses.replace(judged, description=f"{candidate}: {judged.description}")


def baseline_label(spec: PipelineSpec, labels: set[str]) -> str | None:
    """The checkpoint a ``no_regression`` check names as its baseline (the comparison's baseline column)."""
    for check in spec.checks:
        if isinstance(check, NoRegressionCheck) and check.baseline in labels:
            return check.baseline
    return None


def _baseline_label(spec: PipelineSpec, check: NoRegressionCheck, rows: Sequence[GradeRow]) -> str | None:
    raw = _written_baseline(spec, check)
    return raw if raw in {row.checkpoint for row in rows} else None


def _written_baseline(spec: PipelineSpec, check: NoRegressionCheck) -> str:
    """The baseline as the YAML wrote it (a resolved check's is a path relative to the YAML file)."""
    written = {c.name: c for c in spec.checks}.get(check.name)
    return written.baseline if isinstance(written, NoRegressionCheck) else check.baseline


def _no_baseline(spec: PipelineSpec, check: NoRegressionCheck, rows: Sequence[GradeRow]) -> str:
    raw = _written_baseline(spec, check)
    labels = list(dict.fromkeys(row.checkpoint for row in rows if row.checkpoint is not None))
    return (
        f"no_regression: the baseline {raw!r} is no checkpoint of this sweep{did_you_mean(raw, labels)} (evaluated: "
        f"{', '.join(labels) or 'none yet'}) and no grades file ({check.baseline} does not exist)"
    )


def _against_label(
    check: NoRegressionCheck, mine: list[GradeRow], theirs: list[GradeRow], candidate: str | None, label: str
) -> CheckVerdict:

    if candidate == label:
        return CheckVerdict(
            check.name, True, check.blocking, f"no_regression: {label} is the baseline and the latest checkpoint"
        )
    judged = regression_verdict(check, mine, theirs, baseline_name=f"checkpoint {label}")
    return dataclasses.replace(judged, description=f"{candidate}: {judged.description}")


# -- internals ---------------------------------------------------------------------------------------


def _read_record(outputs: EvalOutputs) -> dict[str, Any] | None:
    path = outputs.checkpoint_json
    return dict(json.loads(path.read_text())) if path.is_file() else None


def _signature(path: Path) -> list[list[Any]]:
    """Name, size and modification time of every file of a checkpoint: unchanged means the same content."""
    if path.is_file():
        stat = path.stat()
        return [[path.name, stat.st_size, stat.st_mtime_ns]]
    if not path.is_dir():
        return []
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
