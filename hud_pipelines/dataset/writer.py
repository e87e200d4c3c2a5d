"""``LeRobotDatasetSink``: an ``EpisodeSink`` that writes one shard of a LeRobot v3 dataset.

Why it looks like this:

- **Episodes are committed whole.** Slots interleave, but lerobot's writer holds one episode at a
  time, so each slot's frames are buffered (already converted to LeRobot frames) until ``end``;
  only then is the episode handed to a writer, which calls ``add_frame`` for each frame and
  ``save_episode`` once. An errored episode is left out unless ``keep_errored`` (then every frame
  carries ``episode.errored``); an episode never ended (cancellation) is never written.
- **Every row is finite or flagged.** An episode holding NaN or infinity in any number (a sim that
  diverged) is errored whatever its outcome says: left out, or with ``keep_errored`` kept flagged,
  listed with its non-finite keys in ``hud_episodes.jsonl`` and kept out of ``stats.json``
  (:mod:`.part`), so one broken episode never turns the dataset's normalisation stats into NaN.
- **One success.** ``end`` carries the graded outcome, and the episode's ``next.success`` column
  follows it: all false when the outcome failed; when it succeeded, the last frame is true (earlier
  frames keep what the env reported). So ``any(next.success)`` is the grade of every episode.
- **Writing never stalls stepping.** ``add`` converts and buffers (microseconds); ``end`` puts the
  finished episode on a bounded queue of a writer thread (``options.writers``), each writing its own
  *part* (a complete lerobot dataset under ``<root>/part-<i>``) with lerobot in this process. The
  writers take episodes in turn (the k-th to end goes to writer k mod writers), never whichever is
  free first, so a part holds the same episodes on every run. (A child
  process per part was measured too and never paid for its start-up, pipe and merge:
  ``bench/dataset.md``.) The queue bounds keep memory flat whatever the number of episodes: at most
  slots x episode length frames plus ``queued_episodes`` finished episodes (at least one per writer)
  are held; when a writer falls behind, ``end`` waits for it, at most ``close_timeout_s``.
- **finalize always runs.** Each writer finalizes its part when the sink closes, when the writer
  fails, and when the program's main thread ends without closing it. Writers are not daemon
  threads, so an interrupt in the caller still lets them finish the part they hold.
- Episodes of one part keep their end order; publishing merges the parts and lays the episodes out
  by task, then seed (:mod:`.merge`, :mod:`.canonical`), so the dataset is the same whatever the
  writers and slots, and ``meta/hud_episodes.jsonl`` maps every episode back to its ``EpisodeKey``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from hud_pipelines.contract import Contract
from hud_pipelines.dataset.cancel import signals_deferred
from hud_pipelines.dataset.features import DatasetLayout, FrameDict
from hud_pipelines.dataset.fields import lerobot_keys
from hud_pipelines.dataset.part import INFO_FILE, PART_PREFIX, FinishedEpisode, PartWriter
from hud_pipelines.errors import DatasetWriteError, SlotStateError
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus, Frame, PerSlotSink
from hud_pipelines.spec.dataset_options import DatasetOptions

logger = logging.getLogger(__name__)

_POLL_S = 0.5


@dataclass
class SinkReport:
    """What a sink did with the episodes it saw."""

    episodes_written: int = 0
    """Episodes committed to a part."""
    frames_written: int = 0
    errored_kept: int = 0
    """Errored episodes written, flagged by ``episode.errored`` (``keep_errored``)."""
    errored_dropped: int = 0
    empty_dropped: int = 0
    """Episodes that ended without a single frame (e.g. errored at reset)."""
    non_finite: int = 0
    """Episodes holding NaN or infinity; they count as errored (dropped, or kept flagged)."""
    aborted: int = 0
    """Episodes begun but never ended before ``close`` (cancellation); never written."""
    parts: list[Path] = field(default_factory=list[Path])


@dataclass
class _OpenEpisode:
    prompt: str
    frames: list[FrameDict] = field(default_factory=list[FrameDict])
    non_finite: dict[str, int] = field(default_factory=dict[str, int])
    """lerobot key -> index of the first frame where it held NaN or infinity."""


def follow_outcome(frames: list[FrameDict], success: bool) -> None:
    """Make the episode's ``next.success`` column agree with its graded outcome, and its last frame end it (in place).

    A grader may judge an episode successful that the env never called a success (a return
    threshold), or failed that the env did; the dataset must not tell two stories. Every written
    episode ended on its last frame, however it ended (the env, ``max_steps``, a cut at ``close()``
    or a fault): ``next.done`` says so there, as lerobot's own eval records it.
    """
    keys = lerobot_keys()
    frames[-1][keys.done][...] = True
    key = keys.success
    if success:
        frames[-1][key][...] = True
        return
    for frame in frames:
        frame[key][...] = False


def default_repo_id(name: str) -> str:
    """lerobot wants ``owner/name``; local datasets are ``local/<name>`` and are never pushed."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "dataset"
    return f"local/{safe}"


class LeRobotDatasetSink(PerSlotSink):
    """Writes the episodes it receives into ``root`` as one or more lerobot dataset parts.

    ``root`` must not exist or be empty: a shard is written once, never appended to. Use it as a
    context manager (or call :meth:`close`) so every part is finalized. It takes each slot's frame on
    its own (a dataset frame is converted per row anyway); inference records belong to traces, not
    to the dataset.
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
        self._work = _Work(self.options.queued_episodes, self.options.writers)
        self._closed = False
        self._writers = [_WriterThread(self, self._work, index) for index in range(self.options.writers)]
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
        converted = self.layout.lerobot_frame(frame)
        for bad in self.layout.non_finite(frame, converted):
            episode.non_finite.setdefault(bad, frame.index)
        episode.frames.append(converted)

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._check_usable()
        episode = self._open.pop(key, None)
        if episode is None:
            raise SlotStateError(f"end() for episode {key}, which is not open")
        if not episode.frames:
            with self._work.locked():
                self._work.report.empty_dropped += 1
            return
        outcome = self._screen(key, episode, outcome)
        if outcome.status is EpisodeStatus.ERRORED:
            with self._work.locked():
                if not self.layout.keep_errored:
                    self._work.report.errored_dropped += 1
                    return
                self._work.report.errored_kept += 1
        follow_outcome(episode.frames, outcome.success)
        finished = FinishedEpisode(
            key=key, task=episode.prompt, frames=episode.frames, outcome=outcome, non_finite=tuple(episode.non_finite)
        )
        writer = self._writers[self._work.ended % len(self._writers)]
        self._put(finished, writer, deadline=time.monotonic() + self.options.close_timeout_s)
        self._work.ended += 1

    def _screen(self, key: EpisodeKey, episode: _OpenEpisode, outcome: EpisodeOutcome) -> EpisodeOutcome:
        """The outcome the dataset records: errored when the episode holds a non-finite number."""
        if not episode.non_finite:
            return outcome
        where = ", ".join(f"{name} (from step {step})" for name, step in episode.non_finite.items())
        with self._work.locked():
            self._work.report.non_finite += 1
        if outcome.status is EpisodeStatus.ERRORED:
            return outcome
        logger.warning("%s: episode %s holds NaN or infinity in %s; it is recorded as errored", self.root, key, where)
        return replace(outcome, status=EpisodeStatus.ERRORED, success=False, error=f"non-finite values in {where}")

    def close(self) -> None:
        """Drop episodes never ended, let the writers drain the queue, finalize every part."""
        if self._closed:
            return
        self._closed = True
        with self._work.locked():
            self._work.report.aborted += len(self._open)
        self._open.clear()
        deadline = time.monotonic() + self.options.close_timeout_s
        for writer in self._writers:
            self._put(None, writer, deadline=deadline, closing=True)
        for writer in self._writers:
            writer.join(max(0.0, deadline - time.monotonic()))
        stuck = [w.name for w in self._writers if w.is_alive()]
        if stuck:
            limit = self.options.close_timeout_s
            raise DatasetWriteError(f"{self.root}: writers {stuck} did not finish within {limit}s")
        with self._work.locked():
            self._work.report.parts = sorted(w.part.path for w in self._writers if (w.part.path / INFO_FILE).is_file())
        self._raise_if_failed()

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

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until every writer has started (lerobot imported).

        Optional: episodes may end before that and simply wait in the queue. Callers that want
        the start-up off their clock (or off the sims' start-up) wait here first. Returns whether
        all writers were ready in time; a writer that failed to start is raised as an error.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for writer in self._writers:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not writer.ready.wait(remaining):
                return False
        self._check_usable()
        return True

    @property
    def report(self) -> SinkReport:
        with self._work.locked():
            return replace(self._work.report, parts=list(self._work.report.parts))

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_usable(self) -> None:
        if self._closed:
            raise SlotStateError(f"{self.root}: the dataset sink is closed")
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        failure = self._work.failure
        if failure is not None:
            raise DatasetWriteError(f"{self.root}: a dataset writer failed: {failure!r}") from failure

    def _put(
        self, item: FinishedEpisode | None, writer: _WriterThread, *, deadline: float, closing: bool = False
    ) -> None:
        """Enqueue for ``writer``, waiting while it is busy until ``deadline`` (a write that never returns stalls
        no rollout past ``close_timeout_s``), but never on a writer that is gone."""
        while True:
            if not writer.is_alive():
                if closing:
                    return
                raise DatasetWriteError(f"{self.root}: {writer.name} is not running") from self._work.failure
            try:
                with signals_deferred():  # a SIGTERM inside put would leave the queue's lock taken
                    writer.queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                if self._work.failure is not None and not closing:
                    self._check_usable()
                if time.monotonic() >= deadline:
                    if closing:
                        return  # close() names it as a writer that did not finish
                    limit = self.options.close_timeout_s
                    raise DatasetWriteError(f"{self.root}: {writer.name} took no episode for {limit:g} s") from None


class _Work:
    """What a sink shares with its writer threads: the first failure, the report, the episodes handed out."""

    def __init__(self, queued_episodes: int, writers: int) -> None:
        self.queue_bound = max(1, -(-queued_episodes // writers))
        """Each writer's queue: ``queued_episodes`` wait in all (rounded up to a whole number per writer)."""
        self.ended = 0
        """Episodes handed to the writers so far: the next goes to writer ``ended mod writers``."""
        self.lock = threading.Lock()
        self.report = SinkReport()
        self.failure: BaseException | None = None

    @contextlib.contextmanager
    def locked(self) -> Generator[None]:
        """The lock, never left taken by a SIGTERM that lands while it is held (see :mod:`.cancel`)."""
        with signals_deferred(), self.lock:
            yield

    @staticmethod
    def next(work: queue.Queue[FinishedEpisode | None]) -> tuple[bool, FinishedEpisode | None]:
        """A writer's next item from its queue ``work``; ``(False, None)`` when the program ends without closing the
        sink."""
        while True:
            try:
                return True, work.get(timeout=_POLL_S)
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    return False, None

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = exc

    def written(self, frames: int) -> None:
        with self.lock:
            self.report.episodes_written += 1
            self.report.frames_written += frames


class _WriterThread(threading.Thread):
    """Takes finished episodes from the sink's queue and writes them into its part, always finalizing."""

    def __init__(self, sink: LeRobotDatasetSink, work: _Work, index: int) -> None:
        super().__init__(name=f"dataset-writer-{sink.root.name}-{index}", daemon=False)
        self.sink = sink
        self.work = work
        self.part = PartWriter(sink.root / f"{PART_PREFIX}{index:03d}", sink.options, sink.repo_id)
        self.queue: queue.Queue[FinishedEpisode | None] = queue.Queue(maxsize=work.queue_bound)
        self.ready = threading.Event()
        """Set once the part can take episodes (lerobot imported) or failed to."""

    def run(self) -> None:
        try:
            try:
                self.part.start()
            finally:
                self.ready.set()
            while True:
                ok, item = self.work.next(self.queue)
                if not ok or item is None:
                    break
                if self.work.failure is not None:
                    continue
                self.part.write(item, self.sink.layout)
                self.work.written(len(item.frames))
        except BaseException as exc:
            logger.exception("dataset writer %s failed", self.name)
            self.work.failed(exc)
            self._drain()
        finally:
            try:
                self.part.finalize()
            except BaseException as exc:
                logger.exception("finalizing %s failed", self.part.path)
                self.work.failed(exc)

    def _drain(self) -> None:
        """After a failure keep taking items so producers and close() never wait on this writer."""
        while True:
            ok, item = self.work.next(self.queue)
            if not ok or item is None:
                return
