"""The contract: derived from spaces and a sample, written once to an explicit path, edits survive."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from hud_pipelines.contract import (
    CAMERA_NAMES,
    DEFAULT_CONTROL_RATE,
    Contract,
    FeatureType,
    action_feature,
    control_rate_of,
    derive_contract,
    derive_env_contract,
    load_contract,
    merge_contract,
    refresh_contract,
    resolve_contract,
    state_images,
)
from hud_pipelines.errors import ContractError
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.spec.loader import refresh_hint

Box, Discrete, MultiDiscrete, MultiBinary = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def derive(space: gym.Space[Any], action: gym.Space[Any] | None = None, *, rate: float = 10.0) -> Contract:
    space.seed(0)
    return derive_contract(space, action or Box(-1, 1, (2,), np.float32), space.sample(), control_rate=rate)


def test_box_observation_is_one_state_feature_with_default_names() -> None:
    contract = derive(Box(-np.inf, np.inf, (4,), np.float32))
    state = contract.features["state"]
    assert (state.role, state.type, state.dtype, state.shape) == ("observation", FeatureType.STATE, "float32", (4,))
    assert state.names == ["state_0", "state_1", "state_2", "state_3"]
    assert state.low is None  # infinite bounds stay out of the file
    assert list(contract.state_features) == ["state"]
    assert contract.cameras == {}


def test_discrete_multidiscrete_multibinary_observations() -> None:
    contract = derive(gym.spaces.Dict({"d": Discrete(5, start=2), "md": MultiDiscrete([3, 4]), "mb": MultiBinary(3)}))
    d, md, mb = contract.features["d"], contract.features["md"], contract.features["mb"]
    assert (d.dtype, d.shape, d.low, d.high) == ("int64", (1,), [2.0], [6.0])
    assert (md.dtype, md.shape, md.low, md.high) == ("int64", (2,), [0.0, 0.0], [2.0, 3.0])
    assert (mb.dtype, mb.shape, mb.low, mb.high) == ("int8", (3,), [0.0] * 3, [1.0] * 3)
    assert md.names == ["md_0", "md_1"]


def test_nested_dict_and_tuple_observations_are_flattened_with_slashes() -> None:
    leaves: dict[str, gym.Space[Any]] = {
        "robot": gym.spaces.Dict({"joints": Box(-1, 1, (3,), np.float32), "gripper": Discrete(2)}),
        "pair": gym.spaces.Tuple((Box(0, 1, (2,), np.float64), Discrete(4))),
        "camera": Box(0, 255, (8, 6, 3), np.uint8),
    }
    space: gym.Space[Any] = gym.spaces.Dict(leaves)
    contract = derive(space)
    assert set(contract.observation_features) == {"robot/joints", "robot/gripper", "pair/0", "pair/1", "camera"}
    joints = contract.features["robot/joints"]
    assert joints.names == ["robot/joints_0", "robot/joints_1", "robot/joints_2"]
    assert (joints.low, joints.high) == ([-1.0] * 3, [1.0] * 3)
    assert contract.features["pair/0"].dtype == "float64"
    assert contract.features["pair/1"].high == [3.0]
    assert list(contract.cameras) == ["camera"]


@pytest.mark.parametrize(
    ("shape", "dtype", "kind"),
    [
        ((96, 96, 3), np.uint8, FeatureType.RGB),
        ((64, 48, 4), np.uint8, FeatureType.RGB),
        ((32, 32, 1), np.uint8, FeatureType.GRAY),
        ((32, 32, 2), np.uint8, FeatureType.STATE),  # two channels is no camera
        ((32, 32, 3), np.float32, FeatureType.STATE),  # float images are not cameras by default
        ((32, 32), np.uint8, FeatureType.STATE),  # no channel axis
    ],
)
def test_cameras_are_hwc_uint8_with_1_3_or_4_channels(shape: tuple[int, ...], dtype: type, kind: FeatureType) -> None:
    contract = derive(Box(0, 255, shape, dtype))
    name = "image" if kind is not FeatureType.STATE else "state"
    feature = contract.features[name]
    assert feature.type is kind
    assert feature.shape == shape
    if kind.is_camera:
        assert feature.names == CAMERA_NAMES
        assert contract.cameras == {name: feature}


def test_an_observation_with_an_images_shape_read_as_state_is_warned_of_with_how_to_make_it_a_camera() -> None:
    space = gym.spaces.Dict(
        {
            "depth": Box(0, 10, (48, 64), np.float32),  # a float map with no channel axis
            "pixels": Box(0, 255, (3, 32, 32), np.uint8),  # channel-first
            "camera": Box(0, 255, (32, 32, 3), np.uint8),  # a camera: not warned of
            "poses": Box(-1, 1, (10, 3), np.float32),  # a table of ten objects
            "history": Box(-1, 1, (10, 39), np.float32),  # ten steps of proprioception
            "lidar": Box(0, 30, (16, 360), np.float32),  # a lidar's rings
            "joints": Box(-1, 1, (7,), np.float32),
        }
    )
    warned = state_images(derive(space))
    assert len(warned) == 2, warned
    depth, pixels = sorted(warned)
    assert depth.startswith("observation 'depth' (float32 [48, 64]) has an image's shape but is read as state (3072 ")
    assert "a camera must be a uint8 array of (height, width, channel)" in depth
    assert pixels.startswith("observation 'pixels' (uint8 [3, 32, 32])")
    assert "it is channel-first: give it as (height, width, channel) in the env" in pixels
    floats = state_images(derive(Box(0, 1, (3, 32, 32), np.float32)))
    assert "give it as (height, width, channel), as uint8 (0-255) rather than float32 in the env" in floats[0]


def test_a_uint8_grid_bounded_other_than_a_pixels_0_to_255_is_labels_kept_as_state_not_a_lossy_camera() -> None:
    """A grid world's ``Box(0, 10, (7, 7, 3), uint8)`` cells were typed rgb and stored as video: every value read 0."""
    grid = derive(Box(0, 10, (7, 7, 3), np.uint8)).features["state"]
    assert (grid.type, grid.shape, grid.high) == (FeatureType.STATE, (7, 7, 3), [10.0] * 147)
    space = gym.spaces.Dict(
        {
            "classes": Box(0, 20, (32, 32, 1), np.uint8),  # a segmentation's classes
            "camera": Box(0, 255, (32, 32, 3), np.uint8),
        }
    )
    contract = derive(space)
    assert contract.features["classes"].type is FeatureType.STATE
    assert contract.features["camera"].type is FeatureType.RGB
    (warned,) = state_images(contract)
    assert warned.startswith("observation 'classes' (uint8 [32, 32, 1]) has an image's shape but is read as state")
    assert "its space bounds it to 0-20, not a pixel's 0-255, so its values are kept exactly as labels" in warned
    assert derive(Box(0, 255, (7, 7, 3), np.uint8)).features["image"].type is FeatureType.RGB


def test_a_contract_file_types_a_uint8_image_a_camera_or_labels_whatever_its_bounds_said() -> None:
    """MiniGrid declares its grid 0-255 (read as a picture); another env declares a picture 0-250: the file decides."""
    grid = derive(Box(0, 255, (7, 7, 3), np.uint8))
    as_labels = grid.features["image"].model_copy(update={"type": FeatureType.STATE, "names": None})
    edited = grid.model_copy(update={"features": {**grid.features, "image": as_labels}})
    assert merge_contract(edited, grid, source="grid.json").features["image"].type is FeatureType.STATE
    picture = derive(Box(0, 250, (8, 8, 3), np.uint8))
    as_camera = picture.features["state"].model_copy(update={"type": FeatureType.RGB, "names": None})
    edited = picture.model_copy(update={"features": {**picture.features, "state": as_camera}})
    assert merge_contract(edited, picture, source="picture.json").features["state"].is_camera
    floats = derive(Box(0, 1, (8, 8, 3), np.float32))
    as_camera = floats.features["state"].model_copy(update={"type": FeatureType.RGB, "names": None})
    edited = floats.model_copy(update={"features": {**floats.features, "state": as_camera}})
    with pytest.raises(ContractError, match="a camera must be a uint8 array"):
        merge_contract(edited, floats, source="floats.json")


class _DeclaredEnv:
    """Stands for an env whose spaces are declared apart from what it returns."""

    def __init__(self, observation_space: gym.Space[Any]) -> None:
        self.observation_space = observation_space
        self.metadata = {"robot_type": "declared"}


def test_an_observation_space_that_disagrees_with_the_observation_is_warned_of_naming_the_feature_and_both_shapes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    liar = Box(-1, 1, (4,), np.float32)
    with caplog.at_level(logging.WARNING, logger="hud_pipelines.contract"):
        derived = derive_env_contract(_DeclaredEnv(liar), liar, Box(-1, 1, (1,)), np.zeros(5), fallback_name="f")
    assert derived.contract.features["state"].shape == (5,)  # the contract follows the observation
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "env declared: its observation_space declares 'state' with shape (4,), but its observation has shape (5,)"
    )
    caplog.clear()
    nested = gym.spaces.Dict({"joints": Box(-1, 1, (7,)), "camera": Box(0, 255, (8, 8, 3), np.uint8)})
    sample = {"joints": np.zeros(7), "camera": np.zeros((3, 8, 8), np.uint8)}
    with caplog.at_level(logging.WARNING, logger="hud_pipelines.contract"):
        derive_env_contract(_DeclaredEnv(nested), nested, Box(-1, 1, (1,)), sample, fallback_name="f")
    assert [r.getMessage().split(":")[1] for r in caplog.records] == [
        " its observation_space declares 'camera' with shape (8, 8, 3), but its observation has shape (3, 8, 8)"
    ]
    caplog.clear()
    nested.seed(0)
    with caplog.at_level(logging.WARNING, logger="hud_pipelines.contract"):
        derive_env_contract(_DeclaredEnv(nested), nested, Box(-1, 1, (1,)), nested.sample(), fallback_name="f")
        derive_env_contract(_DeclaredEnv(Discrete(3)), Discrete(3), Discrete(2), np.int64(1), fallback_name="f")
        one = Box(-1, 1, (1,))  # a scalar observation is read as the one value the space declares
        derive_env_contract(_DeclaredEnv(one), one, Discrete(2), np.float32(0.5), fallback_name="f")
    assert caplog.records == []


def test_action_features() -> None:
    box = action_feature(Box(np.array([-1, -2, -3]), np.array([1, 2, 3]), dtype=np.float32))
    assert (box.role, box.dtype, box.shape, box.low, box.high) == ("action", "float32", (3,), [-1, -2, -3], [1, 2, 3])
    assert box.names == ["action_0", "action_1", "action_2"]
    assert action_feature(Box(-1, 1, (2, 2), np.float64)).shape == (4,)
    discrete = action_feature(Discrete(3, start=-1))
    assert (discrete.dtype, discrete.shape, discrete.low, discrete.high) == ("int64", (1,), [-1.0], [1.0])
    assert action_feature(MultiDiscrete([2, 5])).high == [1.0, 4.0]
    assert action_feature(MultiBinary(4)).shape == (4,)
    with pytest.raises(ContractError, match="unsupported action space Dict"):
        action_feature(gym.spaces.Dict({"a": Discrete(2)}))


def test_derivation_refuses_bad_observations() -> None:
    with pytest.raises(ContractError, match="may not be called 'action'"):
        derive_contract(None, Discrete(2), {"action": np.zeros(2)}, control_rate=1)
    with pytest.raises(ContractError, match="'state' has dtype <U3"):
        derive_contract(None, Discrete(2), np.array(["abc"]), control_rate=1)
    # an empty feature passed grading, then broke the dataset's statistics with "cannot reshape array of size 0"
    with pytest.raises(ContractError, match=r"observation 'b' has shape \[2, 0\], which holds no value"):
        derive_contract(None, Discrete(2), {"a": np.zeros(2), "b": np.zeros((2, 0))}, control_rate=1)
    with pytest.raises(ContractError, match="holds no value: a policy would have nothing to give"):
        derive_contract(None, Box(-1, 1, (0,)), np.zeros(2), control_rate=1)


def test_control_rate_from_render_fps_then_dt_then_default() -> None:
    assert control_rate_of(SimpleNamespace(metadata={"render_fps": 50}, dt=0.5)) == 50.0
    assert control_rate_of(SimpleNamespace(metadata={}, dt=0.04)) == pytest.approx(25.0)
    assert control_rate_of(SimpleNamespace(metadata={}, unwrapped=SimpleNamespace(dt=0.1))) == pytest.approx(10.0)
    assert control_rate_of(SimpleNamespace(metadata={"render_fps": None})) == DEFAULT_CONTROL_RATE
    vector = SimpleNamespace(metadata={"autoreset_mode": "next"})
    assert control_rate_of(vector, SimpleNamespace(dt=0.02)) == pytest.approx(50.0)
    assert control_rate_of(gym.make("CartPole-v1")) == 50.0
    assert control_rate_of(gym.make("InvertedPendulum-v5")) == pytest.approx(25.0)


# ---------------------------------------------------------------------------------------------
# the file


def cartpole_contract() -> Contract:
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=0)
    return derive_contract(env.observation_space, env.action_space, observation, control_rate=control_rate_of(env))


def test_without_a_path_nothing_touches_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    derived = cartpole_contract()
    assert resolve_contract(derived, None) is derived
    with GymBridge("CartPole-v1") as bridge:
        bridge.reset([{"seed": 0}])
    assert os.listdir(tmp_path) == []


def test_first_run_writes_the_file_later_runs_keep_the_edits(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "contract.json"
    derived = cartpole_contract()
    assert resolve_contract(derived, path) == derived
    raw = json.loads(path.read_text())
    raw["robot_type"] = "cart_pole"
    raw["control_rate"] = 25.0
    raw["features"]["state"]["names"] = ["x", "x_dot", "theta", "theta_dot"]
    raw["features"]["state"]["description"] = "cart position and pole angle"
    raw["features"]["action"]["names"] = ["push_right"]
    raw["features"]["action"]["description"] = "0 pushes left, 1 pushes right"
    edited_text = json.dumps(raw, indent=4)  # the user's own formatting
    path.write_text(edited_text)

    merged = resolve_contract(cartpole_contract(), path)
    assert merged.robot_type == "cart_pole"
    assert merged.control_rate == 25.0
    assert merged.features["state"].names == ["x", "x_dot", "theta", "theta_dot"]
    assert merged.features["state"].description == "cart position and pole angle"
    assert merged.action.names == ["push_right"]
    assert path.read_text() == edited_text  # nothing to add: the file is left as the user wrote it


def test_an_edited_type_survives_and_a_missing_feature_is_added_back(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    space = gym.spaces.Dict({"camera": Box(0, 255, (8, 8, 3), np.uint8), "pos": Box(-1, 1, (2,), np.float32)})
    derived = derive(space)
    resolve_contract(derived, path)
    raw = json.loads(path.read_text())
    raw["features"]["camera"]["type"] = "bgr"
    del raw["features"]["pos"]
    path.write_text(json.dumps(raw))
    merged = resolve_contract(derive(space), path)
    assert merged.features["camera"].type is FeatureType.BGR
    assert merged.features["pos"] == derived.features["pos"]
    assert "pos" in load_contract(path).features  # written back because the merge added it


def test_action_bounds_edited_wider_than_the_envs_space_are_refused_narrower_ones_kept(tmp_path: Path) -> None:
    """Before, bounds widened to [-10, 10] over an env's [-1, 1] were taken: the env got 5.0, its space said
    no action beyond 1 exists, and actions are clipped to the file's bounds."""
    path = tmp_path / "contract.json"
    space, action = gym.spaces.Dict({"pos": Box(-1, 1, (2,), np.float32)}), Box(-1, 1, (2,), np.float32)
    resolve_contract(derive(space, action), path)
    raw = json.loads(path.read_text())
    raw["features"]["action"] |= {"low": [-0.5, -1.0], "high": [0.5, 1.0]}  # a gentler controller: kept
    path.write_text(json.dumps(raw))
    assert resolve_contract(derive(space, action), path).action.high == [0.5, 1.0]
    raw["features"]["action"] |= {"low": [-10.0, -1.0], "high": [10.0, 1.0]}
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError) as caught:
        resolve_contract(derive(space, action), path)
    message = str(caught.value)
    assert message.startswith(f"{path}: feature 'action' has action bounds wider than the env's action space ")
    assert "([0] low -10 < -1, [0] high 10 > 1)" in message


def test_a_channel_first_image_or_a_float_map_typed_a_camera_in_the_file_is_refused_saying_why(tmp_path: Path) -> None:
    """Typed ``rgb`` or ``depth`` by hand, the error read "has 3 names for 9216 values": nothing about what a
    camera must be, nor that the image was channel-first."""
    Box = gym.spaces.Box
    space = gym.spaces.Dict({"image": Box(0, 255, (3, 48, 64), np.uint8), "depth": Box(0, 10, (48, 64, 1), np.float32)})
    path = tmp_path / "contract.json"
    resolve_contract(derive(space), path)
    raw = json.loads(path.read_text())
    assert {raw["features"][n]["type"] for n in ("image", "depth")} == {"state"}, "neither is a uint8 HWC camera"
    refused = {
        "image": (
            {"type": "rgb", "names": ["height", "width", "channel"]},
            r"'image' is typed rgb .* uint8\[3, 48, 64\], which is read as state \(9216 values\): it is "
            r"channel-first: give it as \(height, width, channel\)",
        ),
        "depth": (
            {"type": "depth"},
            r"'depth' is typed depth .* float32\[48, 64, 1\], which is read as state \(3072 values\): a camera "
            r"must be a uint8 array of \(height, width, channel\)",
        ),
    }
    for name, (edit, said) in refused.items():
        edited = json.loads(json.dumps(raw))
        edited["features"][name] |= edit
        path.write_text(json.dumps(edited))
        with pytest.raises(ContractError, match=said):
            resolve_contract(derive(space), path)


def test_a_shape_change_names_the_feature_the_file_and_both_shapes(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    resolve_contract(derive(gym.spaces.Dict({"joints": Box(-1, 1, (3,), np.float32)})), path)
    with pytest.raises(ContractError) as caught:
        resolve_contract(derive(gym.spaces.Dict({"joints": Box(-1, 1, (7,), np.float32)})), path)
    message = str(caught.value)
    assert str(path) in message
    assert "'joints'" in message
    assert "float32[3] in the contract file" in message
    assert "float32[7] in the env" in message


def test_a_dtype_change_or_a_vanished_feature_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    resolve_contract(derive(gym.spaces.Dict({"a": Box(-1, 1, (3,), np.float32), "b": Discrete(2)})), path)
    with pytest.raises(
        ContractError, match=r"'a' is observation float32\[3\] in the contract file but observation float64\[3\]"
    ):
        resolve_contract(derive(gym.spaces.Dict({"a": Box(-1, 1, (3,), np.float64), "b": Discrete(2)})), path)
    with pytest.raises(ContractError, match=r"features \['b'\] are in the contract file but not in the env"):
        resolve_contract(derive(gym.spaces.Dict({"a": Box(-1, 1, (3,), np.float32)})), path)


def test_wrong_name_count_bad_json_and_unknown_keys_are_errors_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    derived = cartpole_contract()
    raw = json.loads(derived.to_json())
    raw["features"]["state"]["names"] = ["x", "theta"]
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="'state' has 2 names for 4 values"):
        resolve_contract(derived, path)
    path.write_text('{\n  "control_rate": 50,\n  "features": {,}\n}')
    with pytest.raises(ContractError, match=f"{path}:3:.*not valid JSON"):
        resolve_contract(derived, path)
    raw = json.loads(derived.to_json())
    raw["features"]["state"]["colour"] = "blue"
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=f"{path}: invalid contract: features.state.colour"):
        resolve_contract(derived, path)
    raw = json.loads(derived.to_json())
    raw["features"]["state"]["shape"] = [0]
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=r"features.state.shape.*\[0\] holds no value"):
        resolve_contract(derived, path)
    raw = json.loads(derived.to_json())
    raw["features"]["state"]["dtype"] = "flaot32"  # a typo that failed later, in the sim, naming nothing
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=r"features.state.dtype: .*'flaot32' is not a numpy dtype"):
        resolve_contract(derived, path)
    raw = json.loads(derived.to_json())
    raw["features"]["state"]["description"] = "posici\u00f3n"  # saved by an editor set to Latin-1
    path.write_bytes(json.dumps(raw, ensure_ascii=False).encode("latin-1"))
    with pytest.raises(ContractError, match=f"{path}: not UTF-8 text"):  # a UnicodeDecodeError traceback
        resolve_contract(derived, path)


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ({"action": {"low": [2.0], "high": [1.0]}}, r"features.action: .*low \[0\] 2 is above high \[0\] 1"),
        ({"action": {"low": [0.0, 0.0]}}, r"features.action: .*2 low bounds for 1 values"),
        ({"state": {"high": [1.0, 1.0, 1.0]}}, r"features.state: .*3 high bounds for 4 values"),
        ({"action": {"high": [float("nan")]}}, r"features.action: .*high bound \[0\] is NaN"),
        ({"state": {"names": ["x", "x", "theta", "theta"]}}, r"features.state: .*names \['theta', 'x'\] stand twice"),
        ({"version": 2}, r"version: .*version 2 is not one this hud-pipelines reads"),
    ],
    ids=["low-above-high", "too-many-bounds", "too-few-bounds", "nan-bound", "names-twice", "newer-version"],
)
def test_a_contract_file_with_bounds_names_or_a_version_that_cannot_hold_is_refused_naming_it(
    tmp_path: Path, edit: dict[str, Any], error: str
) -> None:
    """Malformed bounds were taken as they stood: a low above its high clipped every action to the high."""
    path = tmp_path / "contract.json"
    derived = cartpole_contract()
    raw = json.loads(derived.to_json())
    for key, value in edit.items():
        if key in raw["features"]:
            raw["features"][key].update(value)
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=f"{path}: invalid contract: {error}"):
        resolve_contract(derived, path)


def test_unbounded_values_and_bounds_that_meet_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    derived = cartpole_contract()
    raw = json.loads(derived.to_json())
    raw["features"]["state"].update(low=[-1.0, float("-inf"), 0.0, 0.0], high=[1.0, float("inf"), 0.0, 2.0])
    path.write_text(json.dumps(raw))
    merged = resolve_contract(derived, path)
    state = merged.features["state"]
    assert state.low == [-1.0, float("-inf"), 0.0, 0.0]
    assert state.high == [1.0, float("inf"), 0.0, 2.0]
    path.write_text(merged.to_json())  # as `hud-pipelines contract` writes it: Infinity was written as null
    assert load_contract(path) == merged


def test_merge_keeps_edits_but_not_a_role_swap() -> None:
    derived = cartpole_contract()
    swapped = derived.model_copy(
        update={
            "features": {**derived.features, "state": derived.features["state"].model_copy(update={"role": "action"})}
        }
    )
    with pytest.raises(ContractError, match="'state' is action float32"):
        merge_contract(swapped, derived, source="edited.json")


# -- refreshing a file after the env changed ------------------------------------------------------


def edited_contract(contract: Contract, **features: dict[str, Any]) -> Contract:
    """``contract`` with the given per-feature edits, and a control rate and robot type set by hand."""
    raw = json.loads(contract.to_json())
    for name, edits in features.items():
        raw["features"][name].update(edits)
    raw["control_rate"] = 12.5
    raw["robot_type"] = "arm"
    return Contract.model_validate(raw)


def test_refresh_takes_the_new_shapes_and_keeps_the_edits_that_still_fit() -> None:
    before = derive(gym.spaces.Dict({"joints": Box(-1, 1, (3,), np.float32), "grip": Box(0, 1, (2,), np.float32)}))
    edited = edited_contract(
        before,
        joints={"names": ["shoulder", "elbow", "wrist"], "description": "joint angles"},
        grip={"names": ["left", "right"], "description": "finger gaps"},
        action={"names": ["vx", "vy"]},
    )
    after = derive(gym.spaces.Dict({"joints": Box(-1, 1, (7,), np.float32), "grip": Box(0, 1, (2,), np.float32)}))
    refreshed, changes = refresh_contract(edited, after)
    joints = refreshed.features["joints"]
    assert joints.shape == (7,)
    assert joints.names == after.features["joints"].names  # three names cannot name seven values
    assert joints.description == "joint angles"
    assert (joints.low, joints.high) == (after.features["joints"].low, after.features["joints"].high)
    assert refreshed.features["grip"] == edited.features["grip"]
    assert refreshed.action == edited.action
    assert (refreshed.control_rate, refreshed.robot_type) == (12.5, "arm")
    assert changes == ["joints: float32[3] -> float32[7] (names dropped: shoulder, elbow, wrist)"]
    merge_contract(refreshed, after, source="refreshed")  # what the eval accepts again


def test_refresh_reports_added_removed_and_dtype_changes_and_keeps_names_that_fit() -> None:
    before = derive(gym.spaces.Dict({"a": Box(-1, 1, (3,), np.float32), "gone": Discrete(2)}))
    edited = edited_contract(before, a={"names": ["x", "y", "z"]})
    after = derive(gym.spaces.Dict({"a": Box(-1, 1, (3,), np.float64), "new": Box(-1, 1, (2,), np.float32)}))
    refreshed, changes = refresh_contract(edited, after)
    assert refreshed.features["a"].names == ["x", "y", "z"]
    assert refreshed.features["a"].dtype == "float64"
    assert list(refreshed.features) == list(after.features)
    assert changes == [
        "a: float32[3] -> float64[3]",
        "new: added, observation float32[2]",
        "gone: removed, observation int64[1] (the env no longer has it)",
    ]


def test_refresh_of_a_resized_camera_keeps_its_edited_type_and_default_names_are_not_reported() -> None:
    before = derive(gym.spaces.Dict({"camera": Box(0, 255, (8, 8, 3), np.uint8), "pos": Box(-1, 1, (2,), np.float32)}))
    edited = edited_contract(before, camera={"type": "bgr"})
    after = derive(gym.spaces.Dict({"camera": Box(0, 255, (16, 16, 3), np.uint8), "pos": Box(-1, 1, (4,), np.float32)}))
    refreshed, changes = refresh_contract(edited, after)
    camera = refreshed.features["camera"]
    assert (camera.type, camera.shape, camera.names) == (FeatureType.BGR, (16, 16, 3), CAMERA_NAMES)
    assert refreshed.features["pos"].names == ["pos_0", "pos_1", "pos_2", "pos_3"]
    assert changes == ["camera: uint8[8, 8, 3] -> uint8[16, 16, 3]", "pos: float32[2] -> float32[4]"]


def test_refresh_of_a_contract_that_still_fits_changes_nothing() -> None:
    edited = edited_contract(cartpole_contract(), state={"names": ["x", "v", "theta", "omega"]})
    assert refresh_contract(edited, cartpole_contract()) == (edited, [])


def test_a_stale_file_is_refused_and_its_hint_names_the_command_of_each_pipeline_that_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HUD_PIPELINES_DIR", raising=False)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    body = {
        "sim": {"factory": "CartPole-v1", "contract": "contracts/arm.json"},
        "agent": {"policy": {"kind": "random"}},
    }
    (pipelines / "arm.yaml").write_text(json.dumps({"name": "arm", **body}))
    (pipelines / "arm_v2.yaml").write_text(json.dumps({"name": "arm_again", **body}))  # name and file differ
    (pipelines / "other.yaml").write_text(json.dumps({**body, "name": "other", "sim": {"factory": "CartPole-v1"}}))
    (pipelines / "broken.yaml").write_text("name: [")
    path = pipelines / "contracts" / "arm.json"
    resolve_contract(derive(gym.spaces.Dict({"joints": Box(-1, 1, (3,), np.float32)})), path)
    with pytest.raises(ContractError) as caught:
        resolve_contract(derive(gym.spaces.Dict({"joints": Box(-1, 1, (7,), np.float32)})), path)
    message = str(caught.value)
    assert "feature 'joints' is observation float32[3] in the contract file but observation float32[7] in the env" in (
        message
    )
    assert "fix the file or delete it to derive it again" in message  # the sim side knows no pipelines
    hint = refresh_hint(path)  # what the eval adds (tests/test_contract_refresh.py)
    assert "refresh it with `hud-pipelines contract arm` or `hud-pipelines contract pipelines/arm_v2.yaml`" in hint
    assert "refresh it with `hud-pipelines contract <pipeline>`" in refresh_hint(tmp_path / "loose.json")
