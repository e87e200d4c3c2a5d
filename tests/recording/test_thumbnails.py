"""Thumbnail strips: the last frame of a video, and rows of tiles scaled into one PNG."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from hud_pipelines.recording.thumbnails import as_uint8_rgb, last_frame, strip_png
from hud_pipelines.recording.video import Mp4Writer

RED, GREEN, BLUE = (220, 30, 30), (30, 220, 30), (30, 30, 220)


def _video(path: Path, colors: list[tuple[int, int, int]]) -> Path:
    writer = Mp4Writer(path, width=32, height=24, fps=Fraction(10), codecs=("libx264", "mpeg4"))
    for color in colors:
        writer.write(np.full((24, 32, 3), color, dtype=np.uint8))
    writer.finish()
    return path


def test_the_last_frame_of_a_video_is_its_last_written_frame(tmp_path: Path) -> None:
    for colors in ([RED, GREEN, BLUE], [BLUE, BLUE, RED]):
        frame = last_frame(_video(tmp_path / "clip.mp4", colors))
        assert frame is not None
        assert frame.shape == (24, 32, 3)
        mean = frame.reshape(-1, 3).mean(axis=0)
        assert np.abs(mean - np.array(colors[-1])).max() < 12, (mean, colors[-1])  # a lossy codec


def test_a_file_that_is_not_a_video_has_no_last_frame(tmp_path: Path) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    assert last_frame(broken) is None
    assert last_frame(tmp_path / "missing.mp4") is None


def test_a_strip_has_a_row_per_group_scaled_to_the_height_and_skips_empty_groups() -> None:
    wide = np.full((10, 40, 3), RED, dtype=np.uint8)
    square = np.full((20, 20, 3), BLUE, dtype=np.uint8)
    png = strip_png([[wide, square], [], [square]], height=16)
    assert png is not None
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape == (32, 64 + 2 + 16, 3), "two rows of 16 px; the first: 64 + gap 2 + 16 px wide"
    assert tuple(image[8, 30]) == RED
    assert tuple(image[8, 70]) == BLUE
    assert tuple(image[24, 8]) == BLUE
    assert tuple(image[24, 40]) == (0, 0, 0), "the shorter row is padded"
    assert strip_png([[], []], height=16) is None


def test_frames_of_any_layout_become_displayable_rgb() -> None:
    chw = np.zeros((3, 4, 5), dtype=np.float32)
    chw[2] = 1.0  # blue, floats in [0, 1]
    assert as_uint8_rgb(chw).shape == (4, 5, 3)
    assert tuple(as_uint8_rgb(chw)[0, 0]) == (0, 0, 255)
    depth = np.array([[0.0, 2.0], [4.0, 4.0]], dtype=np.float32)  # one channel of any range
    assert as_uint8_rgb(depth)[..., 0].tolist() == [[0, 128], [255, 255]]
    assert tuple(as_uint8_rgb(np.full((2, 2, 3), 200, dtype=np.uint8))[0, 0]) == (200, 200, 200)
