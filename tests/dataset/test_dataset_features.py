"""Contract -> LeRobot features, on literal contracts and frames (no dataset is written here)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.features import ERRORED, DatasetLayout
from hud_pipelines.errors import ContractError
from hud_pipelines.recording.events import Frame
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions


def _contract(**extra: Feature) -> Contract:
    features = {
        "pixels": Feature(role="observation", type=FeatureType.RGB, dtype="uint8", shape=(4, 6, 3)),
        "agent_pos": Feature(role="observation", dtype="float64", shape=(2,), names=["x", "y"]),
        **extra,
        "action": Feature(role="action", dtype="float32", shape=(2,), names=["ax", "ay"]),
    }
    return Contract(control_rate=10.0, robot_type="pusher", features=features)


def _frame(observation: dict[str, Any], action: Any = (0.5, -0.5), **kw: Any) -> Frame:
    values = {"reward": 1.5, "terminated": False, "truncated": True, "success": True} | kw
    return Frame(index=0, observation=observation, action=np.asarray(action, dtype=np.float32), **values)


def test_contract_maps_to_lerobot_keys_shapes_and_names() -> None:
    velocity = Feature(role="observation", dtype="float32", shape=(3,))
    layout = DatasetLayout.build(_contract(**{"body/vel": velocity}))
    features = layout.lerobot_features()
    assert list(features) == [
        "observation.images.pixels",
        "observation.state",
        "action",
        "next.reward",
        "next.done",
        "next.success",
    ]
    assert features["observation.images.pixels"] == {
        "dtype": "video",
        "shape": (4, 6, 3),
        "names": ["height", "width", "channels"],
    }
    # Every non-camera observation feature is state, concatenated in contract order.
    assert features["observation.state"]["shape"] == (5,)
    assert features["observation.state"]["names"] == ["x", "y", "body_vel_0", "body_vel_1", "body_vel_2"]
    assert features["action"]["names"] == ["ax", "ay"]
    assert (layout.fps, layout.robot_type) == (10, "pusher")


def test_frame_conversion_concatenates_state_and_copies_pixels() -> None:
    layout = DatasetLayout.build(_contract())
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    out = layout.lerobot_frame(_frame({"pixels": pixels, "agent_pos": np.array([1.0, 2.0])}))
    assert out["observation.state"].dtype == np.float32
    np.testing.assert_array_equal(out["observation.state"], [1.0, 2.0])
    np.testing.assert_array_equal(out["observation.images.pixels"], pixels)
    pixels[:] = 0  # the caller's buffer may be reused; the recorded frame must not change
    assert out["observation.images.pixels"].any()
    assert out["next.reward"].tolist() == [1.5]
    assert out["next.done"].tolist() == [True]
    assert out["next.success"].tolist() == [True]
    np.testing.assert_array_equal(out["action"], [0.5, -0.5])


def test_state_features_option_splits_other_vectors_out() -> None:
    extra = {"goal": Feature(role="observation", dtype="int64", shape=(2,))}
    options = DatasetOptions(state_features=["agent_pos"])
    layout = DatasetLayout.build(_contract(**extra), options)
    features = layout.lerobot_features()
    assert features["observation.state"]["names"] == ["x", "y"]
    assert features["observation.goal"] == {"dtype": "int64", "shape": (2,), "names": ["goal_0", "goal_1"]}
    frame = _frame({"pixels": np.zeros((4, 6, 3), np.uint8), "agent_pos": np.zeros(2), "goal": np.array([3, 4])})
    assert layout.lerobot_frame(frame)["observation.goal"].tolist() == [3, 4]

    with pytest.raises(ContractError, match="'nope'"):
        DatasetLayout.build(_contract(), DatasetOptions(state_features=["nope"]))


def test_an_integer_that_float32_would_round_keeps_its_own_key_and_dtype_unless_state_features_says() -> None:
    """A tick counting from 33554433 was concatenated into observation.state's float32 and read 33554432 twice."""
    ticks = Feature(role="observation", dtype="int64", shape=(1,), low=[0], high=[2.0**40])
    small = Feature(role="observation", dtype="int64", shape=(1,), low=[0], high=[2.0**24])
    unbounded = Feature(role="observation", dtype="int32", shape=(1,))
    cells = Feature(role="observation", dtype="uint8", shape=(2,))  # 8 bits: float32 holds every value
    layout = DatasetLayout.build(_contract(tick=ticks, small=small, count=unbounded, cells=cells))
    features = layout.lerobot_features()
    assert features["observation.state"]["names"] == ["x", "y", "small_0", "cells_0", "cells_1"]
    assert features["observation.tick"]["dtype"] == "int64"
    assert features["observation.count"]["dtype"] == "int32"
    observation = {"pixels": np.zeros((4, 6, 3), np.uint8), "agent_pos": np.zeros(2), "cells": np.array([1, 2])}
    frame = _frame(observation | {"tick": np.array([33554433]), "small": np.array([7]), "count": np.array([5])})
    assert layout.lerobot_frame(frame)["observation.tick"].tolist() == [33554433]
    asked = DatasetLayout.build(_contract(tick=ticks), DatasetOptions(state_features=["agent_pos", "tick"]))
    assert asked.lerobot_features()["observation.state"]["names"] == ["x", "y", "tick_0"], "as the YAML says"


@pytest.mark.parametrize(
    ("kind", "shape", "pixel", "stored"),
    [
        (FeatureType.RGB, (2, 2, 4), [10, 20, 30, 255], [10, 20, 30]),
        (FeatureType.BGR, (2, 2, 3), [10, 20, 30], [30, 20, 10]),
        (FeatureType.GRAY, (2, 2, 1), [77], [77, 77, 77]),
    ],
)
def test_camera_types_are_stored_as_rgb(
    kind: FeatureType, shape: tuple[int, ...], pixel: list[int], stored: list[int]
) -> None:
    camera = Feature(role="observation", type=kind, dtype="uint8", shape=shape)
    contract = Contract(
        control_rate=5, features={"cam": camera, "action": Feature(role="action", dtype="float32", shape=(1,))}
    )
    layout = DatasetLayout.build(contract)
    assert layout.lerobot_features()["observation.images.cam"]["shape"] == (2, 2, 3)
    image = np.broadcast_to(np.asarray(pixel, dtype=np.uint8), shape).copy()
    out = layout.lerobot_frame(_frame({"cam": image}, action=[0.0]))["observation.images.cam"]
    assert out.shape == (2, 2, 3)
    assert out[0, 0].tolist() == stored


def test_float_pixels_become_uint8_and_depth_is_a_depth_map() -> None:
    contract = Contract(
        control_rate=5,
        features={
            "rgb": Feature(role="observation", type=FeatureType.RGB, dtype="float32", shape=(2, 2, 3)),
            "depth": Feature(role="observation", type=FeatureType.DEPTH, dtype="float32", shape=(2, 2)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )
    layout = DatasetLayout.build(contract, DatasetOptions(cameras=CameraStorage.IMAGE))
    features = layout.lerobot_features()
    assert features["observation.images.depth"]["info"] == {"is_depth_map": True}
    assert features["observation.images.depth"]["shape"] == (2, 2, 1)
    assert features["observation.images.rgb"]["dtype"] == "image"
    out = layout.lerobot_frame(_frame({"rgb": np.full((2, 2, 3), 1.0, np.float32), "depth": np.ones((2, 2))}, [0]))
    assert out["observation.images.rgb"].dtype == np.uint8
    assert out["observation.images.rgb"].max() == 255
    assert out["observation.images.depth"].shape == (2, 2, 1)


@pytest.mark.parametrize("kind", [FeatureType.RGB, FeatureType.BGR, FeatureType.GRAY])
def test_odd_video_cameras_are_stored_padded_to_an_even_size_and_declared_so(kind: FeatureType) -> None:
    """4:2:0 video cannot be odd: the frames lerobot gets (and decodes) are one edge pixel larger."""
    shape = (5, 7) if kind is FeatureType.GRAY else (5, 7, 3)
    contract = Contract(
        control_rate=5,
        features={
            "cam": Feature(role="observation", type=kind, dtype="uint8", shape=shape),
            "depth": Feature(role="observation", type=FeatureType.DEPTH, dtype="float32", shape=(5, 7)),
            "action": Feature(role="action", dtype="float32", shape=(1,)),
        },
    )
    image = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
    frame = _frame({"cam": image, "depth": np.ones((5, 7))}, action=[0.0])

    video = DatasetLayout.build(contract)
    assert video.lerobot_features()["observation.images.cam"]["shape"] == (6, 8, 3)
    assert video.lerobot_features()["observation.images.depth"]["shape"] == (5, 7, 1)  # no chroma to subsample
    out = video.lerobot_frame(frame)
    stored = out["observation.images.cam"]
    assert stored.shape == (6, 8, 3)
    assert stored.flags.c_contiguous
    np.testing.assert_array_equal(stored[5], stored[4])  # the last row again
    np.testing.assert_array_equal(stored[:, 7], stored[:, 6])  # the last column again
    unpadded = DatasetLayout.build(contract, DatasetOptions(cameras=CameraStorage.IMAGE))
    np.testing.assert_array_equal(stored[:5, :7], unpadded.lerobot_frame(frame)["observation.images.cam"])
    assert unpadded.lerobot_features()["observation.images.cam"]["shape"] == (5, 7, 3)  # PNGs keep their size
    assert out["observation.images.depth"].shape == (5, 7, 1)


def test_plain_dict_spec_with_lerobot_dtypes_and_missing_shapes() -> None:
    spec = {
        "features": {
            "front": {"dtype": "video"},
            "wrist": {"dtype": "image", "shape": [3, 3, 3]},
            "qpos": {"names": ["a", "b", "c"]},
            "action": {"shape": [2]},
        },
        "fps": 15,
        "robot_type": "arm",
    }
    layout = DatasetLayout.build(spec)
    assert layout.missing_shapes == ["front", "qpos"]
    with pytest.raises(ContractError, match="unknown until the first frame"):
        layout.lerobot_features()
    observation = {"front": np.zeros((8, 10, 3), np.uint8), "wrist": np.zeros((3, 3, 3), np.uint8), "qpos": np.ones(3)}
    complete = layout.with_shapes_from(observation, np.zeros(2, np.float32))
    features = complete.lerobot_features()
    assert features["observation.images.front"]["dtype"] == "video"
    assert features["observation.images.front"]["shape"] == (8, 10, 3)
    assert features["observation.images.wrist"]["dtype"] == "image"  # the spec's own storage wins
    assert features["observation.state"] == {"dtype": "float32", "shape": (3,), "names": ["a", "b", "c"]}
    assert (complete.fps, complete.robot_type) == (15, "arm")


def test_missing_dtype_means_float32() -> None:
    layout = DatasetLayout.build(
        {"pos": {"shape": [2]}, "aux": {"shape": [1]}, "action": {"shape": [1]}},
        fps=10,
        options=DatasetOptions(state_features=["pos"]),
    )
    assert layout.lerobot_features()["observation.aux"]["dtype"] == "float32"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"a/b": {"shape": [1]}, "a_b": {"shape": [1]}, "action": {"shape": [1]}}, "both map to"),
        ({"x": {"shape": [1], "colour": 1}, "action": {"shape": [1]}}, "unknown keys"),
        ({"x": {"shape": [1], "dtype": "complex64"}, "action": {"shape": [1]}}, "not bool, int or float"),
        ({"x": {"shape": [1], "type": "lidar"}, "action": {"shape": [1]}}, "'lidar' is not one of"),
        ({"x": {"shape": [0]}, "action": {"shape": [1]}}, "positive ints"),
        ({"x": {"shape": [1]}}, "exactly one action"),
    ],
)
def test_bad_specs_name_the_culprit(spec: dict[str, Any], message: str) -> None:
    options = DatasetOptions(state_features=[]) if "a/b" in spec else None
    with pytest.raises(ContractError, match=message):
        DatasetLayout.build(spec, options, fps=10)


def test_frames_that_do_not_match_the_contract_name_the_feature() -> None:
    layout = DatasetLayout.build(_contract())
    with pytest.raises(ContractError, match="'agent_pos' is missing"):
        layout.lerobot_frame(_frame({"pixels": np.zeros((4, 6, 3), np.uint8)}))
    with pytest.raises(ContractError, match=r"'pixels' has shape \[4, 6, 4\]"):
        layout.lerobot_frame(_frame({"pixels": np.zeros((4, 6, 4), np.uint8), "agent_pos": np.zeros(2)}))
    with pytest.raises(ContractError, match="action has 3 values"):
        layout.lerobot_frame(_frame({"pixels": np.zeros((4, 6, 3), np.uint8), "agent_pos": np.zeros(2)}, [1, 2, 3]))


def test_keep_errored_declares_the_flag_and_fractional_rates_round(caplog: pytest.LogCaptureFixture) -> None:
    contract = _contract().model_copy(update={"control_rate": 66.6667})
    with caplog.at_level(logging.WARNING):
        layout = DatasetLayout.build(contract, DatasetOptions(keep_errored=True))
    assert layout.fps == 67
    assert "stored as fps 67" in caplog.text
    assert layout.lerobot_features()[ERRORED] == {"dtype": "bool", "shape": (1,), "names": None}


@pytest.mark.parametrize("setting", ["writers", "queued_episodes", "close_timeout_s"])
def test_writer_numbers_refuse_booleans_as_the_pipeline_file_does(setting: str) -> None:
    """``writers=True`` is a mistake, not one writer: the writer's settings follow the spec's number rules."""
    with pytest.raises(ValidationError, match="expected a number, got a boolean"):
        DatasetOptions.model_validate({setting: True})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        DatasetOptions(queued_episodes=0)


def test_an_av1_video_camera_narrower_than_svt_av1_encodes_is_refused_before_a_frame_is_written() -> None:
    """SVT-AV1 ended the whole process (SIGFPE) on a frame under 25 pixels wide: every grade of the run was lost."""
    from hud_pipelines.dataset.features import AV1_MIN_WIDTH
    from hud_pipelines.spec.dataset_options import CameraStorage, VideoCodec

    def camera(width: int, kind: FeatureType = FeatureType.RGB) -> Feature:
        shape = (32, width, 3 if kind is FeatureType.RGB else 1)
        return Feature(
            role="observation", type=kind, dtype="float32" if kind is FeatureType.DEPTH else "uint8", shape=shape
        )

    av1 = DatasetOptions(cameras=CameraStorage.VIDEO, codec=VideoCodec.AV1)
    said = rf"camera 'pixels' is {AV1_MIN_WIDTH - 1} pixels wide: codec libsvtav1 crashes the process"
    with pytest.raises(ContractError, match=said):
        DatasetLayout.build(_contract(pixels=camera(AV1_MIN_WIDTH - 1)), av1)
    DatasetLayout.build(_contract(pixels=camera(AV1_MIN_WIDTH + 1)), av1)  # padded to an even width: encodable
    DatasetLayout.build(_contract(pixels=camera(8)), DatasetOptions(cameras=CameraStorage.VIDEO))  # h264
    DatasetLayout.build(_contract(pixels=camera(8)), av1.model_copy(update={"cameras": CameraStorage.IMAGE}))
    DatasetLayout.build(_contract(pixels=camera(8, FeatureType.DEPTH)), av1)  # depth has its own codec
    with pytest.raises(ContractError, match=said):  # a gray camera is encoded as RGB
        DatasetLayout.build(_contract(pixels=camera(AV1_MIN_WIDTH - 1, FeatureType.GRAY)), av1)
    known = DatasetLayout.build(_contract(pixels=camera(64)), av1)
    unknown = dataclasses.replace(
        known, cameras=tuple(dataclasses.replace(c, source_shape=None) for c in known.cameras)
    )
    observation = {"pixels": np.zeros((32, 16, 3), np.uint8), "agent_pos": np.zeros(2)}
    with pytest.raises(ContractError, match="camera 'pixels' is 16 pixels wide"):
        unknown.with_shapes_from(observation, np.zeros(2, np.float32))
