"""The dataset tells the truth: finite numbers and stats, one success per episode, the contract's
dtypes, a robot type that names something, stats of merged data, and no progress bars."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.features import DatasetLayout
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.dataset.publish import DatasetBuild, publish_shards
from hud_pipelines.dataset.shards import ShardStore
from hud_pipelines.dataset.sources import dataset_robot_type
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.errors import Fault, HudPipelinesError
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import unreached_result
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame, errored
from hud_pipelines.spec.dataset_options import DatasetOptions
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import Partition
from tests.dataset.rollouts import contract_of, rollout
from tests.dataset.support import SPEC, check_episodes, frame, key, load, outcome, write_episodes

NAN_AT = 5
STEPS = 8


def nan_frame(slot: int, step: int, *, last: bool = False) -> Frame:
    """A frame whose observation and reward are NaN from step ``NAN_AT`` on (a diverged sim)."""
    healthy = frame(slot, step, last=last)
    if step < NAN_AT:
        return healthy
    observation = {"pos": np.full(2, np.nan, dtype=np.float32)}
    return Frame(step, observation, healthy.action, math.nan, healthy.terminated, False, False)


def write_episode(
    sink: EpisodeSink, episode_key: EpisodeKey, status: EpisodeStatus, make: Callable[..., Frame] = frame
) -> None:
    sink.begin(episode_key, "the task")
    for step in range(STEPS):
        sink.add(episode_key, make(episode_key.slot, step, last=step == STEPS - 1))
    sink.end(episode_key, outcome(status, STEPS))


def stats_file(root: Path) -> dict[str, dict[str, Any]]:
    return json.loads((root / "meta" / "stats.json").read_text())


def all_numbers(stats: dict[str, dict[str, Any]]) -> Iterator[float]:
    for feature in stats.values():
        for value in feature.values():
            yield from np.asarray(value, dtype=np.float64).reshape(-1).tolist()


def lerobot_stats_of(dataset: Any, episodes: Sequence[int]) -> dict[str, dict[str, Any]]:
    """What lerobot's writer computes over these episodes' rows: per-episode stats, folded in order."""
    from lerobot.datasets.compute_stats import aggregate_stats, compute_episode_stats

    table = dict(dataset.hf_dataset.with_format("numpy")[:])
    table["timestamp"] = table["frame_index"] / dataset.fps  # lerobot's buffer holds them as float64
    features = dataset.meta.features
    numeric = [k for k in features if k in table and features[k]["dtype"] not in ("image", "video", "string")]
    stats: dict[str, dict[str, Any]] | None = None
    for episode in episodes:
        rows = table["episode_index"] == episode
        episode_stats = compute_episode_stats({k: np.asarray(table[k])[rows] for k in numeric}, features)
        stats = episode_stats if stats is None else aggregate_stats([stats, episode_stats])
    assert stats is not None
    return stats


def assert_stats_equal(
    actual: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]], *, exact: Sequence[str] | None = None
) -> None:
    """``exact`` keys (all when ``None``) to the last bit, the others to float32 rounding.

    A merged dataset's stats are folded from the per-episode stats of ``meta/episodes``, where lerobot
    stores a float32 feature's stats as the doubles of float32 values; it folds them in float64,
    where lerobot's writer folds the float32 arrays themselves: they agree to float32 rounding."""
    assert set(actual) == set(expected)
    for feature, values in expected.items():
        assert set(actual[feature]) == set(values), feature
        for stat, value in values.items():
            got, want = np.asarray(actual[feature][stat], np.float64), np.asarray(value, np.float64)
            if exact is None or feature in exact:
                np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=f"{feature} {stat}")
            else:
                np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, err_msg=f"{feature} {stat}")


# -- 1. non-finite numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [EpisodeStatus.ERRORED, EpisodeStatus.FAILED])
def test_an_episode_with_nan_is_left_out_even_when_not_ended_errored(tmp_path: Path, status: EpisodeStatus) -> None:
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        for slot in range(3):
            write_episode(
                sink, key(slot), status if slot == 1 else EpisodeStatus.SUCCEEDED, nan_frame if slot == 1 else frame
            )
    report = sink.report
    assert (report.episodes_written, report.non_finite, report.errored_dropped) == (2, 1, 1)
    part = report.parts[0]
    assert all(math.isfinite(v) for v in all_numbers(stats_file(part)))
    dataset = load(part)
    assert check_episodes(dataset) == [STEPS, STEPS]
    table = dataset.hf_dataset.with_format("numpy")[:]
    assert np.isfinite(table["observation.state"]).all()
    assert np.isfinite(table["next.reward"]).all()
    assert [r["slot"] for r in read_episode_records(part)] == [0, 2]


def test_keep_errored_keeps_nan_episodes_flagged_and_out_of_the_stats(tmp_path: Path) -> None:
    options = DatasetOptions(keep_errored=True)
    statuses = [EpisodeStatus.ERRORED, EpisodeStatus.SUCCEEDED, EpisodeStatus.FAILED, EpisodeStatus.SUCCEEDED]
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=options) as sink:
        for episode, status in enumerate(statuses):  # the first episode, with no stats before it, is NaN
            write_episode(sink, key(0, episode), status, nan_frame if episode in (0, 2) else frame)
    assert (sink.report.episodes_written, sink.report.non_finite, sink.report.errored_kept) == (4, 2, 2)
    part = sink.report.parts[0]

    dataset = load(part)
    assert check_episodes(dataset) == [STEPS] * 4  # frames = actions = rows, NaN rows included
    table = dataset.hf_dataset.with_format("numpy")[:]
    flagged = np.asarray(table["episode.errored"]).reshape(-1)
    assert flagged.tolist() == [True] * STEPS + [False] * STEPS + [True] * STEPS + [False] * STEPS
    records = read_episode_records(part)
    assert [r["in_stats"] for r in records] == [False, True, False, True]
    assert [r["non_finite"] for r in records] == [
        ["observation.state", "next.reward"],
        [],
        ["observation.state", "next.reward"],
        [],
    ]
    assert [r["status"] for r in records] == ["errored", "succeeded", "errored", "succeeded"]
    assert "non-finite values in observation.state (from step 5)" in str(records[2]["error"])

    stats = stats_file(part)
    assert all(math.isfinite(v) for v in all_numbers(stats))
    assert_stats_equal(cast(dict[str, dict[str, Any]], dataset.meta.stats), lerobot_stats_of(dataset, [1, 3]))


def test_keep_errored_keeps_a_finite_errored_episode_flagged_and_out_of_the_stats(tmp_path: Path) -> None:
    """A sim or policy that faulted wrote those frames: they must not move what a trained policy normalizes by."""
    options = DatasetOptions(keep_errored=True)
    statuses = [EpisodeStatus.SUCCEEDED, EpisodeStatus.ERRORED, EpisodeStatus.FAILED]
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=options) as sink:
        for episode, status in enumerate(statuses):
            write_episode(sink, key(episode, episode), status, frame)
    assert (sink.report.episodes_written, sink.report.non_finite, sink.report.errored_kept) == (3, 0, 1)
    part = sink.report.parts[0]
    dataset = load(part)
    assert check_episodes(dataset) == [STEPS] * 3
    assert [r["in_stats"] for r in read_episode_records(part)] == [True, False, True]
    assert_stats_equal(cast(dict[str, dict[str, Any]], dataset.meta.stats), lerobot_stats_of(dataset, [0, 2]))


def test_a_part_of_nan_episodes_only_loads_with_empty_stats(tmp_path: Path) -> None:
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10, options=DatasetOptions(keep_errored=True)) as sink:
        write_episode(sink, key(0), EpisodeStatus.ERRORED, nan_frame)
    assert stats_file(sink.report.parts[0]) == {}
    assert load(sink.report.parts[0]).num_episodes == 1


def test_a_float_camera_with_nan_pixels_is_non_finite() -> None:
    camera = Feature(role="observation", type=FeatureType.RGB, dtype="float32", shape=(2, 2, 3))
    layout = DatasetLayout.build(
        Contract(
            control_rate=5, features={"cam": camera, "action": Feature(role="action", dtype="float32", shape=(1,))}
        )
    )
    pixels = np.zeros((2, 2, 3), np.float32)
    pixels[0, 0, 0] = np.inf
    recorded = Frame(0, {"cam": pixels}, np.zeros(1, np.float32), 0.0, False, False, False)
    assert layout.non_finite(recorded, layout.lerobot_frame(recorded)) == ["observation.images.cam"]


# -- 2. one success ------------------------------------------------------------------------------------


def test_next_success_follows_the_graded_outcome(tmp_path: Path) -> None:
    env_success = {
        0: [False] * 6,
        1: [False, False, True, True, True, True],
        2: [False, True, False, False, False, False],
    }
    graded = {0: True, 1: False, 2: True}  # a return grader passes 0, fails 1 the env called a success
    with LeRobotDatasetSink(SPEC, tmp_path / "shard", fps=10) as sink:
        for slot, reported in env_success.items():
            sink.begin(key(slot), "task")
            for step, success in enumerate(reported):
                healthy = frame(slot, step, last=step == 5)
                sink.add(key(slot), Frame(step, healthy.observation, healthy.action, 1.0, step == 5, False, success))
            status = EpisodeStatus.SUCCEEDED if graded[slot] else EpisodeStatus.FAILED
            sink.end(key(slot), EpisodeOutcome(status, 1.0, graded[slot], 6.0, 6, terminated=True))
    part = sink.report.parts[0]
    table = load(part).hf_dataset.with_format("numpy")[:]
    records = read_episode_records(part)
    columns: dict[int, list[bool]] = {}
    for record in records:
        rows = table["episode_index"] == record["episode_index"]
        columns[int(str(record["slot"]))] = np.asarray(table["next.success"])[rows].reshape(-1).tolist()
        assert any(columns[int(str(record["slot"]))]) == record["success"]
    assert columns == {
        0: [False] * 5 + [True],
        1: [False] * 6,
        2: [False, True, False, False, False, True],
    }


# -- 3. stats of a merged dataset ------------------------------------------------------------------------


def test_merged_stats_describe_the_merged_data(tmp_path: Path) -> None:
    shards = [tmp_path / "runs" / name for name in ("a", "b")]
    options = DatasetOptions(keep_errored=True)
    for instance, shard in enumerate(shards):
        with LeRobotDatasetSink(SPEC, shard, fps=10, options=options) as sink:
            write_episodes(sink, 3, steps=60, instance=instance, first=instance * 3)
            if instance == 1:  # a flagged episode in the second shard: in the data, never in the stats
                write_episode(sink, key(0, 9, instance), EpisodeStatus.ERRORED, nan_frame)
    target = tmp_path / "merged"
    publish_shards(shards, target)

    dataset = load(target)
    assert dataset.num_frames == 6 * 60 + STEPS
    stats = stats_file(target)
    assert all(math.isfinite(v) for v in all_numbers(stats))
    assert stats["index"]["max"] == [6 * 60 - 1]
    assert stats["episode_index"]["max"] == [5]
    assert stats["task_index"]["max"] == [5]
    renumbered = ["index", "episode_index", "task_index"]
    assert_stats_equal(stats, lerobot_stats_of(dataset, range(6)), exact=renumbered)


# -- 4. the contract's dtypes ---------------------------------------------------------------------------


def test_discrete_actions_are_stored_as_the_contracts_integers(tmp_path: Path) -> None:
    factory = "envs.faulty:probe"
    contract = contract_of(factory)
    assert contract.action.dtype == "int64"
    with LeRobotDatasetSink(contract, tmp_path / "shard") as sink:
        _, outcomes = rollout(sink, factory, num_envs=2, rounds=1, max_steps=6)
    dataset = load(sink.report.parts[0])
    assert dataset.meta.features["action"]["dtype"] == "int64"
    assert check_episodes(dataset) == [o.steps for o in outcomes]
    actions = np.asarray(dataset.hf_dataset.with_format("numpy")[:]["action"])
    assert actions.dtype == np.int64
    assert set(actions.reshape(-1).tolist()) <= {0, 1, 2}
    # the probe's reward is its action: the stored action is the one the env was given
    np.testing.assert_array_equal(
        actions.reshape(-1), dataset.hf_dataset.with_format("numpy")[:]["next.reward"].reshape(-1)
    )
    assert str(dataset[0]["action"].dtype) == "torch.int64"


def test_an_integer_action_is_rounded_as_the_sim_rounds_it() -> None:
    contract = Contract(
        control_rate=5,
        features={
            "pos": Feature(role="observation", dtype="float32", shape=(1,)),
            "action": Feature(role="action", dtype="int64", shape=(2,)),
        },
    )
    layout = DatasetLayout.build(contract)
    assert layout.lerobot_features()["action"]["dtype"] == "int64"
    recorded = Frame(0, {"pos": np.zeros(1, np.float32)}, np.array([1.6, 0.4], np.float32), 0.0, False, False, False)
    action = layout.lerobot_frame(recorded)["action"]
    assert action.dtype == np.int64
    assert action.tolist() == [2, 0]


def test_an_action_beyond_the_contracts_bounds_is_stored_as_the_sim_applied_it() -> None:
    """The sim clips a continuous action into the contract's bounds (``sim.bounds: clip``) before the env sees it:
    the dataset stored the policy's own action, which did not produce the next observation."""
    import gymnasium as gym

    from hud_pipelines.sim.actions import ActionAdapter

    action_feature = Feature(role="action", dtype="float32", shape=(2,), low=[-2.0, -1.0], high=[2.0, 1.0])
    contract = Contract(
        control_rate=5,
        features={"pos": Feature(role="observation", dtype="float32", shape=(1,)), "action": action_feature},
    )
    asked = np.array([3.0, -0.5], np.float32)
    space = gym.spaces.Box(low=np.array([-2, -1], np.float32), high=np.array([2, 1], np.float32), dtype=np.float32)
    applied, refused = ActionAdapter(action_feature, space, 1).validate(asked[None], np.array([True]), str)
    assert refused == {}
    recorded = Frame(0, {"pos": np.zeros(1, np.float32)}, asked, 0.0, False, False, False)
    stored = DatasetLayout.build(contract).lerobot_frame(recorded)["action"]
    assert stored.tolist() == applied[0].tolist() == [2.0, -0.5]


# -- 5. robot type ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("robot_type", "factory", "expected"),
    [
        ("make", "envs/camera_pendulum.py:make", "camera_pendulum.make"),
        ("make", "envs.camera_pendulum:make", "camera_pendulum.make"),
        ("so100", "envs.camera_pendulum:make", "so100"),
        ("CartPole-v1", "CartPole-v1", "CartPole-v1"),
        ("unknown", "gym_pusht/PushT-v0", "gym_pusht/PushT-v0"),
        ("", None, "unknown"),
        ("aloha", None, "aloha"),
    ],
)
def test_dataset_robot_type_never_is_a_bare_function_name(robot_type: str, factory: str | None, expected: str) -> None:
    assert dataset_robot_type(robot_type, factory) == expected


def test_a_pipeline_shard_names_the_factory_not_its_function(tmp_path: Path) -> None:
    factory = "envs.faulty:probe"
    contract = contract_of(factory)
    assert contract.robot_type == "ProbeEnv"  # the sim names the env, not the factory's function
    policy = '{kind: scripted, target: "envs.controllers:CartPolePD"}'
    text = f"name: probe\nsim:\n  factory: {factory}\nagent:\n  policy: {policy}\n"
    spec = load_pipeline_text(text, source=tmp_path / "probe.yaml")
    store = ShardStore(EvalOutputs(tmp_path / "outputs", spec.name), spec, run_id="run")
    sink = store.sink("task0-i0", contract)
    with sink:
        rollout(sink, factory, num_envs=1, rounds=1, max_steps=3)
    assert load(sink.report.parts[0]).meta.robot_type == "ProbeEnv"


def test_publishing_says_whether_no_instance_ran_or_every_episode_errored(tmp_path: Path) -> None:
    factory = "envs.faulty:probe"
    text = f"name: probe\nsim:\n  factory: {factory}\nagent:\n  policy: {{kind: constant}}\n"
    spec = load_pipeline_text(text, source=tmp_path / "probe.yaml")
    store = ShardStore(EvalOutputs(tmp_path / "outputs", spec.name), spec, run_id="run")
    current = {"task0-i0": unreached_result(spec, Partition(0, 0), "ran", Fault.ENV, run_id="run")}
    with pytest.raises(HudPipelinesError, match="no instance of this configuration has run yet; run the rollouts"):
        store.publish(tmp_path / "dataset", current)
    sink = store.sink("task0-i0", contract_of(factory))
    with sink:
        sink.begin(key(0), "")
        sink.end(key(0), errored("policy failed: boom", 0, 0.0, Fault.POLICY))
    store.commit("task0-i0")
    with pytest.raises(HudPipelinesError, match=r"every episode of the 1 instance\(s\) that ran errored.*keep_errored"):
        store.publish(tmp_path / "dataset", current)
    stale = r"has run yet \(1 instance\(s\) have only the shard of another run or configuration\)"
    with pytest.raises(HudPipelinesError, match=stale):  # a stale result: the grades say not_run
        store.publish(tmp_path / "dataset", {})
    later = {"task0-i0": unreached_result(spec, Partition(0, 0), "ran", Fault.ENV, run_id="later")}
    with pytest.raises(HudPipelinesError, match=stale):  # a later run wrote the result, and no shard
        store.publish(tmp_path / "dataset", later)
    assert not (tmp_path / "dataset").exists()


# -- 7. no progress bars --------------------------------------------------------------------------------


def test_writing_and_merging_print_no_progress_bars(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    with DatasetBuild(tmp_path / "quiet", SPEC, fps=10) as build:
        for instance in range(2):
            write_episodes(build.sink(f"instance-{instance}"), 2, instance=instance)
        build.publish()
    err = capfd.readouterr().err
    assert load(tmp_path / "quiet").num_episodes == 4
    assert "it/s" not in err
    assert "\r" not in err


def test_a_dataset_of_the_same_shards_and_settings_is_not_published_again(tmp_path: Path) -> None:
    """A sweep publishes every checkpoint's dataset on every run: one whose instances' shards (by the run that
    wrote each) and settings are those it was merged from stays as it is; a new shard publishes it anew."""
    factory = "envs.faulty:probe"
    text = f"name: probe\nsim:\n  factory: {factory}\nagent:\n  policy: {{kind: constant}}\n"
    spec = load_pipeline_text(text, source=tmp_path / "probe.yaml")
    outputs = EvalOutputs(tmp_path / "outputs", spec.name)
    target = tmp_path / "dataset"

    def run(run_id: str) -> tuple[ShardStore, dict[str, Any]]:
        store = ShardStore(outputs, spec, run_id=run_id)
        with store.sink("task0-i0", contract_of(factory)) as sink:
            rollout(sink, factory, num_envs=1, rounds=1, max_steps=3)
        store.commit("task0-i0")
        return store, {"task0-i0": unreached_result(spec, Partition(0, 0), "a stand-in", Fault.ENV, run_id=run_id)}

    store, current = run("first")
    assert store.publish(target, current)
    (target / "meta" / "left_by_a_test").write_text("")
    assert not store.publish(target, current), "the same shards and settings: nothing to merge again"
    assert (target / "meta" / "left_by_a_test").is_file()
    assert store.summary(target).episodes == 1
    store, current = run("second")  # the instance ran again: its shard is another
    assert store.publish(target, current)
    assert not (target / "meta" / "left_by_a_test").exists(), "merged anew and swapped in"
