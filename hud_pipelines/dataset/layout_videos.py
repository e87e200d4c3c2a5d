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
- a new file starts when the next episode's packets would take the current one to
  ``video_files_size_in_mb`` (lerobot's rule for its writer), a new chunk every ``chunks_size``
  files; the files are muxed as lerobot's concatenation muxes them (the first source's stream as
  template, ``faststart``).

One episode's packets are held at a time, so memory stays flat in the episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from hud_pipelines.dataset.layout_rows import ChunkFile, Rotation
from hud_pipelines.errors import DatasetWriteError


@dataclass(frozen=True)
class EpisodeVideo:
    """Where one episode's frames lie in a source video file: the file, and ``(from_timestamp, to_timestamp)``."""

    path: Path
    seconds: tuple[float, float]


@dataclass(frozen=True)
class PlacedVideo:
    """Where one episode's frames lie in the new video files: the file, and ``(from_timestamp, to_timestamp)``."""

    at: ChunkFile
    seconds: tuple[float, float]


def remux_in_order(
    episodes: list[EpisodeVideo], target: Callable[[ChunkFile], Path], *, max_mb: float, chunk_size: int
) -> list[PlacedVideo]:
    """Each episode's packets, in the order given, in files ``target(at)`` rotated as lerobot's writer
    rotates them; where each episode now lies."""
    placed: list[PlacedVideo] = []
    rotation = Rotation(max_mb, chunk_size)
    sources = _Sources()
    out: _Output | None = None
    try:
        for episode in episodes:
            stream, packets = sources.episode_packets(episode)
            at, fresh = rotation.place(sum(packet.size for packet in packets))
            if out is None or fresh:
                if out is not None:
                    out.close()
                path = target(at)
                path.parent.mkdir(parents=True, exist_ok=True)
                out = _Output(path, stream)
            start, end = out.append(stream, packets, episode)
            placed.append(PlacedVideo(at, (float(start), float(end))))
    finally:
        if out is not None:
            out.close()
        sources.close()
    return placed


class _Sources:
    """The source files, each opened once and kept open while episodes are read from it."""

    def __init__(self) -> None:
        self._open: dict[Path, Any] = {}

    def episode_packets(self, episode: EpisodeVideo) -> tuple[Any, list[Any]]:
        """The video stream of the episode's file, and the episode's packets in decode order."""
        import av

        container = self._open.get(episode.path)
        if container is None:
            container = self._open[episode.path] = av.open(str(episode.path))
        stream: Any = container.streams.video[0]
        base = Fraction(stream.time_base)
        rate: Fraction | None = stream.average_rate
        frame = 1 / (rate * base) if rate else Fraction(0)
        low = Fraction(episode.seconds[0]) / base - frame / 2
        high = Fraction(episode.seconds[1]) / base - frame / 2
        container.seek(max(0, int(low)), stream=stream, backward=True, any_frame=False)
        packets: list[Any] = []
        for packet in container.demux(stream):
            if packet.pts is None or packet.dts is None:
                continue  # the demuxer's flush packet
            if packet.pts >= high:
                break
            if packet.pts >= low:
                packets.append(packet)
        if not packets or not packets[0].is_keyframe:
            raise DatasetWriteError(
                f"{episode.path}: no key frame starts the episode at {episode.seconds[0]:.6f} s "
                f"(to {episode.seconds[1]:.6f} s)"
            )
        return stream, packets

    def close(self) -> None:
        for container in self._open.values():
            container.close()
        self._open.clear()


class _Output:
    """One new video file: episodes appended one after another on its time line."""

    def __init__(self, path: Path, template: Any) -> None:
        import av

        self._container = av.open(str(path), mode="w", options={"movflags": "faststart"})
        self._stream = self._container.add_stream_from_template(template=template, opaque=True)
        self._stream.time_base = template.time_base
        self._base = Fraction(template.time_base)
        self._next = 0
        """The presentation time (in the stream's time base) the next episode starts at."""

    def append(self, source: Any, packets: list[Any], episode: EpisodeVideo) -> tuple[Fraction, Fraction]:
        """The episode's packets at the end of the file; its start and end in seconds."""
        if Fraction(source.time_base) != self._base:
            raise DatasetWriteError(
                f"{episode.path}: time base {source.time_base} differs from {self._base} of the episodes before"
            )
        length = round((Fraction(episode.seconds[1]) - Fraction(episode.seconds[0])) / self._base)
        shift = self._next - min(packet.pts for packet in packets)
        start = self._next
        for packet in packets:
            packet.pts += shift
            packet.dts += shift
            packet.stream = self._stream
            self._container.mux(packet)
        self._next = start + length
        return start * self._base, self._next * self._base

    def close(self) -> None:
        self._container.close()
