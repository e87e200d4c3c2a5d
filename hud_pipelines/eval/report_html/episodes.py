"""What the page shows of each episode: its grade row, its trace and videos, its plotted series.

A series is one state or action dimension (named as the trace header names it, which is the
contract's per-dimension naming) or the reward, sampled at no more than :data:`MAX_POINTS` steps so
the data embedded in the page stays small however long the episodes are.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.recording.thumbnails import last_frame, strip_png
from hud_pipelines.recording.trace_reader import Trace, read_trace
from hud_pipelines.recording.traces import TRACE_SUFFIX, StepType

MAX_POINTS = 240
"""Samples kept per series: enough for a plot a few hundred pixels wide."""
SIGNIFICANT_DIGITS = 4
"""Digits kept of a plotted value (the plot is a picture; the trace has the exact numbers)."""
DEFAULT_CONTROL_RATE = 30.0


@dataclass(frozen=True)
class Series:
    """One plotted line: a state dimension, an action dimension or the reward, over the sampled steps."""

    group: str
    """``state``, ``action`` or ``reward``."""
    feature: str
    name: str
    values: list[float | None]
    """``None`` where the value was not finite (the plot leaves a gap)."""

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "feature": self.feature, "name": self.name, "values": self.values}


@dataclass(frozen=True)
class Video:
    camera: str
    href: str
    """Relative to the page."""
    path: str = ""
    """The file itself."""


@dataclass(frozen=True)
class EpisodeView:
    """One card of the page."""

    index: int
    row: GradeRow
    trace_href: str | None = None
    """Relative to the page; ``None`` when the episode left no trace (it never started)."""
    videos: list[Video] = field(default_factory=list[Video])
    control_rate: float = DEFAULT_CONTROL_RATE
    steps: list[int] = field(default_factory=list[int])
    """The step index of every sample of :attr:`series`."""
    series: list[Series] = field(default_factory=list[Series])

    def plot_data(self) -> dict[str, Any]:
        return {
            "rate": self.control_rate,
            "steps": self.steps,
            "series": [s.as_dict() for s in self.series],
        }


def episode_views(
    rows: Sequence[GradeRow],
    outputs: EvalOutputs,
    page_dir: Path,
    *,
    members: Mapping[str, EvalOutputs] | None = None,
) -> list[EpisodeView]:
    """A view per grade row, in the grade table's order, with its trace read when one exists.

    A sweep's rows name their checkpoint, whose own outputs (``members``) hold its traces.
    """
    run_ids = {row.run_id for row in rows}
    traces = _trace_files(outputs, run_ids)
    for member in (members or {}).values():
        traces.update(_trace_files(member, run_ids))
    views: list[EpisodeView] = []
    for index, row in enumerate(rows):
        path = traces.get(row.trace_id or "")
        views.append(_view(index, row, read_trace(path), page_dir) if path is not None else EpisodeView(index, row))
    return views


def episode_thumbnails(views: Sequence[EpisodeView], per_row: int = 6, height: int = 96) -> bytes | None:
    """How episodes ended: the last frame of each one's first camera; failures first.

    A row of episodes that did not succeed, then a row of those that did, ``per_row`` at most each;
    ``None`` when no episode has a video.
    """
    filmed = [v for v in views if v.videos]
    groups = (
        [v for v in filmed if v.row.status is not EpisodeStatus.SUCCEEDED],
        [v for v in filmed if v.row.status is EpisodeStatus.SUCCEEDED],
    )
    rows: list[list[Any]] = []
    for group in groups:
        frames = (last_frame(Path(v.videos[0].path)) for v in group[:per_row])
        rows.append([frame for frame in frames if frame is not None])
    return strip_png(rows, height)


def _trace_files(outputs: EvalOutputs, run_ids: Iterable[str]) -> dict[str, Path]:
    """Trace id -> trace file, over the trace folders of the runs the rows come from."""
    found: dict[str, Path] = {}
    for run_id in sorted(r for r in run_ids if r):
        folder = outputs.traces(run_id)
        if folder.is_dir():
            found.update((path.name.removesuffix(TRACE_SUFFIX), path) for path in folder.rglob(f"*{TRACE_SUFFIX}"))
    return found


def _view(index: int, row: GradeRow, trace: Trace, page_dir: Path) -> EpisodeView:
    rate = trace.header.get("control_rate")
    steps, series = sampled_series(trace)
    return EpisodeView(
        index=index,
        row=row,
        trace_href=_href(trace.path, page_dir),
        videos=[Video(_camera(trace, path), _href(path, page_dir), str(path)) for path in trace.videos],
        control_rate=float(rate) if isinstance(rate, int | float) and rate > 0 else DEFAULT_CONTROL_RATE,
        steps=steps,
        series=series,
    )


def sampled_series(trace: Trace, max_points: int = MAX_POINTS) -> tuple[list[int], list[Series]]:
    """Every state and action dimension and the reward, at no more than ``max_points`` evenly spaced steps."""
    states = {int(s["step"]): cast(dict[str, dict[str, Any]], s["state"]) for s in trace.of_type(StepType.OBSERVATION)}
    actions = {int(s["step"]): cast(dict[str, Any], s["action"]) for s in trace.of_type(StepType.ACTION)}
    rewards = {int(s["step"]): s.get("reward") for s in trace.of_type(StepType.REWARD)}
    all_steps = sorted(set(states) | set(actions) | set(rewards))
    steps = _evenly(all_steps, max_points)
    series: list[Series] = []
    if not steps:  # it ended before its first step (errored at reset): nothing to plot, no empty plots
        return steps, series
    for feature, names in _state_names(trace, states).items():
        for name in names:
            values = [states.get(step, {}).get(feature, {}).get(name) for step in steps]
            series.append(Series("state", feature, name, _rounded(values)))
    for name in _action_names(trace, actions):
        series.append(Series("action", "action", name, _rounded([actions.get(step, {}).get(name) for step in steps])))
    if rewards:
        series.append(Series("reward", "reward", "reward", _rounded([rewards.get(step) for step in steps])))
    return steps, series


def _state_names(trace: Trace, states: Mapping[int, dict[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """Per state feature, its dimension names: the header's (the contract's), else those the steps carry."""
    declared = trace.header.get("state_names")
    if isinstance(declared, dict):
        return {str(k): [str(n) for n in cast(list[Any], v)] for k, v in cast(dict[Any, Any], declared).items()}
    first = states[min(states)] if states else {}
    return {feature: list(values) for feature, values in first.items()}


def _action_names(trace: Trace, actions: Mapping[int, dict[str, Any]]) -> list[str]:
    declared = trace.header.get("action_names")
    if isinstance(declared, list):
        return [str(n) for n in cast(list[Any], declared)]
    return list(actions[min(actions)]) if actions else []


def _evenly(steps: list[int], max_points: int) -> list[int]:
    if len(steps) <= max_points:
        return steps
    last = len(steps) - 1
    picked = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
    return [steps[i] for i in picked]


def _rounded(values: Iterable[Any]) -> list[float | None]:
    out: list[float | None] = []
    for value in values:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
        out.append(float(f"{number:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(number) else None)
    return out


def _camera(trace: Trace, video: Path) -> str:
    """``<trace_id>.<camera>.mp4`` -> ``<camera>``."""
    return video.name.removeprefix(f"{trace.trace_id}.").removesuffix(video.suffix)


def _href(path: Path, page_dir: Path) -> str:
    """A URL path relative to the page (forward slashes, each segment percent-encoded)."""
    return urllib.parse.quote(Path(os.path.relpath(path, page_dir)).as_posix())
