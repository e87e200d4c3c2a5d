"""Earlier results an attempt leaves in place: an attempt that measured nothing does not wipe what it would replace.

An instance whose sim never started, died or hung, or whose policy server or Celery worker went away, leaves an
earlier complete result of its configuration, in the same environment, where it lies (:func:`kept_result`); the
run then fails, saying which results it kept and the command that evaluates them again (:func:`kept_failure`,
:func:`sweep_kept_failure`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hud_pipelines.errors import Fault
from hud_pipelines.eval import provenance, sweep
from hud_pipelines.eval.grades import one_line
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.spec.models import PipelineSpec

NEVER_STARTED = frozenset({Fault.SIM_START, Fault.SETUP})
"""The faults of an instance that reached no episode: it had no sim, or no policy, to run on."""
KEEPS_EARLIER = NEVER_STARTED | {Fault.SIM_CRASHED, Fault.SIM_HUNG, Fault.POLICY_LINK, Fault.WORKER_LOST}
"""The faults of an attempt that leaves an earlier complete result of its configuration in place: it measured
nothing (it never started), or its sim died or hung under it, or its remote policy server or its Celery worker
went away, which the earlier run of the same configuration shows was not the configuration's doing (a served
machine lost, a flaky sim, a policy server restarted, a worker killed)."""


def kept_result(attempt: InstanceResult, outputs: EvalOutputs) -> InstanceResult | None:
    """The earlier result an ``attempt`` that never started, or whose sim died or hung, leaves in place: one of
    another run that ran to its end under the same configuration of its task, in the same environment (a served sim
    that is down, or killed mid-run, must not wipe what it served; but after an edit of the code, the contract or
    the packages the earlier result is stale anyway, and the attempt's error is what there is to say now)."""
    if attempt.fault not in KEEPS_EARLIER:
        return None
    try:
        earlier = InstanceResult.read(outputs.result(attempt.key))
    except (OSError, ValueError, KeyError):
        return None
    same = earlier.rollout_hash == attempt.rollout_hash and earlier.run_id != attempt.run_id
    if same and provenance.other_environment(earlier.provenance, attempt.provenance):
        return None
    return earlier if same and not earlier.failed else None


def kept_failure(spec: PipelineSpec, outputs: EvalOutputs, results: Sequence[InstanceResult]) -> str | None:
    """Why a run whose instances did not start or complete, but kept their earlier results, failed (``None``:
    none did), with the command that runs them again."""
    from hud_pipelines.eval.checks import rerun_command

    kept = [(attempt, earlier) for attempt in results if (earlier := kept_result(attempt, outputs)) is not None]
    if not kept:
        return None
    command = rerun_command([attempt.key for attempt, _ in kept], outputs.run_command(spec), spec.partition_keys())
    return "\n".join([*_kept_lines(kept), f"run them again once they can start: {command}"])


def sweep_kept_failure(
    spec: PipelineSpec, outputs: EvalOutputs, kept: Sequence[tuple[str, InstanceResult, InstanceResult]]
) -> str | None:
    """:func:`kept_failure` of a sweep: ``kept`` holds each (checkpoint label, attempt, earlier result it kept), said
    checkpoint by checkpoint. The kept results are current, which a plain run of the sweep skips: the command
    evaluates those pairs again (``--rerun``)."""
    from hud_pipelines.eval.checks import rerun_command

    if not kept:
        return None
    lines: list[str] = []
    commands: list[str] = []
    rerun = [*outputs.run_command(spec), "--rerun"]
    for label in dict.fromkeys(label for label, _, _ in kept):  # a run takes one checkpoint's contiguous range
        said = _kept_lines([(attempt, earlier) for of, attempt, earlier in kept if of == label])
        lines += [f"checkpoint {label}: {line}" for line in said]
        pairs = [f"{label}{sweep.PARTITION_SEPARATOR}{attempt.key}" for of, attempt, _ in kept if of == label]
        order = [f"{label}{sweep.PARTITION_SEPARATOR}{key}" for key in spec.partition_keys()]
        commands.append(rerun_command(pairs, rerun, order))
    return "\n".join([*lines, f"evaluate them again once they can start: {'; '.join(commands)}"])


def _kept_lines(kept: Sequence[tuple[InstanceResult, InstanceResult]]) -> list[str]:
    """What a run that kept earlier results says of each (attempt, earlier result it kept)."""
    # one line per fault and earlier run, with the first instance's reason in one line: a sim down says it once,
    # and reasons that differ only by a port, a process or a stack dump do not push the command out of sight
    alike: dict[tuple[str, str, str], list[InstanceResult]] = {}
    for attempt, earlier in kept:
        ended = "did not start" if attempt.fault in NEVER_STARTED else "did not complete"
        alike.setdefault((ended, str(attempt.fault), earlier.run_id), []).append(attempt)
    logged = "the run's log"  # grades.json holds the kept rows, which never saw the attempt's reason
    return [
        f"instance(s) {', '.join(a.key for a in attempts)} {ended} ({fault}: {one_line(attempts[0].error, logged)}); "
        f"their results of run {run} are kept, as nothing ran to replace them"
        for (ended, fault, run), attempts in alike.items()
    ]
