"""A recording sink whose failure stays its own: what is recorded never decides how an episode ended.

Episodes are graded before any sink hears of them (:mod:`hud_pipelines.agent.episodes`), so a sink
that fails (a dataset writer on a full disk, a codec that refuses a frame, a trace file that cannot
be written) must not error episodes that ran to their end, nor stop their instance, nor be counted
as the env's fault. A :class:`ContainedSink` takes the failure instead: it logs it once, stops
forwarding, still closes the sink it holds (so what was written is finalized), and keeps the reason
(:attr:`ContainedSink.failure`) for whoever publishes what the sink wrote to say it is incomplete.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, FrameBatch, InferenceBatch

log = logging.getLogger(__name__)


class ContainedSink:
    """``sink``, whose first exception ends its recording but nothing else; ``what`` it records (``traces``),
    ``where`` (the instance) name it in the log."""

    def __init__(self, sink: EpisodeSink, what: str, where: str = "") -> None:
        self.sink = sink
        self.what = what
        self.where = where
        self.failure: str | None = None
        """Why the sink stopped recording (``None`` while it records)."""

    @classmethod
    def built(cls, make: Callable[[], EpisodeSink], what: str, where: str = "") -> ContainedSink:
        """The sink ``make`` builds, contained; one that fails to build (a full disk, a layout the contract does
        not allow) is a sink failed from the start, which records nothing, instead of an error of the instance."""
        try:
            return cls(make(), what, where)
        except Exception as exc:
            contained = cls(_RecordsNothing(), what, where)
            contained._failed(exc)
            return contained

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._forward(lambda: self.sink.begin(key, prompt))

    def add_frames(self, batch: FrameBatch) -> None:
        self._forward(lambda: self.sink.add_frames(batch))

    def add_inferences(self, batch: InferenceBatch) -> None:
        self._forward(lambda: self.sink.add_inferences(batch))

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._forward(lambda: self.sink.end(key, outcome))

    def close(self) -> None:
        """Close the sink it holds, failed or not: a writer finalizes what it had written."""
        try:
            self.sink.close()
        except Exception as exc:
            self._failed(exc)

    def _forward(self, call: Callable[[], None]) -> None:
        if self.failure is not None:
            return
        try:
            call()
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if self.failure is None:
            cause: BaseException = exc
            while cause.__cause__ is not None:  # a writer's error wraps what failed (a full disk, a codec)
                cause = cause.__cause__
            self.failure = f"{type(cause).__name__}: {cause}"
            said = "%s: the %s stopped recording, the episodes' grades stand: %s"
            log.error(said, self.where, self.what, self.failure)


class _RecordsNothing:
    """What a sink that failed to build holds instead."""

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        del key, prompt

    def add_frames(self, batch: FrameBatch) -> None:
        del batch

    def add_inferences(self, batch: InferenceBatch) -> None:
        del batch

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        del key, outcome

    def close(self) -> None:
        pass
