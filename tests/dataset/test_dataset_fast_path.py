"""The part writer's hooks into lerobot write what lerobot's own default loop writes, every frame included.

Reference: the loop a user writes (``LeRobotDataset.create`` without streaming, ``add_frame``,
``save_episode``), fed the very frames the sink converts. The sink's part must hold the same rows,
the same stats to the last bit, and per episode a video with exactly one frame per row.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq
import pytest

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.episode_video import EpisodeVideoEncoder
from hud_pipelines.dataset.features import DatasetLayout
from hud_pipelines.dataset.image_stats import episode_image_stats
from hud_pipelines.dataset.lerobot_hooks import (
    check_in_memory_video,
    embed_whole_episode,
    in_memory_video_dataset,
    whole_episode_embedding,
)
from hud_pipelines.dataset.part import PART_PREFIX
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.errors import DatasetWriteError, EpisodeVideoError
from hud_pipelines.recording.events import EpisodeStatus, Frame
from hud_pipelines.recording.video import Mp4Writer
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions
from tests.dataset.support import key, load, outcome

TASK = "stack the frames"
LENGTHS = (5, 23, 1, 2, 40)


def scene(step: int, shape: tuple[int, int], seed: int) -> npt.NDArray[np.uint8]:
    """A moving gradient with noise: frames differ, and so do their channels."""
    rng = np.random.default_rng(seed * 1000 + step)
    height, width = shape
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 7 + step * 3) % 256, (y * 5 + step) % 256, ((x + y) * 3) % 256], axis=-1)
    return np.clip(base + rng.integers(-20, 20, size=base.shape), 0, 255).astype(np.uint8)


def camera_contract() -> Contract:
    return Contract(
        control_rate=10,
        robot_type="unit",
        features={
            "front": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(32, 40, 3)),
            "wrist": Feature(role="observation", type=FeatureType.GRAY, dtype="uint8", shape=(24, 24)),
            "pos": Feature(role="observation", dtype="float64", shape=(2,)),
            "action": Feature(role="action", dtype="float32", shape=(2,)),
        },
    )


def episode_frames(episode: int, length: int) -> list[Frame]:
    return [
        Frame(
            index=step,
            observation={
                "front": scene(step, (32, 40), episode),
                "wrist": scene(step, (24, 24), episode + 50)[..., 0],
                "pos": np.array([episode, step], dtype=np.float64),
            },
            action=np.array([step, -episode], dtype=np.float32),
            reward=float(step),
            terminated=step == length - 1,
            truncated=False,
            success=False,
        )
        for step in range(length)
    ]


def write_plain(layout: DatasetLayout, root: Path) -> None:
    """The reference: lerobot's default writer (PNGs, sampled stats), the codec the sink uses."""
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset.create(
        "local/plain",
        layout.fps,
        layout.lerobot_features(),
        root=root,
        robot_type=layout.robot_type,
        use_videos=layout.uses_video,
        rgb_encoder=RGBEncoderConfig(vcodec="h264", preset="ultrafast"),
    )
    for episode, length in enumerate(LENGTHS):
        for frame in episode_frames(episode, length):
            dataset.add_frame({**layout.lerobot_frame(frame), "task": TASK})
        dataset.save_episode()
    dataset.finalize()


def write_sink(root: Path, storage: CameraStorage) -> DatasetLayout:
    sink = LeRobotDatasetSink(camera_contract(), root, options=DatasetOptions(cameras=storage))
    with sink:
        for episode, length in enumerate(LENGTHS):
            sink.begin(key(0, episode), TASK)
            for frame in episode_frames(episode, length):
                sink.add(key(0, episode), frame)
            sink.end(key(0, episode), outcome(EpisodeStatus.FAILED, length))
    return sink.layout


def decoded_frames(path: Path) -> list[tuple[float, npt.NDArray[np.uint8]]]:
    import av

    with av.open(str(path)) as container:
        return [(float(f.time), f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]


def table_info(schema: Any) -> Any:
    """The features ``datasets`` stores in a schema, without the fingerprint of the call that made it."""
    return json.loads(schema.metadata[b"huggingface"])["info"]


def assert_same_stats(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert set(ours) == set(theirs)
    for feature, stats in theirs.items():
        assert set(ours[feature]) == set(stats), feature
        for name, value in stats.items():
            np.testing.assert_array_equal(np.asarray(ours[feature][name]), np.asarray(value), f"{feature} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("storage", [CameraStorage.VIDEO, CameraStorage.IMAGE])
def test_sink_part_equals_lerobots_default_loop(tmp_path: Path, storage: CameraStorage) -> None:
    layout = write_sink(tmp_path / "sink", storage)
    write_plain(layout, tmp_path / "plain")
    ours, theirs = load(tmp_path / "sink" / f"{PART_PREFIX}000"), load(tmp_path / "plain")

    expected = (len(LENGTHS), sum(LENGTHS))
    assert (ours.num_episodes, ours.num_frames) == (theirs.num_episodes, theirs.num_frames) == expected
    mine, reference = ours.hf_dataset.with_format("arrow")[:], theirs.hf_dataset.with_format("arrow")[:]
    assert mine.equals(reference)  # every row and column, images embedded in image mode
    data_file = "data/chunk-000/file-000.parquet"
    assert table_info(pq.read_schema(ours.root / data_file)) == table_info(pq.read_schema(theirs.root / data_file))
    assert_same_stats(ours.meta.stats, theirs.meta.stats)
    for episode in range(len(LENGTHS)):
        episode_stats = {k[6:].rsplit("/", 1)[0] for k in ours.meta.episodes.column_names if k.startswith("stats/")}
        for name in episode_stats:
            for stat in ("min", "max", "mean", "std", "count", "q01", "q50", "q99"):
                column = f"stats/{name}/{stat}"
                mine_value, their_value = ours.meta.episodes[episode][column], theirs.meta.episodes[episode][column]
                np.testing.assert_array_equal(np.asarray(mine_value), np.asarray(their_value), column)

    assert ours.meta.video_keys == theirs.meta.video_keys
    assert len(ours.meta.video_keys) == (2 if storage is CameraStorage.VIDEO else 0)
    for video_key in ours.meta.video_keys:
        path = ours.root / ours.meta.get_video_file_path(0, video_key)
        frames = decoded_frames(path)
        assert len(frames) == sum(LENGTHS)  # not one frame dropped
        for episode, length in enumerate(LENGTHS):
            start = ours.meta.episodes[episode][f"videos/{video_key}/from_timestamp"]
            end = ours.meta.episodes[episode][f"videos/{video_key}/to_timestamp"]
            assert sum(start - 1e-6 <= t < end - 1e-6 for t, _ in frames) == length, (video_key, episode)
        reference_frames = decoded_frames(theirs.root / theirs.meta.get_video_file_path(0, video_key))
        assert [t for t, _ in frames] == [t for t, _ in reference_frames]
        for (_, mine_pixels), (_, their_pixels) in zip(frames, reference_frames, strict=True):
            np.testing.assert_array_equal(mine_pixels, their_pixels)  # same encoder input, same settings


@pytest.mark.slow
def test_image_stats_equal_lerobots_from_its_temporary_pngs(tmp_path: Path) -> None:
    """lerobot's default path: PNGs written by its image writer, then ``compute_episode_stats`` on them."""
    from lerobot.datasets.compute_stats import compute_episode_stats
    from lerobot.datasets.image_writer import write_image

    episodes = {
        "one frame": [scene(0, (96, 96), 1)],
        "short": [scene(i, (96, 96), 2) for i in range(7)],
        "sampled": [scene(i, (64, 48), 3) for i in range(130)],  # over 100 frames: lerobot samples
        "downscaled": [scene(i, (320, 400), 4) for i in range(3)],  # over 300 px: lerobot downscales
        "flat": [np.full((8, 8, 3), 7, dtype=np.uint8)] * 4,
        "narrow range": [np.random.default_rng(5).integers(100, 103, (16, 16, 3), dtype=np.uint8) for _ in range(9)],
    }
    feature = {"cam": {"dtype": "video", "shape": (0, 0, 3), "names": ["height", "width", "channels"]}}
    for name, frames in episodes.items():
        paths: list[str] = []
        for index, image in enumerate(frames):
            path = tmp_path / name / f"frame-{index:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_image(image, path, compress_level=1)
            paths.append(str(path))
        theirs = compute_episode_stats({"cam": paths}, feature)["cam"]
        raw = episode_image_stats(frames)
        # what lerobot's save_episode does with a streaming encoder's stats
        ours = {k: v if k == "count" else np.squeeze(v.reshape(1, -1, 1, 1) / 255.0, axis=0) for k, v in raw.items()}
        assert set(ours) == set(theirs), name
        for stat, value in theirs.items():
            assert ours[stat].dtype == value.dtype, (name, stat)
            np.testing.assert_array_equal(ours[stat], value, f"{name} {stat}")


def test_encoder_keeps_every_frame_fed_without_pause(tmp_path: Path) -> None:
    from lerobot.configs import RGBEncoderConfig

    encoder = EpisodeVideoEncoder(30, RGBEncoderConfig(vcodec="h264", preset="ultrafast"))
    for episode, length in enumerate((300, 1)):
        encoder.start_episode(["cam"], tmp_path)
        for step in range(length):  # as fast as the caller can: nothing is queued, so nothing can be dropped
            encoder.feed_frame("cam", scene(step, (48, 64), episode))
        path, stats = encoder.finish_episode()["cam"]
        frames = decoded_frames(path)
        assert len(frames) == length
        assert [t for t, _ in frames] == [float(Fraction(i, 30)) for i in range(length)]
        assert stats is not None
        assert int(stats["count"][0]) == min(length, 100)


def test_an_odd_sized_video_camera_loads_in_lerobot_as_declared(tmp_path: Path) -> None:
    """libx264 refuses odd 4:2:0 sizes; stored padded, the declared shape is the one lerobot decodes."""
    contract = Contract(
        control_rate=10,
        features={
            "front": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(37, 53, 3)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )
    y, x = np.mgrid[0:37, 0:53]
    images = [np.stack([x * 4 + step * 10, y * 6, 255 - x * 4], axis=-1).astype(np.uint8) for step in range(4)]
    sink = LeRobotDatasetSink(contract, tmp_path / "shard")
    with sink:
        sink.begin(key(0), TASK)
        for step, image in enumerate(images):
            last = step == len(images) - 1
            frame = Frame(step, {"front": image}, np.zeros(1, np.float32), 0.0, last, truncated=False, success=False)
            sink.add(key(0), frame)
        sink.end(key(0), outcome(EpisodeStatus.FAILED, len(images)))
    assert sink.report.episodes_written == 1

    dataset = load(tmp_path / "shard" / f"{PART_PREFIX}000")
    feature = dataset.meta.features["observation.images.front"]
    assert tuple(feature["shape"]) == (38, 54, 3)
    assert (feature["info"]["video.height"], feature["info"]["video.width"]) == (38, 54)
    for step in range(len(images)):
        decoded = dataset[step]["observation.images.front"].numpy()
        assert decoded.shape == (3, 38, 54)
        pixels = decoded.transpose(1, 2, 0)[:37, :53] * 255.0
        errors = [float(np.abs(pixels - image).mean()) for image in images]
        assert int(np.argmin(errors)) == step, errors  # this frame, in its place
        assert errors[step] < 5, errors  # lossy 4:2:0 at lerobot's crf (about 3 here)


def test_the_episode_encoder_pads_odd_frames_as_trace_videos_are(tmp_path: Path) -> None:
    """The one writer pads (lerobot's h264 is 4:2:0, which libx264 refuses to open at an odd size)."""
    from lerobot.configs import RGBEncoderConfig

    encoder = EpisodeVideoEncoder(10, RGBEncoderConfig(vcodec="h264", preset="ultrafast"))
    encoder.start_episode(["cam"], tmp_path)
    for step in range(3):
        encoder.feed_frame("cam", scene(step, (37, 53), 0))
    path, _ = encoder.finish_episode()["cam"]
    assert [pixels.shape for _, pixels in decoded_frames(path)] == [(38, 54, 3)] * 3


def test_the_mp4_writer_takes_the_first_codec_ffmpeg_builds_and_names_them_all_when_none(tmp_path: Path) -> None:
    frames = [scene(step, (24, 32), 0) for step in range(6)]
    with Mp4Writer(tmp_path / "a.mp4", width=32, height=24, fps=12, codecs=("no-such-codec", "mpeg4")) as video:
        written = sum(video.write(frame) for frame in frames) + video.finish()
    assert video.codec == "mpeg4"
    assert written == len(frames)
    assert [t for t, _ in decoded_frames(tmp_path / "a.mp4")] == [float(Fraction(i, 12)) for i in range(len(frames))]
    with pytest.raises(RuntimeError, match=r"no usable video encoder among \('no-such-codec', 'nor-this-one'\)"):
        Mp4Writer(tmp_path / "b.mp4", width=32, height=24, fps=12, codecs=("no-such-codec", "nor-this-one"))


def test_encoder_refuses_unequal_cameras_and_unknown_keys(tmp_path: Path) -> None:
    from lerobot.configs import RGBEncoderConfig

    encoder = EpisodeVideoEncoder(10, RGBEncoderConfig(vcodec="h264", preset="ultrafast"))
    encoder.start_episode(["a", "b"], tmp_path)
    with pytest.raises(EpisodeVideoError, match="'c'"):
        encoder.feed_frame("c", scene(0, (8, 8), 0))
    encoder.feed_frame("a", scene(0, (8, 8), 0))
    encoder.feed_frame("a", scene(1, (8, 8), 0))
    encoder.feed_frame("b", scene(0, (8, 8), 0))
    with pytest.raises(EpisodeVideoError, match="different numbers of frames"):
        encoder.finish_episode()
    assert not list(tmp_path.iterdir())  # nothing left behind
    with pytest.raises(EpisodeVideoError, match="depth"):
        encoder.start_episode(["a"], tmp_path, depth_video_keys=["a"])


def test_whole_episode_embedding_gives_lerobots_table(tmp_path: Path) -> None:
    import datasets
    from lerobot.datasets import dataset_writer
    from lerobot.datasets.image_writer import write_image
    from lerobot.datasets.io_utils import embed_images

    paths: list[str] = []
    for index in range(6):
        path = tmp_path / f"frame-{index:06d}.png"
        write_image(scene(index, (16, 16), 0), path, compress_level=6)
        paths.append(str(path))
    state = [np.array([i, -i], dtype=np.float32) for i in range(6)]
    with_images = datasets.Dataset.from_dict(
        {"img": paths, "state": state},
        features=datasets.Features(
            {"img": datasets.Image(), "state": datasets.Sequence(datasets.Value("float32"), length=2)}
        ),
    )
    vectors_only = with_images.remove_columns("img")
    for dataset in (with_images, vectors_only):
        theirs = embed_images(dataset).with_format("arrow")[:]
        ours = embed_whole_episode(dataset).with_format("arrow")[:]
        assert ours.equals(theirs)
        assert table_info(ours.schema) == table_info(theirs.schema)
    assert with_images.with_format("arrow")[:]["img"][0]["bytes"].as_py() is None  # paths before embedding
    assert embed_whole_episode(with_images).with_format("arrow")[:]["img"][0]["bytes"].as_py() is not None

    with whole_episode_embedding():  # inside: the hook answers; outside: lerobot's function again
        assert dataset_writer.embed_images(vectors_only) is vectors_only
    assert dataset_writer.embed_images(vectors_only) is not vectors_only


def test_the_encoder_hook_is_checked(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {"cam": {"dtype": "video", "shape": (8, 8, 3), "names": ["height", "width", "channels"]}}
    ours = in_memory_video_dataset().create("local/ours", 10, features, root=tmp_path / "ours", streaming_encoding=True)
    check_in_memory_video(ours)
    theirs = LeRobotDataset.create("local/theirs", 10, features, root=tmp_path / "theirs", streaming_encoding=True)
    with pytest.raises(TypeError, match="StreamingVideoEncoder"):
        check_in_memory_video(theirs)
    ours.finalize()
    theirs.finalize()


def test_a_failed_video_encode_is_the_writers_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: EpisodeVideoEncoder) -> None:
        raise EpisodeVideoError("the codec went away")

    monkeypatch.setattr(EpisodeVideoEncoder, "finish_episode", fail)
    sink = LeRobotDatasetSink(camera_contract(), tmp_path / "shard")
    sink.begin(key(0), TASK)
    for frame in episode_frames(0, 3):
        sink.add(key(0), frame)
    sink.end(key(0), outcome(EpisodeStatus.FAILED, 3))
    with pytest.raises(DatasetWriteError, match="the codec went away"):
        sink.close()
    assert sink.report.episodes_written == 0
