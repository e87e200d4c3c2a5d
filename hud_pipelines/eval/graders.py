"""Graders: turn an episode's outcome into ``(score, success)`` as the pipeline's YAML says.

- ``success``: the env's own success signal, at any step (``at: any``) or on the last (``at: end``);
  score 1 or 0.
- ``return``: score is the episode return; success when it reaches ``threshold`` (or, without a
  threshold, the env's success signal).
- ``callable``: ``target(episode: dict)`` returns a float score, a bool success, or a dict with
  ``score`` and ``success``; the dict it receives holds the outcome's fields plus the episode key. A
  float (or a dict without ``success``) leaves success to the env's signal.

Each grade says whether the env's success signal decided its success (``by_signal``): an env that never
gives one fails every such episode, which the eval warns of, while a grader's own ``False`` is a verdict.

Errored episodes are graded too (a grader may want to see them), but their status stays errored.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from hud_pipelines.agent.run_failures import CODE_FAILURES, code_failed
from hud_pipelines.errors import GraderError
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome
from hud_pipelines.spec.grading import CallableGrader, GraderSpec, ReturnGrader, SuccessGrader


class Grade(NamedTuple):
    """A grader's verdict on one episode; ``by_signal``: its success is the env's signal, not the grader's say."""

    score: float
    success: bool
    by_signal: bool


class Grader(Protocol):
    name: str

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> Grade: ...


class _Success:
    def __init__(self, name: str, *, at_end: bool = False) -> None:
        self.name = name
        self.at_end = at_end

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> Grade:
        success = outcome.success_at_end if self.at_end else outcome.success
        return Grade(float(success), success, by_signal=True)


RETURN_TOLERANCE = 1e-9
"""How far below a return grader's threshold a return still reaches it, relative to the threshold (at least 1):
a return is a float64 sum of one reward per step, and ten rewards of 0.1 add up to 0.9999999999999999, which
must reach the threshold 1 they reach on paper. It is far below any reward's own resolution."""


def reaches(total_reward: float, threshold: float) -> bool:
    """Whether a return reaches ``threshold``, up to the rounding of its sum (:data:`RETURN_TOLERANCE`)."""
    return total_reward >= threshold - RETURN_TOLERANCE * max(1.0, abs(threshold))


class _Return:
    def __init__(self, name: str, threshold: float | None) -> None:
        self.name = name
        self.threshold = threshold

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> Grade:
        if self.threshold is None:
            return Grade(outcome.total_reward, outcome.success, by_signal=True)
        return Grade(outcome.total_reward, reaches(outcome.total_reward, self.threshold), by_signal=False)


class _Callable:
    def __init__(self, name: str, target: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.name = name
        self.target = target
        self.fn = fn

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> Grade:
        episode = {**asdict(outcome), "status": outcome.status.value, **asdict(key), "trace_id": key.trace_id}
        try:
            value = self.fn(episode)
        except CODE_FAILURES as exc:  # sys.exit() in a grader is its failure, not the run's interrupt
            if not code_failed(exc):
                raise
            raise GraderError(f"grader {self.name!r} ({self.target}) raised {type(exc).__name__}: {exc}") from exc
        if isinstance(value, bool | np.bool_):  # a numpy comparison's result is a bool too
            success = value is True or value is np.True_
            return Grade(float(success), success, by_signal=False)
        if isinstance(value, numbers.Real):  # numpy's integers and floats among them
            return Grade(float(value), outcome.success, by_signal=True)
        if isinstance(value, dict) and "score" in value:
            grade: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
            score, success = grade["score"], grade.get("success", outcome.success)
            if isinstance(score, numbers.Real) and isinstance(success, bool | np.bool_):  # "False" is no failure
                return Grade(float(score), success is True or success is np.True_, by_signal="success" not in grade)
        raise GraderError(
            f"grader {self.name!r} ({self.target}) returned {value!r}; expected a float, a bool or "
            "a dict with 'score' (a number) and 'success' (a bool)"
        )


def score_bounds(spec: GraderSpec) -> tuple[float, float] | None:
    """The lowest and highest score ``spec`` gives: a success grader's 0 and 1; ``None`` where a score can be
    anything (a return, a function's float)."""
    return (0.0, 1.0) if isinstance(spec, SuccessGrader) else None


def grader_text(spec: GraderSpec) -> str:
    """What the grader that decides an episode counts as success, in words for a report."""
    match spec:
        case SuccessGrader(at="end"):
            rule = "the env's success signal on the episode's last step"
        case SuccessGrader():
            rule = "the env's success signal at any step of the episode"
        case ReturnGrader(threshold=None):
            rule = "score the return, success the env's signal at any step"
        case ReturnGrader():
            rule = f"score the return, success a return of at least {spec.threshold:g}"
        case CallableGrader():
            rule = f"the function {spec.target}"
    name = spec.name or spec.kind
    who = name if name == spec.kind else f"{name} (a {spec.kind} grader)"
    return f"{who}: {rule}"


def signal_advice(spec: GraderSpec) -> str:
    """How a grader that left success to the env's signal gets a verdict where the env gives none."""
    match spec:
        case CallableGrader():
            way = f"have {spec.target} return it too ({{'score': ..., 'success': ...}})"
        case ReturnGrader():
            way = f"give the {spec.name or spec.kind} grader a threshold the return must reach to succeed"
        case SuccessGrader():
            way = "grade on the return"
    tail = "" if isinstance(spec, CallableGrader) else " (graders: [{kind: return, threshold: ...}])"
    return f"report success in the env's info, or {way}{tail}"


def build_graders(specs: Sequence[GraderSpec], *, base_dir: Path) -> list[Grader]:
    """Graders from their specs; callable targets are imported now so a typo fails before any rollout."""
    from hud_pipelines.targets import load_target, one_argument_refused

    graders: list[Grader] = []
    for spec in specs:
        match spec:
            case SuccessGrader():
                graders.append(_Success(spec.name, at_end=spec.at == "end"))
            case ReturnGrader():
                graders.append(_Return(spec.name, spec.threshold))
            case CallableGrader():
                fn = load_target(spec.target, base_dir=base_dir, error=GraderError, what=f"grader {spec.name!r}")
                if not callable(fn):
                    raise GraderError(f"grader {spec.name!r}: {spec.target} is not callable")
                refused = one_argument_refused(fn)  # before any rollout: each episode would error on it
                if refused is not None:
                    raise GraderError(f"grader {spec.name!r}: {spec.target} {refused}")
                graders.append(_Callable(spec.name, spec.target, fn))
    return graders
