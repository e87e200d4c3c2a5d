"""The figures of the sweep table: per (checkpoint, task) counts and intervals, and the paired comparisons.

:func:`compare_checkpoints` builds the :class:`~hud_pipelines.eval.sweep_table.SweepComparison` of a
sweep's grade rows; the table module holds what it is and how it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from hud_pipelines.eval.comparison import Verdict, compare, errors_against
from hud_pipelines.eval.grades import GradeRow, summarize
from hud_pipelines.eval.paired_tests import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED
from hud_pipelines.eval.report import rate_columns
from hud_pipelines.eval.sweep_table import (
    ALL_TASKS,
    NO_COMPARISON,
    SCORE_CONFIDENCE,
    CheckpointRows,
    SweepComparison,
    SweepRow,
    Versus,
)
from hud_pipelines.recording.events import EpisodeStatus


def compare_checkpoints(
    checkpoints: Sequence[CheckpointRows | tuple[str, int | None, Sequence[GradeRow]]],
    *,
    baseline: str | None = None,
    alpha: float = 0.05,
    min_effect: float = 0.1,
    pooled: Collection[str] | None = None,
) -> SweepComparison:
    """The sweep table of ``checkpoints`` (in training order), compared with the previous one of the same
    training run (:func:`_previous`) and with ``baseline``.

    ``baseline`` is one of the labels (its own ``vs_baseline`` columns stay empty), or ``None`` for no
    baseline columns. ``pooled``: the tasks the all-tasks row counts (a matrix's control tasks: a
    perturbed arm has its own row, and pooling it would change what the sweep's verdict means);
    ``None``: every task.
    """
    sweep = [
        checkpoint if isinstance(checkpoint, CheckpointRows) else CheckpointRows(*checkpoint)
        for checkpoint in checkpoints
    ]
    _check_inputs(sweep, baseline, alpha, min_effect)
    baseline_checkpoint = next((c for c in sweep if c.label == baseline), None)
    rows: list[SweepRow] = []
    for index, checkpoint in enumerate(sweep):
        against = None if checkpoint.label == baseline else baseline_checkpoint
        for task in [*_tasks(checkpoint.rows), ALL_TASKS]:
            mine = _of_task(checkpoint.rows, task, pooled)
            previous = _previous(sweep, index, task, pooled)
            rows.append(
                _figures(
                    checkpoint,
                    task,
                    mine,
                    previous=_versus(mine, previous, task, pooled, alpha=alpha, min_effect=min_effect),
                    baseline=_versus(mine, against, task, pooled, alpha=alpha, min_effect=min_effect),
                )
            )
    return SweepComparison(rows=rows, baseline=baseline, alpha=alpha, min_effect=min_effect)


def _check_inputs(sweep: list[CheckpointRows], baseline: str | None, alpha: float, min_effect: float) -> None:
    """Refuse what would make a wrong table: a repeated label, an unknown baseline, a task called ``all``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < min_effect <= 1:
        raise ValueError(f"min_effect must be in (0, 1], got {min_effect}")
    labels = [checkpoint.label for checkpoint in sweep]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"checkpoint label(s) listed twice: {', '.join(repeated)}")
    if baseline is not None and baseline not in labels:
        raise ValueError(f"the baseline {baseline!r} is not one of the checkpoints ({', '.join(labels) or 'none'})")
    for checkpoint in sweep:
        if any(row.task == ALL_TASKS for row in checkpoint.rows):
            raise ValueError(
                f"checkpoint {checkpoint.label}: a task is named {ALL_TASKS!r}, the name of the all-tasks row"
            )


def _tasks(rows: Sequence[GradeRow]) -> list[str]:
    """The checkpoint's tasks in the pipeline's order (``task_index``, then name)."""
    first: dict[str, int] = {}
    for row in rows:
        first[row.task] = min(first.get(row.task, row.task_index), row.task_index)
    return sorted(first, key=lambda task: (first[task], task))


def _of_task(rows: Sequence[GradeRow], task: str, pooled: Collection[str] | None) -> list[GradeRow]:
    if task != ALL_TASKS:
        return [row for row in rows if row.task == task]
    return list(rows) if pooled is None else [row for row in rows if row.task in pooled]


def _previous(
    sweep: Sequence[CheckpointRows], index: int, task: str, pooled: Collection[str] | None
) -> CheckpointRows | None:
    """What checkpoint ``index`` is compared with on ``task`` as its previous: the last one before it, of its own
    training run, that answered an episode of that task; ``None`` for the first of a run. A checkpoint of no step
    beside numbered ones (a ``best.pt`` beside ``step_*.pt``) is no point of training: it has no previous, nor is
    it one. Where no checkpoint of the run has a step (folders named by hand), the table's order is the only one.

    One whose every episode errored (it never loaded: weights of another shape) has nothing to pair with, so the
    next is compared with the last one that has: a "no paired episodes" there would hide whether training
    helped since. When no earlier checkpoint of the run answered one, it is the one just before, whose
    comparison then says it has no paired episodes.
    """
    earlier: list[CheckpointRows] = []
    stepped = any(c.step is not None for c in sweep if c.run == sweep[index].run)
    if stepped and sweep[index].step is None:
        return None
    for checkpoint in reversed(sweep[:index]):
        if checkpoint.run != sweep[index].run:
            break
        if checkpoint.step is not None or not stepped:
            earlier.append(checkpoint)
    answered = (
        c for c in earlier if any(r.status is not EpisodeStatus.ERRORED for r in _of_task(c.rows, task, pooled))
    )
    return next(answered, earlier[0] if earlier else None)


def _versus(
    mine: list[GradeRow],
    other: CheckpointRows | None,
    task: str,
    pooled: Collection[str] | None,
    *,
    alpha: float,
    min_effect: float,
) -> Versus:
    """The paired comparison of ``mine`` with the same task of ``other`` (none without another checkpoint)."""
    if other is None:
        return NO_COMPARISON
    theirs = _of_task(other.rows, task, pooled)
    compared = compare(mine, theirs, alpha=alpha, min_effect=min_effect)
    errors = errors_against(mine, theirs, alpha=alpha, min_effect=min_effect)
    undecided = compared.verdict is not Verdict.WORSE and errors is not None and errors.worst.verdict is Verdict.WORSE
    return Versus.of(compared, other.label, errors.here + errors.there if undecided and errors else None)


def _figures(
    checkpoint: CheckpointRows, task: str, rows: list[GradeRow], *, previous: Versus, baseline: Versus
) -> SweepRow:
    summary = summarize(rows)
    rates = rate_columns(summary)
    answered = [row for row in rows if row.status is not EpisodeStatus.ERRORED]
    if answered and all(row.score == float(row.success) for row in answered):
        score_low, score_high = rates["ci_low"], rates["ci_high"]  # the score is the success: its interval
    else:
        score_low, score_high = _score_interval(answered) or (None, None)
    return SweepRow(
        checkpoint=checkpoint.label,
        step=checkpoint.step,
        task=task,
        **rates,
        mean_score=summary.mean_score,
        score_ci_low=score_low,
        score_ci_high=score_high,
        versus_previous=previous,
        versus_baseline=baseline,
        run=checkpoint.run,
    )


def _score_interval(answered: list[GradeRow]) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the mean score of the answered episodes, in episode order
    (``None`` for fewer than two: one episode has no spread to resample).

    Drawn with the seed and samples of :mod:`hud_pipelines.eval.comparison`, over the rows sorted by
    episode so that their order does not change the interval.
    """
    if len(answered) < 2:
        return None
    ordered = sorted(answered, key=lambda row: (row.task, row.instance, row.slot, -1 if row.seed is None else row.seed))
    scores = np.array([row.score for row in ordered], dtype=np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, scores.size, size=(BOOTSTRAP_SAMPLES, scores.size))
    means = np.sort(scores[picks].mean(axis=1))
    tail = (1 - SCORE_CONFIDENCE) / 2
    low = float(means[math.floor(tail * (means.size - 1))])
    high = float(means[math.ceil((1 - tail) * (means.size - 1))])
    return low, high
