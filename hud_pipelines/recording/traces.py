"""Traces: one JSON-lines file per slot per episode, grouped by job, and their writer.

Layout: ``<root>/<job>/<trace_id>.jsonl`` (and ``<trace_id>.<camera>.mp4`` with video on), where
``trace_id`` is :attr:`hud_pipelines.recording.events.EpisodeKey.trace_id`, deterministic from (job,
task, instance, slot, episode, seed): the same eval run twice writes the same file names.

Every line is one typed step (``type`` is a :class:`StepType`):

- ``trace``: the header (key fields, prompt, per-dimension names of the action and state features);
- ``observation``: the state the action was chosen from, ``{feature: {name: value}}``;
- ``inference``: a chunk the policy returned (``chunk`` ``[T][A]``, ``length``, ``names``,
  ``latency_s``, ``batch_size``);
- ``action``: the action applied, ``{name: value}``;
- ``reward``: reward, done flags and success after the step;
- ``error``: why an errored episode ended;
- ``grade``: the outcome, always the last line.

Only ``trace.started_at``, ``inference.latency_s`` and ``inference.batch_size`` depend on timing
or scheduling; everything else is a pure function of the rollout.

:class:`TraceRecorder` writes them; :mod:`hud_pipelines.recording.trace_reader` reads them back.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import numpy.typing as npt

from hud_pipelines.closing import Closeable
from hud_pipelines.contract import Contract, FeatureType, looks_like_camera
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus, FrameBatch, InferenceBatch

TRACE_SUFFIX = ".jsonl"
TIMING_FIELDS = frozenset({"started_at", "latency_s", "batch_size"})
"""Fields whose values depend on timing or scheduling (ignore them when comparing traces): ``batch_size``
counts the rows that shared a forward, which with ``across_instances`` depends on which instances
were waiting at that moment."""


class TraceVideo(StrEnum):
    """Which episodes keep their camera video: every one, only those that did not succeed, or none."""

    ALL = "all"
    FAILED = "failed"
    """Failed and errored episodes (the ones worth watching); a succeeded episode's video is dropped."""
    NONE = "none"


DEFAULT_MAX_VIDEOS = 16
"""Episodes of an eval instance that keep video, at most (the pipeline default of ``traces.max_videos``)."""


class StepType(StrEnum):
    TRACE = "trace"
    OBSERVATION = "observation"
    INFERENCE = "inference"
    ACTION = "action"
    REWARD = "reward"
    ERROR = "error"
    GRADE = "grade"


@dataclass
class _Open:
    key: EpisodeKey
    file: IO[str]
    videos: dict[str, Any] = field(default_factory=dict[str, Any])
    filmed: bool = False


class TraceRecorder(Closeable):
    """An :class:`~hud_pipelines.recording.events.EpisodeSink` that writes traces under ``root/<job>/``.

    ``contract`` supplies per-dimension names and tells cameras from state; without it names are
    ``<feature>_<i>`` and cameras are recognised by shape. With ``video=True`` each camera of each
    trace is encoded to its own mp4 at the contract's control rate, on a background encoder thread;
    ``video`` may also be a :class:`TraceVideo` (``failed`` keeps only the videos of episodes that did
    not succeed), and at most ``max_videos`` episodes keep one. One recorder may serve several
    threads (the agent loops of concurrent sims).
    """

    def __init__(
        self,
        root: Path,
        contract: Contract | None = None,
        *,
        video: bool | TraceVideo = False,
        video_codec: str | None = None,
        max_videos: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.contract = contract
        self.video_mode = TraceVideo(video) if isinstance(video, str) else TraceVideo.ALL if video else TraceVideo.NONE
        self.video = self.video_mode is not TraceVideo.NONE
        self.video_codec = video_codec
        self.max_videos = max_videos
        self._kept_videos = 0
        self._encoder: Any = None
        self.fps = contract.control_rate if contract is not None else 30.0
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self._names: dict[str, list[str]] = {}
        self._cameras: dict[str, tuple[tuple[int, ...], bool]] = {}
        self._keys: dict[str, list[str]] = {}
        self._action_names_json: dict[int, str] = {}
        self.written: list[Path] = []

    def path(self, key: EpisodeKey) -> Path:
        return self.root / _safe(key.job) / f"{key.trace_id}{TRACE_SUFFIX}"

    # -- EpisodeSink -----------------------------------------------------------------------------------

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        header: dict[str, Any] = {
            "type": StepType.TRACE.value,
            "trace_id": key.trace_id,
            "job": key.job,
            "task": key.task,
            "instance": key.instance,
            "slot": key.slot,
            "episode": key.episode,
            "seed": key.seed,
            "prompt": prompt,
            "started_at": time.time(),
        }
        if self.contract is not None:
            header["action_names"] = self._action_names(self.contract.action.size)
            header["state_names"] = {n: self._feature_names(n, f.size) for n, f in self.contract.state_features.items()}
            header["control_rate"] = self.contract.control_rate
        with self._lock:
            previous = self._open.pop(key.trace_id, None)
            if previous is not None:
                self._close(previous)
            handle = _Open(key=key, file=path.open("w", encoding="utf-8"))
            if self.video and (self.max_videos is None or self._kept_videos < self.max_videos):  # kept ones count
                handle.filmed = True
                self._kept_videos += 1
            self._open[key.trace_id] = handle
            self.written.append(path)
            _write(handle.file, header)

    def add_frames(self, batch: FrameBatch) -> None:
        """Each row's observation, action and reward lines: the hot path of a recorded eval (every slot, every
        step). Each feature's rows are formatted together, from cached key strings and with numbers
        formatted in C, rather than through ``json.dumps`` three times per row (the text is the same:
        ``tests/recording/test_trace_lines.py``)."""
        rows = len(batch)
        if not rows:
            return
        state: list[tuple[str, list[str]]] = []
        cameras: list[str] = []
        for name, values in batch.observation.items():
            if self._is_camera(name, values[0]):
                cameras.append(name)
            else:
                state.append((_json_string(name), self._fields(name, values)))
        actions = self._fields("action", batch.action)
        steps = list(map(int.__repr__, batch.index.tolist()))
        rewards = _texts(batch.reward)
        terminated, truncated, success = _texts(batch.terminated), _texts(batch.truncated), _texts(batch.success)
        with self._lock:
            for row, key in enumerate(batch.keys):
                handle = self._require(key)
                step = steps[row]
                observed = ",".join([f"{name}:{{{fields[row]}}}" for name, fields in state])
                handle.file.write(
                    f'{{"type":"observation","step":{step},"state":{{{observed}}}}}\n'
                    f'{{"type":"action","step":{step},"action":{{{actions[row]}}}}}\n'
                    f'{{"type":"reward","step":{step},"reward":{rewards[row]},"terminated":{terminated[row]},'
                    f'"truncated":{truncated[row]},"success":{success[row]}}}\n'
                )
                if cameras and handle.filmed:
                    self._add_video(handle, {name: batch.observation[name][row] for name in cameras})

    def _fields(self, name: str, values: npt.NDArray[Any]) -> list[str]:
        """Each row's ``"<dim>":<value>,...`` of one feature, named as :meth:`_feature_names` names them."""
        flat = np.asarray(values).reshape(len(values), -1)
        width = flat.shape[1]
        keys = self._keys.get(name)
        if keys is None or len(keys) != width:
            keys = self._keys[name] = [f"{_ENCODE(n)}:" for n in self._feature_names(name, width)]
        number = _formatter(flat)
        return [",".join(map(str.__add__, keys, map(number, row))) for row in flat.tolist()]

    def add_inferences(self, batch: InferenceBatch) -> None:
        """Each row's inference line, built as :meth:`add_frames` builds its lines."""
        rows = len(batch)
        if not rows:
            return
        chunks = np.asarray(batch.chunk)
        length, width = int(chunks.shape[1]), int(chunks.shape[-1])
        names = self._action_names_json.get(width)
        if names is None:
            names = self._action_names_json[width] = _ENCODE(self._action_names(width))
        number = _formatter(chunks)
        steps = batch.step.tolist()
        head = f'{{"type":"{StepType.INFERENCE.value}","step":'
        tail = f',"latency_s":{_number(batch.latency_s)},"batch_size":{_number(batch.batch_size)}}}\n'
        with self._lock:
            for row, key in enumerate(batch.keys):
                chunk = ",".join(["[" + ",".join(map(number, action)) + "]" for action in chunks[row].tolist()])
                text = f'{head}{int.__repr__(steps[row])},"length":{length},"names":{names},"chunk":[{chunk}]{tail}'
                self._require(key).file.write(text)

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        with self._lock:
            handle = self._open.pop(key.trace_id, None)
            if handle is None:
                raise KeyError(f"trace {key} was never begun")
            if outcome.error is not None:
                _write(handle.file, {"type": StepType.ERROR.value, "message": outcome.error})
            _write(
                handle.file,
                {
                    "type": StepType.GRADE.value,
                    "status": outcome.status.value,
                    "score": None if outcome.status is EpisodeStatus.ERRORED else outcome.score,  # as grades.json
                    "success": None if outcome.status is EpisodeStatus.ERRORED else outcome.success,
                    "total_reward": outcome.total_reward,
                    "steps": outcome.steps,
                    "terminated": outcome.terminated,
                    "truncated": outcome.truncated,
                    "error": outcome.error,
                    "extra": _jsonable(outcome.extra),
                },
            )
            self._close(handle)
            if handle.filmed and self.video_mode is TraceVideo.FAILED and outcome.success:
                for video in handle.videos.values():  # nothing to watch: it succeeded
                    video.path.unlink(missing_ok=True)
                self._kept_videos -= 1

    def close(self) -> None:
        """Close traces that never ended (their files lack a grade, which readers report).

        The video encoder's thread ends here too (a later video starts a new one), so a recorder
        per instance leaves no thread, and no memory, behind.
        """
        with self._lock:
            for handle in self._open.values():
                self._close(handle)
            self._open.clear()
            encoder, self._encoder = self._encoder, None
        if encoder is not None:
            encoder.stop()

    # -- helpers ---------------------------------------------------------------------------------------

    def _require(self, key: EpisodeKey) -> _Open:
        handle = self._open.get(key.trace_id)
        if handle is None:
            raise KeyError(f"trace {key} was never begun (or already ended)")
        return handle

    def _close(self, handle: _Open) -> None:
        handle.file.close()
        for video in handle.videos.values():
            video.close()

    def _video_encoder(self) -> Any:
        from hud_pipelines.recording.video import VideoEncoder

        if self._encoder is None:
            self._encoder = VideoEncoder()
        return self._encoder

    def _is_camera(self, name: str, value: npt.NDArray[Any]) -> bool:
        if self.contract is not None and name in self.contract.features:
            return self.contract.features[name].is_camera
        shape = np.shape(value)
        known = self._cameras.get(name)
        if known is None or known[0] != shape:  # a feature's shape decides, so once per name and shape
            known = self._cameras[name] = (shape, looks_like_camera(np.asarray(value)))
        return known[1]

    def _feature_names(self, name: str, size: int) -> list[str]:
        cached = self._names.get(name)
        if cached is not None and len(cached) == size:
            return cached
        feature = self.contract.features.get(name) if self.contract is not None else None
        names = list(feature.names) if feature is not None and feature.names and len(feature.names) == size else None
        names = names or [f"{name.rsplit('/', 1)[-1]}_{i}" for i in range(size)]
        self._names[name] = names
        return names

    def _action_names(self, size: int) -> list[str]:
        return self._feature_names("action", size)

    def _add_video(self, handle: _Open, cameras: dict[str, npt.NDArray[Any]]) -> None:
        from hud_pipelines.recording.video import CameraVideo

        for name, image in cameras.items():
            video = handle.videos.get(name)
            if video is None:
                path = self.path(handle.key).with_suffix(f".{_safe(name)}.mp4")
                video = handle.videos[name] = CameraVideo(
                    path, self.fps, codec=self.video_codec, encoder=self._video_encoder()
                )
            feature = self.contract.features.get(name) if self.contract is not None else None
            video.add(image[..., ::-1] if feature is not None and feature.type is FeatureType.BGR else image)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""One compact JSON line; built once (``json.dumps`` with options builds an encoder per call: a trace
writes three lines per slot and step)."""


def _number(value: Any) -> str:
    """A JSON scalar exactly as ``json.dumps`` writes it (``NaN`` and ``Infinity`` included: traces keep them)."""
    kind: type[Any] = cast(type[Any], type(value))  # an Any has no known type
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value)
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if kind is int:
        return int.__repr__(value)
    return _ENCODE(value)


_BOOLS = {False: "false", True: "true"}


@functools.lru_cache(maxsize=1024)
def _json_string(text: str) -> str:
    """``text`` as a JSON string (a feature name: the same few on every line of every trace)."""
    return _ENCODE(text)


def _formatter(values: npt.NDArray[Any]) -> Callable[[Any], str]:
    """What writes each of ``values`` (as ``tolist()`` gives them) as :func:`_number` would, in C where it can."""
    kind = values.dtype.kind
    if kind == "f" and values.dtype.itemsize <= 8:  # a longdouble is no Python float: json's rule refuses it
        return float.__repr__ if bool(np.isfinite(values).all()) else _number
    if kind in "iu":
        return int.__repr__
    if kind == "b":
        return _BOOLS.__getitem__
    return _number


def _texts(values: npt.NDArray[Any]) -> list[str]:
    """Each of a ``[n]`` column's values as :func:`_number` writes it."""
    return list(map(_formatter(values), values.tolist()))


def _write(file: IO[str], line: dict[str, Any]) -> None:
    file.write(_ENCODE(line) + "\n")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
