"""Per-camera video of one trace, encoded off the stepping path (PyAV's bundled FFmpeg).

H.264 (``libx264``) plays everywhere; ``mpeg4`` is the fallback when the FFmpeg build lacks it.
Frames are handed to one :class:`VideoEncoder` thread (FFmpeg encodes without the GIL), so the agent
loop only copies a frame; the queue is bounded, so an encoder that falls behind slows the loop down
instead of filling memory. Each stream encodes single-threaded so it does not compete with the sims
for cores. Odd image sizes are padded by one pixel (4:2:0 chroma needs even dimensions); gray
images are expanded to RGB.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)
CODECS = ("libx264", "mpeg4")


QUEUED_FRAMES = 256
"""Frames waiting for the encoder at most (a few MB of camera frames) before ``add`` waits."""


class VideoEncoder:
    """One daemon thread that runs encode work in submission order (shared by a recorder's videos)."""

    def __init__(self) -> None:
        self._work: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=QUEUED_FRAMES)
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

    def _run(self) -> None:
        while True:
            work = self._work.get()
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
        self._container: Any = None
        self._stream: Any = None

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
        if self._stream is None:
            self._open(frame.shape[1], frame.shape[0])
        stream: Any = self._stream
        video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
        for packet in stream.encode(video_frame):
            self._container.mux(packet)

    def close(self) -> None:
        """Flush and close the file (after every frame added so far is encoded)."""
        if self._encoder is None:
            self._finish()
        else:
            self._encoder.wait(self._finish)

    def _finish(self) -> None:
        if self._stream is None:
            return
        try:
            for packet in self._stream.encode():
                self._container.mux(packet)
        finally:
            self._container.close()
            self._stream = None
            self._container = None

    def _open(self, width: int, height: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        container: Any = av.open(str(self.path), mode="w")
        rate = Fraction(self.fps).limit_denominator(1000)
        last: Exception | None = None
        for codec in (self.codec,) if self.codec else CODECS:
            try:
                stream: Any = container.add_stream(codec, rate=rate)
            except Exception as exc:  # PyAV raises its own error types for an encoder it lacks
                last = exc
                continue
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            stream.codec_context.thread_count = 1
            self._container, self._stream, self.codec = container, stream, codec
            return
        container.close()
        raise RuntimeError(f"no usable video encoder among {CODECS}: {last}")


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
    pad_h, pad_w = array.shape[0] % 2, array.shape[1] % 2
    if pad_h or pad_w:
        array = np.pad(array, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.ascontiguousarray(array)
