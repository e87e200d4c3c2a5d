"""One part of a shard: a complete lerobot dataset that one writer fills, episode by episode.

A part is created on its first episode (the layout is complete by then: missing shapes were filled
from the first frame), written only through ``LeRobotDataset`` (``create``, ``add_frame`` with the
task string, ``save_episode``) and always finalized. RGB video cameras are encoded from memory
rather than through lerobot's temporary PNGs, and each episode's rows are embedded in one call
(:mod:`.lerobot_hooks`): the files are the ones lerobot's default path writes, at about a third of
its CPU time per frame (``bench/dataset.md``). Beside lerobot's files it keeps
``meta/hud_episodes.jsonl``: one line per episode with its ``EpisodeKey``, trace id and outcome, so
dataset episodes can be joined with grades and traces. An errored episode (kept only with
``keep_errored``), and one holding NaN or infinity, is listed there with ``in_stats: false`` (and its
non-finite keys), and its stats are taken back out of ``stats.json`` once lerobot has folded them in.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hud_pipelines.contract import FeatureType
from hud_pipelines.dataset.features import ERRORED, DatasetLayout, FrameDict
from hud_pipelines.dataset.lerobot_api import Stats, stats_of, write_stats
from hud_pipelines.dataset.lerobot_hooks import (
    check_in_memory_video,
    in_memory_video_dataset,
    uniform_episode_stats,
    whole_episode_embedding,
)
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions, VideoCodec

if TYPE_CHECKING:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

logger = logging.getLogger(__name__)

PART_PREFIX = "part-"
INFO_FILE = "meta/info.json"
EPISODES_SIDECAR = "meta/hud_episodes.jsonl"
"""Per part (and in a merged dataset): one JSON line per episode, in episode_index order."""


@dataclass(frozen=True)
class FinishedEpisode:
    """A whole episode, ready to be written: converted frames, task string and outcome."""

    key: EpisodeKey
    task: str
    frames: list[FrameDict]
    outcome: EpisodeOutcome
    non_finite: tuple[str, ...] = ()
    """lerobot keys holding NaN or infinity: such an episode is written flagged, never into the stats."""

    @property
    def in_stats(self) -> bool:
        """Whether its frames enter ``stats.json``: not when it errored (kept with ``keep_errored``, to be
        looked at) or holds a non-finite value. The stats normalize what a policy trained on the dataset
        reads; frames of a sim or a policy that faulted must not move them."""
        return not self.non_finite and self.outcome.status is not EpisodeStatus.ERRORED


class PartWriter:
    """Writes a part with lerobot in the calling process (one writer thread's part)."""

    def __init__(self, path: Path, options: DatasetOptions, repo_id: str) -> None:
        self.path = path
        self.options = options
        self.repo_id = repo_id
        self._dataset: LeRobotDataset | None = None

    def start(self) -> None:
        """Import lerobot before the first episode arrives.

        lerobot's import takes ~11 s: pay it while the sims start, not when the first episode ends.
        """
        importlib.import_module("lerobot.datasets.lerobot_dataset")

    def write(self, episode: FinishedEpisode, layout: DatasetLayout) -> int:
        """Write one episode whole; returns its episode index in the part."""
        dataset = self._dataset or self._create(layout)
        flag = np.array([episode.outcome.status is EpisodeStatus.ERRORED], dtype=np.bool_)
        stats_before = stats_of(dataset.meta)
        try:
            for frame in episode.frames:
                row: dict[str, Any] = dict(frame)
                row["task"] = episode.task
                if layout.keep_errored:
                    row[ERRORED] = flag
                dataset.add_frame(row)
            index = int(dataset.meta.total_episodes)
            with whole_episode_embedding(), uniform_episode_stats():
                dataset.save_episode()
            if not episode.in_stats:
                _restore_stats(dataset, stats_before)
        except BaseException:
            # a save_episode that failed half-way leaves a buffer lerobot cannot inspect: the
            # original error is the one to report
            with contextlib.suppress(Exception):
                if dataset.has_pending_frames():
                    dataset.clear_episode_buffer()
            raise
        self._record(index, episode)
        return index

    def finalize(self) -> None:
        """Flush and close; idempotent; the part is loadable afterwards (if it holds an episode)."""
        dataset, self._dataset = self._dataset, None
        if dataset is None:
            return
        if dataset.has_pending_frames():
            dataset.clear_episode_buffer()
        dataset.finalize()

    def _create(self, layout: DatasetLayout) -> LeRobotDataset:
        from lerobot.configs import DepthEncoderConfig, RGBEncoderConfig
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        quiet_libraries()
        codec = self.options.codec
        encoder = RGBEncoderConfig(vcodec=codec.value, preset="ultrafast" if codec is VideoCodec.H264 else None)
        in_memory = encodes_video_in_memory(layout)
        dataset_class = in_memory_video_dataset() if in_memory else LeRobotDataset
        dataset = dataset_class.create(
            repo_id=self.repo_id,
            fps=layout.fps,
            features=layout.lerobot_features(),
            root=self.path,
            robot_type=layout.robot_type,
            use_videos=layout.uses_video,
            rgb_encoder=encoder,
            depth_encoder=DepthEncoderConfig(extra_options={"x265-params": DEPTH_X265_PARAMS}),
            streaming_encoding=in_memory,
        )
        if in_memory:
            check_in_memory_video(dataset)
        self._dataset = dataset
        return dataset

    def _record(self, index: int, episode: FinishedEpisode) -> None:
        outcome = episode.outcome
        line = {
            "episode_index": index,
            "trace_id": episode.key.trace_id,
            **asdict(episode.key),
            "status": outcome.status.value,
            "success": None if outcome.status is EpisodeStatus.ERRORED else outcome.success,  # as in grades.json
            "score": None if outcome.status is EpisodeStatus.ERRORED else outcome.score,
            "total_reward": outcome.total_reward,
            "steps": outcome.steps,
            "terminated": outcome.terminated,
            "truncated": outcome.truncated,
            "error": outcome.error,
            "fault": None if outcome.fault is None else outcome.fault.value,
            "frames": len(episode.frames),
            "task_prompt": episode.task,
            "non_finite": list(episode.non_finite),
            "in_stats": episode.in_stats,
        }
        with (self.path / EPISODES_SIDECAR).open("a") as sidecar:
            sidecar.write(json.dumps(line) + "\n")


def read_episode_records(root: Path) -> list[dict[str, Any]]:
    """The ``hud_episodes.jsonl`` records of a dataset, in file order (empty when it has none)."""
    sidecar = Path(root) / EPISODES_SIDECAR
    if not sidecar.is_file():
        return []
    return [json.loads(line) for line in sidecar.read_text().splitlines() if line.strip()]


DEPTH_X265_PARAMS = "lossless=1:bframes=0"
"""lerobot's lossless depth encoding without frames decoded out of order: with them x265 decodes an episode of
three frames or more two frames ahead and a shorter one not ahead, and lerobot's writer then refuses a long
episode after a short one (the muxer's decoding times would fall), and its reader misses frames across them."""


def _restore_stats(dataset: LeRobotDataset, stats: Stats | None) -> None:
    """Undo what ``save_episode`` aggregated into ``stats.json`` from an episode kept out of the stats.

    lerobot folds each episode's stats into the dataset's (``aggregate_stats([stats, episode])``), so
    putting back the stats from before the episode leaves exactly the stats lerobot computes over the
    episodes in them. With none yet the file holds ``{}``: loadable, and merged as nothing.
    """
    dataset.meta.stats = stats
    write_stats(stats or {}, dataset.meta.root)


def encodes_video_in_memory(layout: DatasetLayout) -> bool:
    """Video cameras skip lerobot's temporary PNGs (:mod:`.lerobot_hooks`) unless one is a depth map,
    which lerobot quantizes and encodes its own way."""
    videos = [c for c in layout.cameras if c.storage is CameraStorage.VIDEO]
    return bool(videos) and all(c.kind is not FeatureType.DEPTH for c in videos)


def quiet_libraries() -> None:
    """Keep warnings, drop chatter: libav prints a banner per encode and per concatenation at INFO
    (lerobot hands logging back to libav's own printer), ``datasets`` a progress bar per episode."""
    import av.logging
    import datasets

    av.logging.set_libav_level(av.logging.WARNING)
    datasets.disable_progress_bars()
