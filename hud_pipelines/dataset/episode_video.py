"""Encode an episode's camera frames from memory, never through temporary PNGs, never dropping one.

lerobot's default writer saves each camera frame as a PNG in ``add_frame``, encodes the episode's
video from those files in ``save_episode`` and reads a sample of them back for the stats. Its
``streaming_encoding`` option avoids the files, but its encoder drops a frame whenever its queue
stays full for 0.1 s (``StreamingVideoEncoder.feed_frame`` warns and goes on), so a busy machine
could silently write a video shorter than the episode's rows; and it computes running stats over
every frame, which costs more than the sampled stats it replaces.

:class:`EpisodeVideoEncoder` takes the streaming encoder's place (same methods, driven by
lerobot's own ``add_frame`` / ``save_episode``; see :mod:`.lerobot_hooks`). ``feed_frame`` keeps a
reference to the frame, which the part already holds for the whole episode, so it never waits and
never drops; ``finish_episode`` encodes all of them with the dataset's codec settings (the same
stream set-up as lerobot's streaming encoder, one ``pts`` per frame, through the project's one
:class:`~hud_pipelines.recording.video.Mp4Writer`) and returns the stats of
:func:`.image_stats.episode_image_stats`, equal to those lerobot's default path computes from its
PNGs. It refuses to finish an episode whose video would not hold exactly one frame per row.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from hud_pipelines.dataset.image_stats import Stats, episode_image_stats
from hud_pipelines.errors import EpisodeVideoError

if TYPE_CHECKING:
    from lerobot.configs import RGBEncoderConfig


class EpisodeVideoEncoder:
    """One episode at a time: collect each camera's frames, encode them all when the episode is saved."""

    def __init__(self, fps: int, encoder: RGBEncoderConfig, encoder_threads: int | None = None) -> None:
        self.fps = fps
        self.encoder = encoder
        self.encoder_threads = encoder_threads
        self._frames: dict[str, list[npt.NDArray[Any]]] = {}
        self._temp_dir: Path | None = None

    def start_episode(self, video_keys: list[str], temp_dir: Path, depth_video_keys: list[str] | None = None) -> None:
        if depth_video_keys:
            raise EpisodeVideoError(f"depth cameras {depth_video_keys} are encoded by lerobot's own writer")
        self._frames = {key: [] for key in video_keys}
        self._temp_dir = Path(temp_dir)

    def feed_frame(self, video_key: str, image: npt.NDArray[Any]) -> None:
        frames = self._frames.get(video_key)
        if frames is None:
            raise EpisodeVideoError(f"a frame for {video_key!r}, which is not a camera of the open episode")
        frames.append(image)

    def finish_episode(self) -> dict[str, tuple[Path, Stats | None]]:
        """Per camera: the episode's mp4 (in a temporary directory of its own, as lerobot expects) and stats."""
        frames, self._frames = self._frames, {}
        if self._temp_dir is None:
            raise EpisodeVideoError("finish_episode() without start_episode()")
        counts = {key: len(images) for key, images in frames.items()}
        if len(set(counts.values())) > 1:
            raise EpisodeVideoError(f"cameras got different numbers of frames in one episode: {counts}")
        results: dict[str, tuple[Path, Stats | None]] = {}
        try:
            for key, images in frames.items():
                path = Path(tempfile.mkdtemp(dir=self._temp_dir)) / f"{key.replace('/', '_')}.mp4"
                results[key] = (path, None)
                written = self._encode(images, path)
                if written != len(images):
                    raise EpisodeVideoError(f"{key}: {written} of {len(images)} frames reached {path.name}")
                results[key] = (path, episode_image_stats(images))
        except BaseException:
            for path, _ in results.values():
                shutil.rmtree(path.parent, ignore_errors=True)
            raise
        return results

    def cancel_episode(self) -> None:
        self._frames = {}

    def close(self) -> None:
        self._frames = {}

    def _encode(self, images: list[npt.NDArray[Any]], path: Path) -> int:
        """Encode with the codec options lerobot would use; returns the number of packets written.

        Neither h264 nor AV1 as lerobot configures them drops or merges frames, so one packet per
        frame is what a whole video looks like.
        """
        from hud_pipelines.recording.video import Mp4Writer

        height, width = images[0].shape[:2]
        options = self.encoder.get_codec_options(self.encoder_threads, as_strings=True)
        with Mp4Writer(
            path,
            width=width,
            height=height,
            fps=self.fps,
            codecs=(self.encoder.vcodec,),
            pix_fmt=self.encoder.pix_fmt,
            options=options,
        ) as video:
            written = sum(video.write(image) for image in images)
            return written + video.finish()
