"""Graders: turn an episode's outcome into ``(score, success)`` as the pipeline's YAML says.

- ``success``: the env's own success signal; score 1 or 0.
- ``return``: score is the episode return; success when it reaches ``threshold`` (or, without a
  threshold, the env's success signal).
- ``callable``: ``target(episode: dict)`` returns a float score, a bool success, or a dict with
  ``score`` and ``success``; the dict it receives holds the outcome's fields plus the episode key.

Errored episodes are graded too (a grader may want to see them), but their status stays errored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from hud_pipelines.errors import GraderError
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome
from hud_pipelines.spec.grading import CallableGrader, GraderSpec, ReturnGrader, SuccessGrader


class Grader(Protocol):
    name: str

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> tuple[float, bool]: ...


class _Success:
    def __init__(self, name: str) -> None:
        self.name = name

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> tuple[float, bool]:
        return float(outcome.success), outcome.success


class _Return:
    def __init__(self, name: str, threshold: float | None) -> None:
        self.name = name
        self.threshold = threshold

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> tuple[float, bool]:
        success = outcome.success if self.threshold is None else outcome.total_reward >= self.threshold
        return outcome.total_reward, success


class _Callable:
    def __init__(self, name: str, target: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.name = name
        self.target = target
        self.fn = fn

    def grade(self, outcome: EpisodeOutcome, key: EpisodeKey) -> tuple[float, bool]:
        episode = {**asdict(outcome), "status": outcome.status.value, **asdict(key), "trace_id": key.trace_id}
        try:
            value = self.fn(episode)
        except Exception as exc:
            raise GraderError(f"grader {self.name!r} ({self.target}) raised {type(exc).__name__}: {exc}") from exc
        if isinstance(value, bool):
            return float(value), value
        if isinstance(value, int | float):
            return float(value), outcome.success
        if isinstance(value, dict) and "score" in value:
            grade: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
            return float(grade["score"]), bool(grade.get("success", outcome.success))
        raise GraderError(
            f"grader {self.name!r} ({self.target}) returned {value!r}; expected a float, a bool or "
            "a dict with 'score' and 'success'"
        )


def build_graders(specs: Sequence[GraderSpec], *, base_dir: Path) -> list[Grader]:
    """Graders from their specs; callable targets are imported now so a typo fails before any rollout."""
    from hud_pipelines.targets import load_target

    graders: list[Grader] = []
    for spec in specs:
        match spec:
            case SuccessGrader():
                graders.append(_Success(spec.name))
            case ReturnGrader():
                graders.append(_Return(spec.name, spec.threshold))
            case CallableGrader():
                fn = load_target(spec.target, base_dir=base_dir, error=GraderError, what=f"grader {spec.name!r}")
                if not callable(fn):
                    raise GraderError(f"grader {spec.name!r}: {spec.target} is not callable")
                graders.append(_Callable(spec.name, spec.target, fn))
    return graders
