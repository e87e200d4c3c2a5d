"""``LeRobotDatasetSink``: an ``EpisodeSink`` that writes one shard of a LeRobot v3 dataset.

Why it looks like this:

- **Episodes are committed whole.** Slots interleave, but lerobot's writer holds one episode at a
  time, so each slot's frames are buffered (already converted to LeRobot frames) until ``end``;
  only then is the episode handed to a writer, which calls ``add_frame`` for each frame and
  ``save_episode`` once. An errored episode is left out unless ``keep_errored`` (then every frame
  carries ``episode.errored``); an episode never ended (cancellation) is never written.
- **Writing never stalls stepping.** ``add`` converts and buffers (microseconds); ``end`` puts the
  finished episode on a bounded queue. Writer threads (``options.writers``) take episodes from it,
  each into its own *part* (a complete lerobot dataset under ``<root>/part-<i>``), so PNG writing,
  stats and video encoding of several episodes run at once (they release the GIL). The queue bound
  keeps memory flat whatever the number of episodes: at most slots x episode length frames plus
  ``queued_episodes`` finished episodes are held; when writers fall behind, ``end`` waits.
- **finalize always runs.** Each writer finalizes its part when the sink closes, when the writer
  fails, and when the thread that owns the sink is gone without closing it. Writers are not
  daemon threads, so an interrupt in the caller still lets them finish the part they hold.
- Each part also gets ``meta/hud_episodes.jsonl``: one line per written episode with its
  ``EpisodeKey``, trace id and outcome, so dataset episodes can be joined with grades and traces.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from hud_pipelines.contract import Contract
from hud_pipelines.dataset.features import ERRORED, DatasetLayout, FrameDict
from hud_pipelines.dataset.options import DatasetOptions, VideoCodec
from hud_pipelines.errors import HudPipelinesError, SlotStateError
from hud_pipelines.recording import EpisodeKey, EpisodeOutcome, EpisodeStatus, Frame, Inference

if TYPE_CHECKING:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

logger = logging.getLogger(__name__)

PART_PREFIX = "part-"
EPISODES_SIDECAR = "meta/hud_episodes.jsonl"
"""Per part (and in a merged dataset): one JSON line per episode, in episode_index order."""
_POLL_S = 0.5


class DatasetWriteError(HudPipelinesError):
    """A dataset writer failed; the episodes it had committed stay in its finalized part."""


@dataclass
class SinkReport:
    """What a sink did with the episodes it saw."""

    episodes_written: int = 0
    frames_written: int = 0
    errored_kept: int = 0
    errored_dropped: int = 0
    empty_dropped: int = 0
    """Episodes that ended without a single frame (e.g. errored at reset)."""
    aborted: int = 0
    """Episodes begun but never ended before ``close`` (cancellation); never written."""
    parts: list[Path] = field(default_factory=list[Path])


@dataclass
class _OpenEpisode:
    prompt: str
    frames: list[FrameDict] = field(default_factory=list[FrameDict])


@dataclass(frozen=True)
class _FinishedEpisode:
    key: EpisodeKey
    task: str
    frames: list[FrameDict]
    outcome: EpisodeOutcome


def default_repo_id(name: str) -> str:
    """lerobot wants ``owner/name``; local datasets are ``local/<name>`` and are never pushed."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "dataset"
    return f"local/{safe}"


class LeRobotDatasetSink:
    """Writes the episodes it receives into ``root`` as one or more lerobot dataset parts.

    ``root`` must not exist or be empty: a shard is written once, never appended to. Use it as a
    context manager (or call :meth:`close`) so every part is finalized.
    """

    def __init__(
        self,
        contract: Contract | Mapping[str, Any],
        root: Path,
        *,
        options: DatasetOptions | None = None,
        repo_id: str | None = None,
        fps: float | None = None,
        robot_type: str | None = None,
    ) -> None:
        self.options = options or DatasetOptions()
        self.layout = DatasetLayout.build(contract, self.options, fps=fps, robot_type=robot_type)
        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise DatasetWriteError(f"{self.root}: a shard is written once; the directory is not empty")
        self.repo_id = repo_id or default_repo_id(self.root.name)
        self.root.mkdir(parents=True, exist_ok=True)
        self._open: dict[EpisodeKey, _OpenEpisode] = {}
        self._queue: queue.Queue[_FinishedEpisode | None] = queue.Queue(maxsize=self.options.queued_episodes)
        self._lock = threading.Lock()
        self._report = SinkReport()
        self._failure: BaseException | None = None
        self._closed = False
        self._owner = threading.current_thread()
        self._writers = [_PartWriter(self, index) for index in range(self.options.writers)]
        for writer in self._writers:
            writer.start()

    # -- EpisodeSink -------------------------------------------------------------------------

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._check_usable()
        if key in self._open:
            raise SlotStateError(f"episode {key} was begun twice without end()")
        self._open[key] = _OpenEpisode(prompt=prompt or key.job)

    def add(self, key: EpisodeKey, frame: Frame) -> None:
        self._check_usable()
        episode = self._open.get(key)
        if episode is None:
            raise SlotStateError(f"add() for episode {key}, which is not open (begin() it first)")
        if not self.layout.complete:
            self.layout = self.layout.with_shapes_from(frame.observation, frame.action)
        episode.frames.append(self.layout.lerobot_frame(frame))

    def inference(self, key: EpisodeKey, record: Inference) -> None:
        """Inference records belong to traces, not to the dataset."""

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._check_usable()
        episode = self._open.pop(key, None)
        if episode is None:
            raise SlotStateError(f"end() for episode {key}, which is not open")
        if not episode.frames:
            with self._lock:
                self._report.empty_dropped += 1
            return
        if outcome.status is EpisodeStatus.ERRORED:
            with self._lock:
                if not self.layout.keep_errored:
                    self._report.errored_dropped += 1
                    return
                self._report.errored_kept += 1
        self._put(_FinishedEpisode(key=key, task=episode.prompt, frames=episode.frames, outcome=outcome))

    def close(self) -> None:
        """Drop episodes never ended, let the writers drain the queue, finalize every part."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._report.aborted += len(self._open)
        self._open.clear()
        for _ in self._writers:
            self._put(None, closing=True)
        deadline = time.monotonic() + self.options.close_timeout_s
        for writer in self._writers:
            writer.join(max(0.0, deadline - time.monotonic()))
        stuck = [w.name for w in self._writers if w.is_alive()]
        if stuck:
            limit = self.options.close_timeout_s
            raise DatasetWriteError(f"{self.root}: writers {stuck} did not finish within {limit}s")
        with self._lock:
            self._report.parts = sorted(w.part for w in self._writers if w.created)
        if self._failure is not None:
            raise DatasetWriteError(f"{self.root}: a dataset writer failed: {self._failure!r}") from self._failure

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except DatasetWriteError:
            logger.exception("closing %s after %r", self.root, exc)

    # -- state -------------------------------------------------------------------------------

    @property
    def report(self) -> SinkReport:
        with self._lock:
            return replace(self._report, parts=list(self._report.parts))

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_usable(self) -> None:
        if self._closed:
            raise SlotStateError(f"{self.root}: the dataset sink is closed")
        if self._failure is not None:
            raise DatasetWriteError(f"{self.root}: a dataset writer failed: {self._failure!r}") from self._failure

    def _put(self, item: _FinishedEpisode | None, *, closing: bool = False) -> None:
        """Enqueue, waiting while writers are busy, but never on writers that are all gone."""
        while True:
            if not any(w.is_alive() for w in self._writers):
                if closing:
                    return
                raise DatasetWriteError(f"{self.root}: no dataset writer is running") from self._failure
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                if self._failure is not None and not closing:
                    self._check_usable()

    def _next(self) -> tuple[bool, _FinishedEpisode | None]:
        """A writer's next item; ``(False, None)`` when the owner is gone without closing."""
        while True:
            try:
                return True, self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._owner.is_alive():
                    return False, None

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = exc

    def _written(self, frames: int) -> None:
        with self._lock:
            self._report.episodes_written += 1
            self._report.frames_written += frames


class _PartWriter(threading.Thread):
    """Owns one part: creates it on its first episode, writes episodes whole, always finalizes."""

    def __init__(self, sink: LeRobotDatasetSink, index: int) -> None:
        super().__init__(name=f"dataset-writer-{sink.root.name}-{index}", daemon=False)
        self.sink = sink
        self.part = sink.root / f"{PART_PREFIX}{index:03d}"
        self.created = False
        self._dataset: LeRobotDataset | None = None

    def run(self) -> None:
        try:
            # Warm lerobot's import (~11 s) while the sims start, not when the first episode ends.
            import lerobot.datasets.lerobot_dataset  # noqa: F401  # pyright: ignore[reportUnusedImport]

            while True:
                ok, item = self.sink._next()  # pyright: ignore[reportPrivateUsage]
                if not ok or item is None:
                    break
                if self.sink._failure is not None:  # pyright: ignore[reportPrivateUsage]
                    continue
                self._write(item)
        except BaseException as exc:
            logger.exception("dataset writer %s failed", self.name)
            self.sink._failed(exc)  # pyright: ignore[reportPrivateUsage]
            self._drain()
        finally:
            self._finalize()

    def _drain(self) -> None:
        """After a failure keep taking items so producers and close() never wait on this writer."""
        while True:
            ok, item = self.sink._next()  # pyright: ignore[reportPrivateUsage]
            if not ok or item is None:
                return

    def _write(self, episode: _FinishedEpisode) -> None:
        dataset = self._dataset or self._create()
        errored = episode.outcome.status is EpisodeStatus.ERRORED
        flag = np.array([errored], dtype=np.bool_)
        try:
            for frame in episode.frames:
                row: dict[str, Any] = dict(frame)
                row["task"] = episode.task
                if self.sink.layout.keep_errored:
                    row[ERRORED] = flag
                dataset.add_frame(row)
            index = dataset.meta.total_episodes
            dataset.save_episode()
        except BaseException:
            if dataset.has_pending_frames():
                dataset.clear_episode_buffer()
            raise
        self._record(index, episode)
        self.sink._written(len(episode.frames))  # pyright: ignore[reportPrivateUsage]

    def _create(self) -> LeRobotDataset:
        from lerobot.configs import RGBEncoderConfig
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        _quiet_libraries()
        options = self.sink.options
        encoder = RGBEncoderConfig(
            vcodec=options.codec.value, preset="ultrafast" if options.codec is VideoCodec.H264 else None
        )
        layout = self.sink.layout
        self._dataset = LeRobotDataset.create(
            repo_id=self.sink.repo_id,
            fps=layout.fps,
            features=layout.lerobot_features(),
            root=self.part,
            robot_type=layout.robot_type,
            use_videos=layout.uses_video,
            rgb_encoder=encoder,
        )
        self.created = True
        return self._dataset

    def _record(self, index: int, episode: _FinishedEpisode) -> None:
        outcome = episode.outcome
        line = {
            "episode_index": index,
            "trace_id": episode.key.trace_id,
            **asdict(episode.key),
            "status": outcome.status.value,
            "success": outcome.success,
            "score": outcome.score,
            "total_reward": outcome.total_reward,
            "steps": outcome.steps,
            "frames": len(episode.frames),
            "task_prompt": episode.task,
        }
        with (self.part / EPISODES_SIDECAR).open("a") as sidecar:
            sidecar.write(json.dumps(line) + "\n")

    def _finalize(self) -> None:
        dataset, self._dataset = self._dataset, None
        if dataset is None:
            return
        try:
            if dataset.has_pending_frames():
                dataset.clear_episode_buffer()
            dataset.finalize()
        except BaseException as exc:
            logger.exception("finalizing %s failed", self.part)
            self.sink._failed(exc)  # pyright: ignore[reportPrivateUsage]


def _quiet_libraries() -> None:
    """Keep warnings, drop chatter: libav prints a banner per encode and per concatenation at INFO
    (lerobot hands logging back to libav's own printer), ``datasets`` a progress bar per episode."""
    import av.logging
    import datasets

    av.logging.set_libav_level(av.logging.WARNING)
    datasets.disable_progress_bars()
