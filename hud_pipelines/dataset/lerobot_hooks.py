"""Two hooks into lerobot's ``save_episode`` that make it cheaper and leave its files as lerobot writes them.

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
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from hud_pipelines.dataset.episode_video import EpisodeVideoEncoder
from hud_pipelines.dataset.lerobot_api import embed_table_storage, needs_embedding

if TYPE_CHECKING:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

_WHOLE_EPISODE = contextvars.ContextVar("hud_whole_episode_embedding", default=False)
_INSTALL_LOCK = threading.Lock()
_hook_installed = False
"""Whether ``embed_images`` is wrapped already (once per process: a second wrap would nest)."""


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
    _install_embedding_hook()
    token = _WHOLE_EPISODE.set(True)
    try:
        yield
    finally:
        _WHOLE_EPISODE.reset(token)


def embed_whole_episode(dataset: Any) -> Any:
    """``embed_images`` in one batch, or not at all when no column holds something to embed."""
    if not any(needs_embedding(feature) for feature in dataset.features.values()):
        return dataset
    format_ = dataset.format
    return dataset.with_format("arrow").map(embed_table_storage, batched=True).with_format(**format_)


def _install_embedding_hook() -> None:
    from lerobot.datasets import dataset_writer

    global _hook_installed
    with _INSTALL_LOCK:
        if _hook_installed:
            return
        original: Callable[[Any], Any] = dataset_writer.embed_images

        def embed_images(dataset: Any) -> Any:
            return embed_whole_episode(dataset) if _WHOLE_EPISODE.get() else original(dataset)

        dataset_writer.embed_images = embed_images
        _hook_installed = True
