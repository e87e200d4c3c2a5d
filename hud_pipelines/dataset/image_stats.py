"""A camera's episode statistics from the frames in memory, equal to lerobot's own to the last bit.

lerobot's default ``save_episode`` writes every frame as a temporary PNG, then
``compute_episode_stats`` reads back a sample of them (``sample_indices``, downscaled by
``auto_downsample_height_width``) and feeds all their pixels, as float32 rows, to one
``RunningQuantileStats.update``. For a 96x96 camera that is ~1M rows per episode, and
``update`` spends most of its time on min, max and a 5000-bin histogram per channel of float32
values which, for 8-bit pixels, only ever take 256 distinct values.

:func:`episode_image_stats` samples the same frames and computes the same numbers in the same
float types, but the histogram and the extremes come from a per-channel count of the 256 pixel
values (exact: integer counts), and the mean and mean of squares are taken once (lerobot takes
them twice from the same array, which adds exactly zero). The mean reductions are the very numpy
calls lerobot makes on an identically laid out array, so even their float32 rounding is the same.
``tests/dataset/test_dataset_fast_path.py`` proves the equality against lerobot's own function.
Anything but 8-bit pixels goes to lerobot's ``get_feature_stats`` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.dataset.lerobot_api import downsample, feature_stats, sample_indices

_QUANTILE_BINS = 5000
"""``RunningQuantileStats``' default ``num_quantile_bins``."""
_EDGE_PADDING = 1e-10
"""What ``RunningQuantileStats`` widens the first histogram's range by."""
_PIXEL_VALUES = np.arange(256, dtype=np.float32)

Stats = dict[str, npt.NDArray[Any]]


def episode_image_stats(frames: Sequence[npt.NDArray[Any]]) -> Stats:
    """Per-channel stats of one camera over an episode's ``(H, W, C)`` frames, not yet divided by 255.

    The result is what ``RunningQuantileStats.get_statistics`` returns (``min``, ``max``, ``mean``,
    ``std``, quantiles ``q01``..``q99``, each of shape ``(C,)``), with ``count`` the number of
    sampled frames, as ``get_feature_stats`` sets it: the form lerobot's writer expects from a
    streaming encoder, which it then reshapes to ``(C, 1, 1)`` and divides by 255 exactly as its
    default path does.
    """
    # (N, C, H, W) in C order, as lerobot's ``sample_images`` fills it: the float32 sums below round
    # the same way only over the same memory layout (a one-frame episode would differ otherwise)
    sampled = np.ascontiguousarray(
        np.stack([downsample(np.asarray(frames[i]).transpose(2, 0, 1)) for i in sample_indices(len(frames))])
    )
    if sampled.dtype != np.uint8 or sampled.shape[2] * sampled.shape[3] < 2:
        stats = feature_stats(sampled, axis=(0, 2, 3), keepdims=True)
        return {k: v if k == "count" else v.reshape(-1) for k, v in stats.items()}
    return _uint8_stats(sampled)


def _uint8_stats(sampled: npt.NDArray[np.uint8]) -> Stats:
    """``get_feature_stats(sampled, axis=(0, 2, 3))`` for 8-bit pixels, with the same float types."""
    from lerobot.datasets.compute_stats import DEFAULT_QUANTILES

    count, channels = sampled.shape[0], sampled.shape[1]
    rows = sampled.transpose(0, 2, 3, 1).reshape(-1, channels)  # lerobot's layout: one row per pixel
    values = rows.astype(np.float32)
    mean = np.mean(values, axis=0)
    mean_of_squares = np.mean(values**2, axis=0)
    per_channel = np.ascontiguousarray(sampled.transpose(1, 0, 2, 3)).reshape(channels, -1)
    low = per_channel.min(axis=1).astype(np.float32)
    high = per_channel.max(axis=1).astype(np.float32)
    edges: list[npt.NDArray[Any]] = [
        np.linspace(low[i] - _EDGE_PADDING, high[i] + _EDGE_PADDING, _QUANTILE_BINS + 1) for i in range(channels)
    ]
    counts = [np.bincount(per_channel[i], minlength=256).astype(np.float64) for i in range(channels)]
    histograms = [np.histogram(_PIXEL_VALUES, bins=edges[i], weights=counts[i])[0] for i in range(channels)]
    stats: Stats = {
        "min": low,
        "max": high,
        "mean": mean,
        "std": np.sqrt(np.maximum(0, mean_of_squares - mean**2)),
        "count": np.array([count]),
    }
    total = rows.shape[0]
    for q in DEFAULT_QUANTILES:
        stats[f"q{int(q * 100):02d}"] = np.array(
            [_quantile(histograms[i], edges[i], q * total) for i in range(channels)]
        )
    return stats


def _quantile(histogram: npt.NDArray[Any], edges: npt.NDArray[Any], target: float) -> Any:
    """``RunningQuantileStats._compute_single_quantile``: interpolate inside the bin holding ``target``."""
    cumulative = np.cumsum(histogram)
    index = int(np.searchsorted(cumulative, target))
    if index == 0:
        return edges[0]
    if index >= len(cumulative):
        return edges[-1]
    before = cumulative[index - 1]
    inside = cumulative[index] - before
    if inside == 0:
        return edges[index]
    return edges[index] + (target - before) / inside * (edges[index + 1] - edges[index])
