"""Strips of small frames for the Dagster UI: a row per camera (or per group), a column per episode.

Both the dataset asset (the first frame of each of the first episodes) and the report asset (the
last frame of each episode's video: how it ended) show one, as a PNG inline in markdown metadata;
this module is the one place that turns frames into that picture.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

GAP_PX = 2
"""Black pixels between two tiles of a row."""


def as_uint8_rgb(image: Any) -> npt.NDArray[np.uint8]:
    """A frame (HWC or CHW, uint8, float in [0, 1], or one channel of any range) as displayable RGB uint8."""
    array = np.asarray(image.numpy() if hasattr(image, "numpy") else image, dtype=np.float32)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 2:
        array = array[..., None]
    if array.shape[-1] == 1:
        low, high = float(array.min()), float(array.max())
        array = np.repeat((array - low) / (high - low or 1.0), 3, axis=-1)
    elif array.max() > 1.0:
        array = array / 255.0
    return (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def strip_png(rows: Sequence[Sequence[npt.NDArray[np.uint8]]], height: int) -> bytes | None:
    """One PNG of ``rows`` of RGB tiles, each scaled to ``height`` pixels; ``None`` without a tile."""
    from PIL import Image

    drawn = [_row([_resize(tile, height) for tile in tiles]) for tiles in rows if tiles]
    if not drawn:
        return None
    width = max(row.shape[1] for row in drawn)
    strip = np.concatenate([np.pad(row, ((0, 0), (0, width - row.shape[1]), (0, 0))) for row in drawn], axis=0)
    buffer = io.BytesIO()
    Image.fromarray(strip).save(buffer, format="PNG")
    return buffer.getvalue()


def markdown_image(png: bytes, alt: str) -> str:
    """``png`` inline in markdown (what Dagster's markdown metadata renders)."""
    return f"![{alt}]({png_data_uri(png)})"


def png_data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI: an image where markdown has no folder to link to (the Dagster UI)."""
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def last_frame(video: Path) -> npt.NDArray[np.uint8] | None:
    """The last frame of an mp4/webm file as RGB; ``None`` when it has none or cannot be read."""
    import av
    from av.error import FFmpegError

    frame: npt.NDArray[np.uint8] | None = None
    try:
        with av.open(str(video)) as container:
            for decoded in container.decode(video=0):
                frame = np.asarray(decoded.to_ndarray(format="rgb24"), dtype=np.uint8)
    except (FFmpegError, OSError):
        return frame
    return frame


def _resize(tile: npt.NDArray[np.uint8], height: int) -> npt.NDArray[np.uint8]:
    from PIL import Image

    width = max(1, round(tile.shape[1] * height / tile.shape[0]))
    return np.asarray(Image.fromarray(tile).resize((width, height)), dtype=np.uint8)


def _row(tiles: Sequence[npt.NDArray[np.uint8]]) -> npt.NDArray[np.uint8]:
    gap = np.zeros((tiles[0].shape[0], GAP_PX, 3), dtype=np.uint8)
    parts: list[npt.NDArray[np.uint8]] = []
    for tile in tiles:
        parts += [tile, gap]
    return np.concatenate(parts[:-1], axis=1)
