"""Camera video through PyAV's bundled FFmpeg: the one mp4 writer, and a trace's per-camera videos.

:class:`Mp4Writer` is the project's only place that drives PyAV: one video stream, one ``pts`` per
frame, the first usable codec of a list. Traces use it through :class:`CameraVideo`; the dataset's
episode videos (:mod:`hud_pipelines.dataset.episode_video`) use it with lerobot's codec options.

For traces, H.264 (``libx264``) plays everywhere; ``mpeg4`` is the fallback when the FFmpeg build lacks it.
Frames are handed to one :class:`VideoEncoder` thread (FFmpeg encodes without the GIL), so the agent
loop only copies a frame; the queue is bounded, so an encoder that falls behind slows the loop down
instead of filling memory. Each stream encodes single-threaded so it does not compete with the sims
for cores. Gray images are expanded to RGB.

Odd image sizes are padded by one edge pixel (:mod:`.even_frames`: 4:2:0 chroma needs even
dimensions); :class:`Mp4Writer` pads every frame, so neither a trace nor a dataset video can hit
libx264's refusal to open at an odd size.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import av
import numpy as np
import numpy.typing as npt
from av.container import OutputContainer

from hud_pipelines.recording.even_frames import even_size, pad_to_even

log = logging.getLogger(__name__)
CODECS = ("libx264", "mpeg4")


QUEUED_FRAMES = 256
"""Frames waiting for the encoder at most (a few MB of camera frames) before ``add`` waits."""


class Mp4Writer:
    """One mp4 file holding one video stream, written frame by frame (RGB ``HWC`` uint8 frames).

    ``codecs`` are tried in order; the first that FFmpeg builds is used (:attr:`codec`). Frames get
    consecutive ``pts`` in a time base of one frame. ``write`` and ``finish`` return the packets
    they muxed, so a caller can tell that every frame reached the file. An odd ``width`` or
    ``height`` makes a video one pixel larger (:func:`even_size`), its frames padded to match.
    """

    def __init__(
        self,
        path: Path,
        *,
        width: int,
        height: int,
        fps: Fraction | int,
        codecs: Sequence[str],
        pix_fmt: str = "yuv420p",
        options: Mapping[str, str] | None = None,
        threads: int | None = None,
    ) -> None:
        self.path = path
        self.frames = 0
        self._time_base = 1 / Fraction(fps)
        self._container: OutputContainer = av.open(str(path), mode="w")
        try:
            self.codec, self._stream = self._add_stream(codecs, fps, dict(options or {}))
        except BaseException:
            self._container.close()
            raise
        self._stream.height, self._stream.width = even_size(height, width)
        self._stream.pix_fmt = pix_fmt
        self._stream.time_base = self._time_base
        if threads is not None:
            self._stream.codec_context.thread_count = threads

    def _add_stream(
        self, codecs: Sequence[str], fps: Fraction | int, options: dict[str, str]
    ) -> tuple[str, av.VideoStream]:
        last: Exception | None = None
        for codec in codecs:
            try:
                stream = self._container.add_stream(codec, rate=fps, options=options)
            except Exception as exc:  # PyAV raises its own error types for an encoder it lacks
                last = exc
                continue
            if isinstance(stream, av.VideoStream):
                return codec, stream
            last = ValueError(f"{codec} is not a video codec")
        raise RuntimeError(f"no usable video encoder among {tuple(codecs)}: {last}")

    def write(self, rgb: npt.NDArray[np.uint8]) -> int:
        """Encode one frame; returns the packets muxed (an encoder may hold some frames back)."""
        frame = av.VideoFrame.from_ndarray(pad_to_even(rgb), format="rgb24")
        frame.pts = self.frames
        frame.time_base = self._time_base
        self.frames += 1
        packets = self._stream.encode(frame)
        self._container.mux(packets)
        return len(packets)

    def finish(self) -> int:
        """Flush the encoder and close the file; returns the packets the flush muxed."""
        try:
            packets = self._stream.encode()
            self._container.mux(packets)
            return len(packets)
        finally:
            self._container.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self._container.close()


class VideoEncoder:
    """One daemon thread that runs encode work in submission order (shared by a recorder's videos).

    :meth:`stop` ends the thread once its work is done. A recorder lives for one instance, so an
    eval makes one per instance: a thread left running would keep its memory (the codec's buffers
    stay in that thread's malloc arena), and the parent's memory would grow with the instances.
    """

    def __init__(self) -> None:
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=QUEUED_FRAMES)
        self._thread = threading.Thread(target=self._run, name="hud-video-encoder", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        self._work.put(work)

    def wait(self, work: Callable[[], None]) -> None:
        """Run ``work`` after everything submitted before it, and wait until it has run."""
        done = threading.Event()
        errors: list[BaseException] = []

        def then() -> None:
            try:
                work()
            except BaseException as exc:  # handed back to the waiting caller
                errors.append(exc)
            finally:
                done.set()

        self._work.put(then)
        done.wait()
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Run everything submitted so far, then end the thread (and wait until it has ended)."""
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:  # a frame that cannot be encoded costs that video, never the episode
                log.exception("video encoding failed")


class CameraVideo:
    """Streams ``HWC`` uint8 frames of one camera into an mp4 file (encoded on ``encoder``'s thread if given)."""

    def __init__(
        self, path: Path, fps: float, *, codec: str | None = None, encoder: VideoEncoder | None = None
    ) -> None:
        self.path = path
        self.fps = fps
        self.codec = codec
        self.frames = 0
        self._encoder = encoder
        self._writer: Mp4Writer | None = None

    def add(self, image: npt.NDArray[Any]) -> None:
        frame = _as_rgb(image)
        self.frames += 1
        if self._encoder is None:
            self._encode(frame)
        else:
            # the caller's buffer changes on the next step: the encoder gets its own copy
            owned = frame.copy() if np.shares_memory(frame, np.asarray(image)) else frame
            self._encoder.submit(lambda: self._encode(owned))

    def _encode(self, frame: npt.NDArray[np.uint8]) -> None:
        if self._writer is None:
            self._writer = self._open(frame.shape[1], frame.shape[0])
        self._writer.write(frame)

    def close(self) -> None:
        """Flush and close the file (after every frame added so far is encoded)."""
        if self._encoder is None:
            self._finish()
        else:
            self._encoder.wait(self._finish)

    def _finish(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.finish()

    def _open(self, width: int, height: int) -> Mp4Writer:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = Mp4Writer(
            self.path,
            width=width,
            height=height,
            fps=Fraction(self.fps).limit_denominator(1000),
            codecs=(self.codec,) if self.codec else CODECS,
            threads=1,  # one thread per stream: the sims need the cores
        )
        self.codec = writer.codec
        return writer


def _as_rgb(image: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.clip(array, 0, 255).astype(np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    elif array.shape[-1] == 4:
        array = array[:, :, :3]
    return np.ascontiguousarray(array)
