"""Warnings a run's summary and its report say beside the checks: what the grades count that no check judges.

Episodes that errored on their own, with no ``max_error_rate`` check to bound them (or only the control tasks'
bounded, in a matrix), and tasks whose env never reported the success signal other tasks' did: a run would pass its
checks with its rate taken over fewer, or other, episodes than it scheduled, and say nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Sequence

from hud_pipelines.errors import Fault
from hud_pipelines.eval.graders import signal_advice
from hud_pipelines.eval.grades import GradeRow, one_line
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.step_values import SUCCESS_KEYS
from hud_pipelines.spec.grading import CheckSpec, GraderSpec, MaxErrorRateCheck, ReturnGrader, SuccessGrader


def success_signal_warning(grader: GraderSpec, rows: Sequence[GradeRow], run_id: str | None = None) -> str | None:
    """A warning when the env's success signal decided grades but no answered episode of the task ever gave one.

    Such an eval reads 0 % without anything being wrong with the policy: the env reports success under a key
    the sim does not read, or not at all. Each row records whether the signal decided it (a callable grader
    that returns a score leaves success to the signal; its own ``False`` is a verdict, never warned of); a row
    without that record goes by the grader's kind. The way out it names is the grader's own. With ``run_id``,
    only the tasks that run has rows of are judged, each on all its ``rows`` (a run of some instances must not
    call silent a task whose kept instances gave the signal).
    """
    by_kind = isinstance(grader, SuccessGrader) or (isinstance(grader, ReturnGrader) and grader.threshold is None)
    touched = {row.task for row in rows if run_id is None or row.run_id == run_id}
    answered = [
        row
        for row in rows
        if row.task in touched and row.status is not EpisodeStatus.ERRORED and row.success_reported is not None
    ]
    tasks: dict[str, list[GradeRow]] = {}
    for row in answered:
        if row.success_by_signal if row.success_by_signal is not None else by_kind:
            tasks.setdefault(row.task, []).append(row)
    silent = {task: len(found) for task, found in tasks.items() if not any(row.success_reported for row in found)}
    if not silent:
        return None
    keys = ", ".join(f"info[{key!r}]" for key in SUCCESS_KEYS)
    name = grader.name or grader.kind
    advice = signal_advice(grader)
    if len(silent) == len(tasks):
        return (
            f"no episode reported a success signal ({keys}): the {name} grader counts all {sum(silent.values())} "
            f"answered episode(s) {'it left to that signal ' if grader.kind == 'callable' else ''}as failed; "
            f"{advice}"
        )
    named = ", ".join(f"{task} ({count})" for task, count in silent.items())  # a benchmark env of its own keys
    return (
        f"no episode of task(s) {named} reported a success signal ({keys}), where other tasks' did: the {name} "
        f"grader counts those answered episodes as failed; {advice}"
    )


def episode_errors_warning(
    checks: Sequence[CheckSpec], rows: Sequence[GradeRow], controls: Collection[str] | None = None
) -> str | None:
    """A warning when episodes errored on their own (an env or policy raised, a refused action) and no
    ``max_error_rate`` check looks at errors: no built-in check fails on them, so the run would pass with
    its rate taken over fewer episodes than it scheduled, and say nothing.

    Only those trigger it: faults that end an instance already fail ``instances_completed``. Once it is said,
    its count and its count per fault are of every errored episode, those of failed instances too (a checkpoint
    that never loaded), as the ``max_error_rate`` it advises would count them: the rate is taken without all of
    them. ``not_run`` rows are not errors of a run, there as in ``max_error_rate``: left out of both figures.
    The first error quoted is of an episode that errored on its own (``instances_completed`` quotes the others).
    ``controls``: a matrix's control tasks, all a ``max_error_rate`` check judges: its perturbations' errors are
    said even so.
    """
    bounded = any(isinstance(check, MaxErrorRateCheck) for check in checks)
    if bounded:
        if controls is None:
            return None
        rows = [row for row in rows if row.task not in controls]  # what no check sees
    own = next((row for row in rows if row.fault is not None and not row.fault.ends_instance), None)
    if own is None:
        return None
    faults = collections.Counter(row.fault.value for row in rows if row.fault not in (None, Fault.NOT_RUN))
    counted = ", ".join(f"{fault} {count}" for fault, count in faults.most_common())
    scheduled = sum(1 for row in rows if row.fault is not Fault.NOT_RUN)
    labels = sorted({row.checkpoint for row in rows if row.checkpoint is not None})  # a sweep's: whose episodes
    of = f" of checkpoint {labels[0]}" if len(labels) == 1 else f" of {len(labels)} checkpoints" if labels else ""
    not_run = len(rows) - scheduled  # said, so that its figures add up to the scheduled episodes the summary counts
    pending = f", besides {not_run} not run with this configuration yet" if not_run else ""
    first = one_line(own.error or "")
    said = f"{faults.total()} of {scheduled} episode(s){of} errored{pending} ({counted}; the first: {first})"
    if bounded:
        return (
            f"{said} in perturbation tasks: the max_error_rate check judges the control tasks only; each "
            "perturbation's errors are in the report's perturbations table"
        )
    scope = " of the control tasks" if controls is not None else ""
    return (
        f"{said}: errored episodes are left out of the success rate, and no max_error_rate check bounds them; add "
        f"{{kind: max_error_rate, value: 0.0}} to its checks to fail the run when an episode{scope} errors"
    )


def rewritten_warning(rows: Sequence[GradeRow], completed: Collection[str], run_id: str) -> str | None:
    """A warning when instances this run completed (``completed``: their keys) hold another run's results by its
    end: a run of the same instances at the same time wrote over them (the later run is told of the overlap as it
    starts; this tells the earlier one), so a figure over all the rows counts that run's episodes for them. A
    sweep's rows are left out: its results do not name their checkpoint."""
    others: dict[str, dict[str, None]] = {}  # run -> its instances, in order, each once
    for row in rows:
        if row.checkpoint is None and row.group_id in completed and row.run_id != run_id:
            others.setdefault(row.run_id, {})[row.group_id] = None
    if not others:
        return None
    said = "; ".join(
        f"{', '.join(list(keys)[:5])}{' and more' if len(keys) > 5 else ''} by run {run}"
        for run, keys in others.items()
    )
    count = sum(len(keys) for keys in others.values())
    return (
        f"{count} instance(s) this run completed were written over by a run of them at the same time ({said}): "
        "the figures over all rows count that run's results for them (as not run, where it ran another configuration)"
    )
