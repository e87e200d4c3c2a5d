"""The video files of a canonical layout (:mod:`.canonical`): each camera's episodes re-muxed in dataset order.

A merged dataset's video files hold the episodes in the order the writers met them, each episode a
run of packets encoded on its own (it starts on a key frame). The layout copies each episode's
packets, without decoding them, into new files in the dataset's order, so the same seeds give the
same video files however they were scheduled:

- an episode's packets are found by presentation time, between its ``from_timestamp`` and
  ``to_timestamp`` (half a frame of slack each side), after a seek to its key frame;
- in the new file its timestamps are shifted to follow the episodes before it, and its
  ``from_timestamp`` and ``to_timestamp`` are those times in the stream's time base, so they do not
  depend on float sums of earlier durations;
- every episode is decoded as far ahead of its first frame as the camera's most delayed one (a codec
  that reorders frames delays long episodes and not one- or two-frame ones), so decoding times rise
  through the file and seeking finds every episode the same way;
- a new file starts when the next episode's packets would take the current one to
  ``video_files_size_in_mb`` (lerobot's rule for its writer), a new chunk every ``chunks_size``
  files; the files are muxed as lerobot's concatenation muxes them (the first source's stream as
  template, ``faststart``);
- an episode must yield one packet per row, starting on a key frame, or the layout stops with an
  error naming the file and the episode's times.

One episode's packets are held at a time, and a source file is closed after its last episode (at
most :data:`OPEN_SOURCES` open at once), so memory stays flat in the episodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from hud_pipelines.dataset.layout_rows import ChunkFile, Rotation
from hud_pipelines.errors import DatasetWriteError


@dataclass(frozen=True)
class EpisodeVideo:
    """Where one episode's frames lie in a source video file: the file, ``(from_timestamp, to_timestamp)``, and
    how many frames (rows) the episode has."""

    path: Path
    seconds: tuple[float, float]
    frames: int


@dataclass(frozen=True)
class PlacedVideo:
    """Where one episode's frames lie in the new video files: the file, and ``(from_timestamp, to_timestamp)``."""

    at: ChunkFile
    seconds: tuple[float, float]


OPEN_SOURCES = 16
"""Source files kept open at once: each holds its file's whole index (tens of bytes a frame) and a descriptor."""


def remux_in_order(
    episodes: list[EpisodeVideo], target: Callable[[ChunkFile], Path], *, max_mb: float, chunk_size: int
) -> list[PlacedVideo]:
    """Each episode's packets, in the order given, in files ``target(at)`` rotated as lerobot's writer
    rotates them; where each episode now lies."""
    placed: list[PlacedVideo] = []
    rotation = Rotation(max_mb, chunk_size)
    delay = _decoding_delay(episodes)
    sources = _Sources([episode.path for episode in episodes])
    try:
        out: _Output | None = None
        try:
            for index, episode in enumerate(episodes):
                stream, packets = sources.episode_packets(episode)
                at, fresh = rotation.place(sum(packet.size for packet in packets))
                if out is None or fresh:
                    if out is not None:
                        closing, out = out, None  # closed once, whatever its close raises
                        closing.close()
                    path = target(at)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    out = _Output(path, stream)
                start, end = out.append(stream, packets, episode, delay)
                placed.append(PlacedVideo(at, (float(start), float(end))))
                sources.used(index)
        finally:
            if out is not None:
                out.close()
    finally:
        sources.close()
    return placed


def _decoding_delay(episodes: list[EpisodeVideo]) -> int:
    """How far ahead of its first frame's time the longest-delayed episode is decoded (in the stream's time
    base): 0 for a codec that does not reorder frames (h264 as written here, AV1)."""
    sources = _Sources([episode.path for episode in episodes])
    try:
        delay = 0
        for index, episode in enumerate(episodes):
            first = sources.first_packet(episode)
            delay = max(delay, first.pts - first.dts)
            sources.used(index)
        return delay
    finally:
        sources.close()


class _Sources:
    """The source files of the episodes, read in the order given: each opened when an episode needs it, closed
    after its last episode, and at most :data:`OPEN_SOURCES` open at once. When one more must open, the file
    needed again latest closes: the whole order is known, so the fewest files are opened again."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = paths
        self._next_use = [len(paths)] * len(paths)
        """For each episode, the next one that reads its file (``len(paths)``: none)."""
        later: dict[Path, int] = {}
        for index in reversed(range(len(paths))):
            self._next_use[index] = later.get(paths[index], len(paths))
            later[paths[index]] = index
        self._open: dict[Path, Any] = {}
        self._due: dict[Path, int] = {}
        """For each open file but the one being read, the next episode that reads it."""

    def episode_packets(self, episode: EpisodeVideo) -> tuple[Any, list[Any]]:
        """The video stream of the episode's file, and the episode's packets in decode order."""
        stream, read = self._read(episode)
        packets = list(read)
        if len(packets) != episode.frames:
            raise DatasetWriteError(f"{_where(episode)} has {len(packets)} video frames for its {episode.frames} rows")
        return stream, packets

    def first_packet(self, episode: EpisodeVideo) -> Any:
        """The episode's first packet in decode order (its key frame)."""
        return next(self._read(episode)[1])

    def _read(self, episode: EpisodeVideo) -> tuple[Any, Iterator[Any]]:
        """The episode's packets, by presentation time, from a seek to its key frame; the first is checked."""
        container = self._container(episode.path)
        stream: Any = container.streams.video[0]
        base = Fraction(stream.time_base)
        frame = _frame_ticks(episode, base)
        low = Fraction(episode.seconds[0]) / base - frame / 2
        high = Fraction(episode.seconds[1]) / base - frame / 2
        container.seek(max(0, int(low)), stream=stream, backward=True, any_frame=False)

        def packets() -> Iterator[Any]:
            for packet in container.demux(stream):
                if packet.pts is None or packet.dts is None:
                    continue  # the demuxer's flush packet
                if packet.pts >= high:
                    return
                if packet.pts >= low:
                    yield packet

        read = packets()
        first = next(read, None)
        if first is None or not first.is_keyframe:
            raise DatasetWriteError(f"{_where(episode)} starts on no key frame")
        return stream, itertools.chain([first], read)

    def used(self, index: int) -> None:
        """Episode ``index`` was read: its file closes when no later episode reads it."""
        path, upcoming = self._paths[index], self._next_use[index]
        if upcoming == len(self._paths):
            self._close(path)
        else:
            self._due[path] = upcoming

    def close(self) -> None:
        for path in list(self._open):
            self._close(path)

    def _container(self, path: Path) -> Any:
        import av

        if path in self._open:
            return self._open[path]
        while len(self._open) >= OPEN_SOURCES:
            self._close(max(self._due, key=self._due.__getitem__))
        container = self._open[path] = av.open(str(path))
        return container

    def _close(self, path: Path) -> None:
        self._due.pop(path, None)
        self._open.pop(path).close()


def _where(episode: EpisodeVideo) -> str:
    return f"{episode.path}: the episode at {episode.seconds[0]:.6f}-{episode.seconds[1]:.6f} s"


def _frame_ticks(episode: EpisodeVideo, base: Fraction) -> Fraction:
    """One frame's duration in time base ``base``, from the episode's own span: a stream's average rate is not
    always the frame rate (lerobot's depth files report one from their decoding times)."""
    return (Fraction(episode.seconds[1]) - Fraction(episode.seconds[0])) / base / max(1, episode.frames)


class _Output:
    """One new video file: episodes appended one after another on its time line."""

    def __init__(self, path: Path, template: Any) -> None:
        import av

        self._container: Any = av.open(str(path), mode="w", options={"movflags": "faststart"})
        try:
            self._stream = self._container.add_stream_from_template(template=template, opaque=True)
        except BaseException:
            self._container.close()
            raise
        self._stream.time_base = template.time_base
        self._base = Fraction(template.time_base)
        self._next = 0
        """The presentation time (in the stream's time base) the next episode starts at."""

    def append(self, source: Any, packets: list[Any], episode: EpisodeVideo, delay: int) -> tuple[Fraction, Fraction]:
        """The episode's packets at the end of the file; its start and end in seconds.

        Every episode is decoded ``delay`` ahead of its first frame's time. A codec that reorders frames (x265 as
        lerobot sets it for depth maps; the parts here turn that off) decodes a long episode two frames ahead and
        a one- or two-frame episode not ahead at all: laid side by side as they are, a long episode's first
        packet would be decoded before the short one's last (the muxer refuses the file), and a file that starts
        with a short episode would not shift its index by the delay, so a seek to a long episode's first frame
        would land after it."""
        if Fraction(source.time_base) != self._base:
            raise DatasetWriteError(
                f"{episode.path}: time base {source.time_base} differs from {self._base} of the episodes before"
            )
        length = round((Fraction(episode.seconds[1]) - Fraction(episode.seconds[0])) / self._base)
        first = min(packet.pts for packet in packets)
        start = self._next
        shift = start - first
        earlier = delay - (first - packets[0].dts)  # how much earlier than its own delay it is decoded
        for packet in packets:
            packet.pts += shift
            packet.dts += shift - earlier
            packet.stream = self._stream
            self._container.mux(packet)
        self._next = start + length
        return start * self._base, self._next * self._base

    def close(self) -> None:
        self._container.close()
