"""Frames at the even size 4:2:0 video needs: the one padding rule of trace and dataset videos.

4:2:0 chroma (``yuv420p``, what traces and lerobot's RGB videos are written with) halves the
resolution of colour, so a frame's height and width must be even; ``libx264`` refuses to open at an
odd size. :class:`~hud_pipelines.recording.video.Mp4Writer` pads every frame it writes, and the
dataset stores its RGB video cameras padded the same way
(:class:`~hud_pipelines.dataset.fields.CameraField`), so the shape a dataset declares is the one
lerobot decodes. Kept apart from :mod:`.video` so the dataset's layout can use it without
importing PyAV (the Dagster code location loads that layout).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def even_size(height: int, width: int) -> tuple[int, int]:
    """The size a video of ``height`` x ``width`` frames has: each odd dimension one pixel larger."""
    return height + height % 2, width + width % 2


def pad_to_even[T: np.generic](image: npt.NDArray[T]) -> npt.NDArray[T]:
    """An ``HW`` or ``HWC`` image at :func:`even_size`: an odd height gets its last row again, an odd
    width its last column (edge padding adds no colour the camera did not see); contiguous, as PyAV wants."""
    pad_h, pad_w = image.shape[0] % 2, image.shape[1] % 2
    if pad_h or pad_w:
        image = np.pad(image, [(0, pad_h), (0, pad_w)] + [(0, 0)] * (image.ndim - 2), mode="edge")
    return np.ascontiguousarray(image)
