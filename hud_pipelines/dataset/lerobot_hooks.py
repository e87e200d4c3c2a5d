"""Hooks into lerobot's ``save_episode``: two make it cheaper and leave its files as lerobot writes them, one
makes the stats of a one-frame episode merge with the others.

A part writes through lerobot's public ``LeRobotDataset`` calls (``create``, ``add_frame``,
``save_episode``, ``finalize``). Profiled on a 96x96 camera, most of that time was not spent on the
data but on two fixed costs (``bench/dataset.md``), which these hooks remove:

- **Camera frames through temporary PNGs.** :func:`in_memory_video_dataset` is ``LeRobotDataset``
  with one override: the factory of its streaming video encoder (``_build_streaming_encoder``)
  returns an :class:`~.episode_video.EpisodeVideoEncoder`, which encodes each episode's frames
  from memory and returns the stats lerobot's default path would compute from its PNGs. Only our
  parts use the subclass; it is used only for RGB video cameras (depth goes lerobot's own way).
- **Row-by-row embedding.** ``save_episode`` passes each episode's rows through
  ``embed_images``, a ``datasets.map`` of ``embed_table_storage`` *one row at a time*, even when no
  column holds an image to embed (video cameras are not columns). :func:`whole_episode_embedding`
  makes that one call per episode, and no call when no column needs embedding: the table is the
  same either way (``embed_table_storage`` works column-wise). It replaces
  ``lerobot.datasets.dataset_writer.embed_images`` once, with a function that does exactly what
  lerobot's does unless the calling thread is inside ``whole_episode_embedding()``, so other
  lerobot users in the process are unaffected.

``tests/dataset/test_dataset_fast_path.py`` writes the same episodes both ways and compares rows,
stats and video frame counts.

- **A one-frame episode's stats.** lerobot takes the ``min`` and ``max`` of a feature over an episode
  of one frame in the feature's own dtype, and of a longer one as a float: a boolean feature
  (``next.done``, the ``errored`` flag) then gets ``bool`` stats in one episode and float ones in
  the others, and lerobot's own merge of parts (``aggregate_datasets``) fails on the mix ("Cannot mix
  NumPy dtypes float64 and bool"), so an episode that ended at its first step, alone in its part,
  failed the whole dataset. Inside :func:`uniform_episode_stats` such stats are ``float64`` (any float
  merges with the others). The hook calls lerobot's ``compute_episode_stats`` itself (through
  :mod:`.lerobot_api`), not whatever ``dataset_writer`` held before it was installed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from hud_pipelines.dataset.episode_video import EpisodeVideoEncoder
from hud_pipelines.dataset.lerobot_api import Stats, embed_table_storage, episode_stats, needs_embedding

if TYPE_CHECKING:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

_WHOLE_EPISODE = contextvars.ContextVar("hud_whole_episode_embedding", default=False)
_UNIFORM_STATS = contextvars.ContextVar("hud_uniform_episode_stats", default=False)
_INSTALL_LOCK = threading.Lock()
_hook_installed = False
"""Whether ``embed_images`` and ``compute_episode_stats`` are wrapped already (once per process: a second
wrap would nest)."""


@functools.cache
def in_memory_video_dataset() -> type[LeRobotDataset]:
    """``LeRobotDataset`` whose streaming encoder is an :class:`EpisodeVideoEncoder`.

    Create it with ``streaming_encoding=True``; every other argument means what it means to lerobot.
    """
    from lerobot.configs import DepthEncoderConfig, RGBEncoderConfig, rgb_encoder_defaults
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    class InMemoryVideoDataset(LeRobotDataset):
        @staticmethod
        def _build_streaming_encoder(
            fps: int,
            rgb_encoder: RGBEncoderConfig | None,
            depth_encoder: DepthEncoderConfig | None,
            encoder_queue_maxsize: int,
            encoder_threads: int | None,
        ) -> Any:
            return EpisodeVideoEncoder(fps, rgb_encoder or rgb_encoder_defaults(), encoder_threads)

    return InMemoryVideoDataset


def check_in_memory_video(dataset: LeRobotDataset) -> None:
    """Fail loudly if lerobot no longer builds its streaming encoder through the overridden factory.

    Otherwise a lerobot upgrade would silently bring back its own streaming encoder, which may drop frames.
    """
    encoder = getattr(dataset.writer, "_streaming_encoder", None)
    if not isinstance(encoder, EpisodeVideoEncoder):
        raise TypeError(
            f"lerobot's writer uses {type(encoder).__name__} instead of EpisodeVideoEncoder: "
            "LeRobotDataset._build_streaming_encoder is no longer the factory of its streaming encoder"
        )


@contextlib.contextmanager
def whole_episode_embedding() -> Generator[None]:
    """Within this block (this thread only), ``save_episode`` embeds an episode's rows in one call."""
    with _hooked(_WHOLE_EPISODE):
        yield


@contextlib.contextmanager
def uniform_episode_stats() -> Generator[None]:
    """Within this block (this thread only), ``save_episode`` gives a one-frame episode ``float64`` stats, as
    it gives a longer one."""
    with _hooked(_UNIFORM_STATS):
        yield


@contextlib.contextmanager
def _hooked(flag: contextvars.ContextVar[bool]) -> Generator[None]:
    _install_hooks()
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def as_float_stats(stats: Stats) -> Stats:
    """``stats`` with every boolean array (a one-frame episode's ``min`` or ``max``) as ``float64``."""
    return {
        feature: {name: value.astype(np.float64) if _is_bool_array(value) else value for name, value in by.items()}
        for feature, by in stats.items()
    }


def _is_bool_array(value: object) -> bool:
    return str(getattr(value, "dtype", "")) == "bool"  # a numpy array of booleans (numpy scalars have no place here)


def embed_whole_episode(dataset: Any) -> Any:
    """``embed_images`` in one batch, or not at all when no column holds something to embed."""
    if not any(needs_embedding(feature) for feature in dataset.features.values()):
        return dataset
    format_ = dataset.format
    return dataset.with_format("arrow").map(embed_table_storage, batched=True).with_format(**format_)


def _install_hooks() -> None:
    from lerobot.datasets import dataset_writer

    global _hook_installed
    with _INSTALL_LOCK:
        if _hook_installed:
            return
        original: Callable[[Any], Any] = dataset_writer.embed_images

        def embed_images(dataset: Any) -> Any:
            return embed_whole_episode(dataset) if _WHOLE_EPISODE.get() else original(dataset)

        def compute_episode_stats(episode_data: Any, features: Any) -> Stats:  # as save_episode calls it
            stats = episode_stats(episode_data, features)  # lerobot's own
            return as_float_stats(stats) if _UNIFORM_STATS.get() else stats

        dataset_writer.embed_images = embed_images
        dataset_writer.compute_episode_stats = compute_episode_stats
        _hook_installed = True
