"""A merged dataset holds its episodes by task, then seed, whatever order its parts held them in.

The parts here hold one task's episodes each, in an order no schedule of the seeds would repeat:
the merge must give the same files in whatever order it is handed them, tasks numbered by their
first episode, every row pointing at its own episode's task string and values.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.merge import find_parts, merge_parts
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.recording.events import EpisodeKey, EpisodeStatus, Frame
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions
from tests.dataset.support import SPEC, check_episodes, frame, load, outcome

REPO_ID = "local/ordered"
STEPS = 5
PARTS = {  # shard -> (task, seed) of its episodes, in the order they ended; None: an unseeded episode
    "a-late-task": [(1, 12), (1, 10), (1, None), (1, 11)],
    "b-first-task": [(0, 3), (0, None), (0, 1), (0, 2)],
}


def write_shards(root: Path) -> list[Path]:
    for instance, (shard, episodes) in enumerate(PARTS.items()):
        with LeRobotDatasetSink(SPEC, root / shard, fps=10) as sink:
            for slot, (task, seed) in enumerate(episodes):
                key = EpisodeKey(job="unit", task=task, instance=instance, slot=slot, episode=0, seed=seed)
                sink.begin(key, f"task {task}")
                for step in range(STEPS):  # the state says which seed (-1: none) each row belongs to
                    sink.add(key, frame(-1 if seed is None else seed, step, last=step == STEPS - 1))
                sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    return find_parts([root])


def files_of(root: Path) -> dict[str, bytes]:
    kept = (p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "hud_episodes.jsonl")
    return {str(p.relative_to(root)): p.read_bytes() for p in kept}


def test_episodes_come_out_by_task_then_seed_with_tasks_numbered_by_their_first_episode(tmp_path: Path) -> None:
    parts = write_shards(tmp_path / "shards")
    merged = merge_parts(parts, tmp_path / "merged", repo_id=REPO_ID).root

    records = read_episode_records(merged)
    placed = [(r["episode_index"], r["task"], r["seed"]) for r in records]
    assert placed == [
        (0, 0, 1), (1, 0, 2), (2, 0, 3), (3, 0, None), (4, 1, 10), (5, 1, 11), (6, 1, 12), (7, 1, None),
    ]  # fmt: skip
    tasks = pq.read_table(merged / "meta" / "tasks.parquet").to_pandas()
    assert tasks["task_index"].to_dict() == {"task 0": 0, "task 1": 1}  # lerobot's merge numbered "task 1" first

    dataset = load(merged)
    assert check_episodes(dataset) == [STEPS] * 8
    for index in range(dataset.num_frames):
        item = dataset[index]
        episode = int(item["episode_index"])
        _, task, seed = placed[episode]
        assert item["task"] == f"task {task}"
        assert int(item["task_index"]) == task
        assert int(item["index"]) == index
        assert float(item["observation.state"][0]) == (-1 if seed is None else seed)
    stats = json.loads((merged / "meta" / "stats.json").read_text())
    assert stats["episode_index"]["max"] == [7]
    assert stats["index"]["max"] == [8 * STEPS - 1]
    assert stats["task_index"]["mean"] == [0.5]
    state = np.asarray(dataset.hf_dataset.with_format("numpy")[:]["observation.state"])
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(axis=0), rtol=1e-6)


def test_the_merge_gives_the_same_files_whatever_order_it_is_handed_the_parts(tmp_path: Path) -> None:
    parts = write_shards(tmp_path / "shards")
    forward = merge_parts(parts, tmp_path / "forward", repo_id=REPO_ID).root
    backward = merge_parts(parts[::-1], tmp_path / "backward", repo_id=REPO_ID).root

    assert files_of(forward) == files_of(backward)
    assert [r["seed"] for r in read_episode_records(forward)] == [r["seed"] for r in read_episode_records(backward)]


def test_a_single_part_is_laid_out_in_the_same_order(tmp_path: Path) -> None:
    """One part is copied, or moved, rather than merged by lerobot: its episodes are ordered all the same."""
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        for slot, seed in enumerate([5, None, 4, 6]):
            key = EpisodeKey(job="unit", task=0, instance=0, slot=slot, episode=0, seed=seed)
            sink.begin(key, "the task")
            for step in range(STEPS):
                sink.add(key, frame(slot, step, last=step == STEPS - 1))
            sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    (part,) = find_parts([tmp_path / "shard"])
    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID, move_single=True).root

    assert not part.exists()
    assert [(r["seed"], r["slot"]) for r in read_episode_records(merged)] == [(4, 2), (5, 0), (6, 3), (None, 1)]
    dataset = load(merged)
    assert check_episodes(dataset) == [STEPS] * 4
    slots = dataset.hf_dataset.with_format("numpy")[:]["observation.state"][:, 0]
    np.testing.assert_array_equal(slots, np.repeat([2, 0, 3, 1], STEPS))


def test_one_part_and_several_give_the_same_files(tmp_path: Path) -> None:
    """A single part holds lerobot's writer's schema, lerobot's merge of several its round trip through pandas:
    the layout writes both in the writer's."""
    episodes = [episode for shard in PARTS.values() for episode in shard]
    write_shards(tmp_path / "two")
    with LeRobotDatasetSink(SPEC, tmp_path / "one" / "only", fps=10) as sink:
        for slot, (task, seed) in enumerate(episodes):
            key = EpisodeKey(job="unit", task=task, instance=0, slot=slot, episode=0, seed=seed)
            sink.begin(key, f"task {task}")
            for step in range(STEPS):
                sink.add(key, frame(-1 if seed is None else seed, step, last=step == STEPS - 1))
            sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))
    several = merge_parts(find_parts([tmp_path / "two"]), tmp_path / "several", repo_id=REPO_ID).root
    single = merge_parts(find_parts([tmp_path / "one"]), tmp_path / "single", repo_id=REPO_ID).root

    assert files_of(single) == files_of(several)


def test_an_interrupted_layout_leaves_the_part_whole_and_no_dataset(tmp_path: Path, monkeypatch: Any) -> None:
    """With ``move_single`` the part is consumed: a layout that stopped half-way (a SIGTERM raised in it) must
    leave it as it was, since it is the only copy of its episodes, and a second publish must work."""
    from hud_pipelines.dataset import canonical

    (part,) = write_shards(tmp_path / "shards")[:1]
    before = files_of(part)

    def stopped(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(canonical, "write_stats", stopped)
        with pytest.raises(KeyboardInterrupt):
            merge_parts([part], tmp_path / "merged", repo_id=REPO_ID, move_single=True)
    assert not (tmp_path / "merged").exists()
    assert files_of(part) == before

    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID, move_single=True)
    assert check_episodes(load(merged.root)) == [STEPS] * 4
    assert not part.exists()
    assert not list(tmp_path.glob(".merged*")), "nothing half-written is left beside the dataset"


def test_lerobot_appends_to_a_laid_out_video_dataset_without_overwriting_an_episode(tmp_path: Path) -> None:
    """The canonically last episode can lie in the first video file: lerobot's resume writes the next episode
    into the file after the last episode's, which held other episodes, until the files are numbered by the last
    episode each holds."""
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.aggregate import aggregate_datasets
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from hud_pipelines.dataset.canonical import lay_out_canonically
    from hud_pipelines.dataset.merge import merge_sidecars, quiet_aggregation

    shards = {"a": [9, 1], "b": [2, 3]}  # seed 9, laid out last, is in the first part: the first video file
    for instance, (shard, seeds) in enumerate(shards.items()):
        write_camera_part(tmp_path / shard, seeds, instance)
    parts = find_parts([tmp_path / shard for shard in shards])
    with quiet_aggregation():  # a video file per part, as a dataset past the video file size has
        aggregate_datasets(
            [REPO_ID] * 2, REPO_ID, roots=parts, aggr_root=tmp_path / "aggr", video_files_size_in_mb=1e-6
        )
    merge_sidecars(parts, [2, 2], tmp_path / "aggr")
    lay_out_canonically(tmp_path / "aggr", tmp_path / "merged", consume=True)

    h264 = RGBEncoderConfig(vcodec="h264", preset="ultrafast")  # the sink's codec, as the files are
    resumed = LeRobotDataset.resume(REPO_ID, root=tmp_path / "merged", rgb_encoder=h264)
    for step in range(STEPS):
        resumed.add_frame(
            {
                "observation.images.front": _pixels(77),
                "observation.state": np.array([77, step], dtype=np.float32),
                "action": np.zeros(1, np.float32),
                "next.reward": np.zeros(1, np.float32),
                "next.done": np.array([step == STEPS - 1]),
                "next.success": np.array([False]),
                "task": "look",
            }
        )
    resumed.save_episode()
    resumed.finalize()

    dataset = load(tmp_path / "merged")
    assert dataset.num_episodes == 5
    for index in range(dataset.num_frames):
        item = dataset[index]
        seed = int(item["observation.state"][0])
        assert abs(float(item["observation.images.front"].mean()) - _pixels(seed)[0, 0, 0] / 255) < 3 / 255, index


def write_camera_part(root: Path, seeds: list[int], instance: int = 0) -> None:
    """A part of one episode per seed, in that order, each with an 8x8 camera of one shade per seed."""
    from tests.dataset.test_dataset_merge_memory import camera_contract

    with LeRobotDatasetSink(camera_contract(), root, options=DatasetOptions(cameras=CameraStorage.VIDEO)) as sink:
        for slot, seed in enumerate(seeds):
            key = EpisodeKey(job="unit", task=0, instance=instance, slot=slot, episode=0, seed=seed)
            sink.begin(key, "look")
            for step in range(STEPS):
                observation = {"front": _pixels(seed), "pos": np.array([seed, step], dtype=np.float32)}
                last = step == STEPS - 1
                sink.add(key, Frame(step, observation, np.zeros(1, np.float32), 0.0, last, False, last))
            sink.end(key, outcome(EpisodeStatus.SUCCEEDED, STEPS))


def _pixels(seed: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.full((8, 8, 3), seed * 3 + 5, dtype=np.uint8)


def test_video_files_rotate_at_the_datasets_size_each_episode_in_order_and_decoding_to_its_own_frames(
    tmp_path: Path,
) -> None:
    """Each camera's episodes are re-muxed in dataset order: a file holds consecutive episodes, each starting where
    the one before it ended, and a new file starts when the next episode would take it to the dataset's
    ``video_files_size_in_mb``."""
    seeds = [5, 3, 4, 0, 2, 1]
    write_camera_part(tmp_path / "part", seeds)
    [part] = find_parts([tmp_path / "part"])
    info_path = part / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    episode_mb = sum(p.stat().st_size for p in (part / "videos").rglob("*.mp4")) / len(seeds) / 1024**2
    info["video_files_size_in_mb"] = 2.5 * episode_mb  # two or three episodes a file
    info_path.write_text(json.dumps(info))

    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID).root
    [meta_file] = (merged / "meta" / "episodes").rglob("*.parquet")
    columns = pq.read_table(meta_file).to_pydict()
    column = "videos/observation.images.front/{}".format
    files = list(zip(columns[column("chunk_index")], columns[column("file_index")], strict=True))
    starts, ends = columns[column("from_timestamp")], columns[column("to_timestamp")]
    assert files == sorted(files)
    assert 1 < len(set(files)) < len(seeds), files
    for episode in range(len(seeds)):
        continues = episode > 0 and files[episode] == files[episode - 1]
        assert starts[episode] == (ends[episode - 1] if continues else 0.0), (episode, starts, ends)
        assert ends[episode] - starts[episode] == pytest.approx(STEPS / info["fps"])
    videos = sorted((merged / "videos").rglob("*.mp4"))
    assert len(videos) == len(set(files))
    dataset = load(merged)
    assert [int(dataset[i]["observation.state"][0]) for i in range(0, dataset.num_frames, STEPS)] == sorted(seeds)
    for index in range(dataset.num_frames):
        item = dataset[index]
        seed = int(item["observation.state"][0])
        assert abs(float(item["observation.images.front"].mean()) - _pixels(seed)[0, 0, 0] / 255) < 3 / 255, index
    from hud_pipelines.dataset.layout_videos import EpisodeVideo, remux_in_order
    from hud_pipelines.errors import DatasetWriteError

    def remux(episode: EpisodeVideo) -> None:
        remux_in_order([episode], lambda at: tmp_path / f"{at}.mp4", max_mb=1, chunk_size=9)

    where = f"{re.escape(str(videos[0]))}: the episode at"
    with pytest.raises(DatasetWriteError, match=rf"{where} 100.000000-100.500000 s starts on no key frame"):
        remux(EpisodeVideo(videos[0], (100.0, 100.5), STEPS))
    with pytest.raises(DatasetWriteError, match=rf"{where} 0.000000-0.500000 s has 5 video frames for its 4 rows"):
        remux(EpisodeVideo(videos[0], (0.0, 0.5), STEPS - 1))


def write_depth_part(root: Path, lengths: dict[int, int]) -> Path:
    """A part with a 16x16 depth camera: one episode per seed of ``lengths[seed]`` frames, in that order."""
    depth = Contract(
        control_rate=10,
        robot_type="unit",
        features={
            "depth": Feature(role="observation", type=FeatureType.DEPTH, dtype="float32", shape=(16, 16)),
            "pos": Feature(role="observation", dtype="float32", shape=(2,)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )
    with LeRobotDatasetSink(depth, root) as sink:
        for slot, (seed, steps) in enumerate(lengths.items()):
            key = EpisodeKey(job="unit", task=0, instance=0, slot=slot, episode=0, seed=seed)
            sink.begin(key, "look")
            for step in range(steps):
                observation = {
                    "depth": np.full((16, 16), seed + step / 10, np.float32),
                    "pos": np.float32([seed, step]),
                }
                last = step == steps - 1
                sink.add(key, Frame(step, observation, np.zeros(1, np.float32), 0.0, last, False, last))
            sink.end(key, outcome(EpisodeStatus.SUCCEEDED, steps))
    [part] = find_parts([root])
    return part


def test_depth_episodes_of_any_length_are_written_laid_out_and_read_in_any_order(tmp_path: Path) -> None:
    """lerobot's depth codec (lossless x265) decoded an episode of three frames or more two frames ahead and a
    shorter one not ahead: its writer refused a long episode after a short one (the muxer's decoding times fell),
    and its reader missed frames across them. The part encodes depth without frames out of order."""
    part = write_depth_part(tmp_path / "part", {3: 1, 2: 5, 1: 2, 4: 3})
    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID).root
    for root, seeds in ((part, [3, 2, 1, 4]), (merged, [1, 2, 3, 4])):
        dataset = load(root)
        items = [dataset[index] for index in range(dataset.num_frames)]  # lerobot decodes each by its time
        assert [int(item["observation.state"][0]) for item in items if item["observation.state"][1] == 0] == seeds
        for item in items:
            seed, step = (float(v) for v in item["observation.state"])
            assert float(item["observation.images.depth"].mean()) / 1000 == pytest.approx(seed + step / 10, abs=0.01)


def test_episodes_decoded_ahead_by_other_delays_share_one_in_a_laid_out_file(tmp_path: Path, monkeypatch: Any) -> None:
    """With frames out of order (lerobot's own depth encoding), an episode of three frames or more is decoded two
    frames ahead and a shorter one not ahead: laid out after a two-frame episode, a long one's first packet came
    before the short one's last, and the muxer refused the file (the whole publish failed). Each episode now
    decodes to the frames it had."""
    from hud_pipelines.dataset import part as part_module

    monkeypatch.setattr(part_module, "DEPTH_X265_PARAMS", "lossless=1")  # lerobot's default: B-frames
    part = write_depth_part(tmp_path / "part", {2: 5, 1: 2})  # laid out by seed: 2 frames, then 5
    merged = merge_parts([part], tmp_path / "merged", repo_id=REPO_ID).root
    states = load(merged).hf_dataset.with_format("numpy")[:]["observation.state"]  # rows, no video decoded
    assert [int(state[0]) for state in states] == [1, 1, 2, 2, 2, 2, 2]
    before, after = _depth_frames_by_seed(part), _depth_frames_by_seed(merged)
    assert [len(after[seed]) for seed in (1, 2)] == [2, 5]
    for seed, frames in before.items():
        assert all(np.array_equal(a, b) for a, b in zip(frames, after[seed], strict=True)), seed


def _depth_frames_by_seed(root: Path) -> dict[int, list[np.ndarray[Any, Any]]]:
    """Each episode's frames, decoded from the start of the file (no seek), by the time ``meta/episodes`` gives."""
    import av

    [meta_file] = (root / "meta" / "episodes").rglob("*.parquet")
    columns = pq.read_table(meta_file).to_pydict()
    [video] = (root / "videos").rglob("*.mp4")
    with av.open(str(video)) as container:
        decoded = {round(float(f.time), 4): f.to_ndarray(format="gray12le") for f in container.decode(video=0)}
    frames: dict[int, list[np.ndarray[Any, Any]]] = {}
    data = load(root)
    states = data.hf_dataset.with_format("numpy")[:]["observation.state"]
    for episode, start in enumerate(columns["videos/observation.images.depth/from_timestamp"]):
        first, end = columns["dataset_from_index"][episode], columns["dataset_to_index"][episode]
        frames[int(states[first][0])] = [decoded[round(start + step / data.fps, 4)] for step in range(end - first)]
    return frames


def test_source_video_files_are_closed_after_their_last_episode_and_few_are_open_at_once(tmp_path: Path) -> None:
    """Every source file stayed open until the camera was done: a merge of many video files ran out of file
    descriptors (and held each file's index in memory)."""
    from hud_pipelines.dataset.layout_videos import EpisodeVideo, remux_in_order

    write_camera_part(tmp_path / "part", [0])
    [source] = (tmp_path / "part").rglob("*.mp4")
    copies = [tmp_path / "sources" / f"file-{number:03d}.mp4" for number in range(120)]
    copies[0].parent.mkdir()
    for copy in copies:
        shutil.copy(source, copy)
    interleaved = copies * 2  # every file read twice, 120 files apart: at most OPEN_SOURCES stay open
    in_pairs = [path for path in copies for _ in range(2)]  # each file's last episode comes at once: it closes
    for order, spare in ((interleaved, 24), (in_pairs, 6)):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + spare, hard))
        try:
            placed = remux_in_order(
                [EpisodeVideo(path, (0.0, STEPS / 10), STEPS) for path in order],
                lambda at: tmp_path / "out" / f"{at[0]}-{at[1]}.mp4",
                max_mb=200,
                chunk_size=1000,
            )
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert [p.seconds[0] for p in placed] == [n * STEPS / 10 for n in range(240)]
