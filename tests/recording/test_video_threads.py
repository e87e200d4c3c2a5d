"""Trace video encoding leaves no thread behind: an eval makes a recorder per instance."""

from __future__ import annotations

import threading
from pathlib import Path

import av
import numpy as np

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus, Frame, FrameBatch
from hud_pipelines.recording.traces import TraceRecorder
from hud_pipelines.recording.video import CameraVideo, VideoEncoder

FRAMES = 6


def camera_contract() -> Contract:
    return Contract(
        control_rate=10.0,
        features={
            "front": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(32, 48, 3)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )


def frame(index: int) -> Frame:
    image = np.full((32, 48, 3), index * 20, dtype=np.uint8)
    return Frame(
        index=index,
        observation={"front": image},
        action=np.zeros(1, dtype=np.float32),
        reward=0.0,
        terminated=index == FRAMES - 1,
        truncated=False,
        success=False,
    )


def record_one_episode(recorder: TraceRecorder, instance: int) -> None:
    key = EpisodeKey("job", 0, instance, 0, 0, instance)
    recorder.begin(key, "swing up")
    for i in range(FRAMES):
        recorder.add_frames(FrameBatch.of(key, frame(i)))
    recorder.end(key, EpisodeOutcome(EpisodeStatus.FAILED, 0.0, False, 0.0, FRAMES, terminated=True))


def started_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


def test_closing_a_recorder_ends_its_encoder_thread_for_every_instance(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    for instance in range(3):  # the rollouts step makes one recorder per instance
        recorder = TraceRecorder(tmp_path, camera_contract(), video=True)
        record_one_episode(recorder, instance)
        recorder.close()
    assert started_threads(before) == []
    videos = sorted(tmp_path.rglob("*.mp4"))
    assert len(videos) == 3
    with av.open(str(videos[-1])) as container:
        assert sum(1 for _ in container.decode(video=0)) == FRAMES


def test_a_recorder_closed_once_records_video_again_on_a_new_thread(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path, camera_contract(), video=True)
    record_one_episode(recorder, 0)
    recorder.close()
    record_one_episode(recorder, 1)
    recorder.close()
    assert len(list(tmp_path.rglob("*.mp4"))) == 2


def test_stopping_an_encoder_runs_the_work_submitted_before_it(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    encoder = VideoEncoder()
    video = CameraVideo(tmp_path / "clip.mp4", 10.0, encoder=encoder)
    for i in range(FRAMES):
        video.add(np.full((32, 48, 3), i * 20, dtype=np.uint8))
    done: list[int] = []
    encoder.submit(lambda: done.append(video.frames))
    encoder.stop()
    assert done == [FRAMES]
    assert started_threads(before) == []
