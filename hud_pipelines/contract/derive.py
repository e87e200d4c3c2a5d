"""A contract derived from an env: its spaces, one sample observation, its metadata.

- features are named as :mod:`.model` says; a bare observation is ``image`` when it looks like a
  camera, else ``state``;
- cameras are detected as ``HWC`` ``uint8`` arrays with 1, 3 or 4 channels (``gray`` for one
  channel, ``rgb`` otherwise; edit the type to ``bgr`` or ``depth`` when that is what the sim renders) whose
  space, when the env declares one, spans a pixel's 0-255: a ``uint8`` grid of other bounds holds labels (a
  grid world's cells, a segmentation's classes) that a lossy video would corrupt, so it is state;
- bounds come from ``Box`` (when finite), ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` spaces;
- the control rate is ``metadata["render_fps"]``, else ``1/dt``, else :data:`DEFAULT_CONTROL_RATE`;
- the robot type is ``metadata["robot_type"]``, else the env's registry id, else its class.

:func:`derive_env_contract` is the one derivation from a live env: the sim bridge (the envs behind
its slots) and ``wrap(env)`` (a user's env) both call it, so the same env gets the same contract.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract.model import ACTION, CAMERA_NAMES, Contract, Feature, FeatureType
from hud_pipelines.contract.observations import flatten_observation
from hud_pipelines.errors import ContractError

log = logging.getLogger(__name__)

DEFAULT_CONTROL_RATE = 30.0
"""Hz, used when the env states neither ``metadata["render_fps"]`` nor a ``dt``."""
CAMERA_CHANNELS = (1, 3, 4)
_GENERIC_BATCHERS = ("SyncVectorEnv", "AsyncVectorEnv")
"""gymnasium's own vector env classes: their name says nothing about the robot."""


def looks_like_camera(array: npt.NDArray[Any], space: gym.Space[Any] | None = None) -> bool:
    """An ``HWC`` ``uint8`` array with 1, 3 or 4 channels, unless ``space`` bounds it other than a pixel's 0-255
    (:func:`labels_grid`)."""
    return camera_shaped(array.dtype, array.shape) and not labels_grid(space)


def camera_shaped(dtype: np.dtype[Any] | str, shape: Sequence[int]) -> bool:
    """A ``uint8`` ``HWC`` shape with 1, 3 or 4 channels: a picture, or a grid of labels (:func:`labels_grid`)."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 3 and shape[-1] in CAMERA_CHANNELS


def labels_grid(space: gym.Space[Any] | None) -> bool:
    """Whether ``space`` is a ``uint8`` ``Box`` whose bounds are not a pixel's 0-255 everywhere: its values are
    labels or ids (a grid world's cells declared ``Box(0, 10)``), as stable-baselines3 reads such a space too.
    MiniGrid declares its grid ``Box(0, 255)``, read as a picture: its contract file types it ``state`` to keep it."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    return not (bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


def camera_advice(shape: Sequence[int], dtype: str = "uint8") -> str:
    """How to give an image of ``shape`` and ``dtype`` that is read as state as a camera instead."""
    as_bytes = "" if dtype == "uint8" else f", as uint8 (0-255) rather than {dtype}"
    if len(shape) == 3 and shape[0] in CAMERA_CHANNELS and shape[-1] not in CAMERA_CHANNELS:
        return f"it is channel-first: give it as (height, width, channel){as_bytes} in the env"
    return "a camera must be a uint8 array of (height, width, channel) with 1, 3 or 4 channels"


def _image_shaped(shape: Sequence[int]) -> bool:
    """A 2-D map of at least 32 x 32, or 1, 3 or 4 channels (first or last) over at least 16 x 16: a state of
    a few vectors (a history of joint angles, a lidar ring) stays unwarned."""
    if len(shape) == 2:
        return min(shape) >= 32
    if len(shape) == 3:
        spatial = shape[1:] if shape[0] in CAMERA_CHANNELS else shape[:2] if shape[2] in CAMERA_CHANNELS else ()
        return len(spatial) == 2 and min(spatial) >= 16
    return False


def state_images(contract: Contract) -> list[str]:
    """A warning for each observation read as state that has an image's shape (:func:`_image_shaped`).

    Such a feature is stored in the dataset as a vector of every value, with no video, and the policy gets
    it flat: a depth map of floats or a channel-first image is most often meant as a camera.
    """
    return [
        f"observation {name!r} ({feature.dtype} {list(feature.shape)}) has an image's shape but is read as state "
        f"({feature.size} values a step, no video): {_state_image_advice(feature)}"
        for name, feature in contract.state_features.items()
        if _image_shaped(feature.shape)
    ]


def _state_image_advice(feature: Feature) -> str:
    if camera_shaped(feature.dtype, feature.shape) and feature.low is not None and feature.high is not None:
        return (
            f"its space bounds it to {min(feature.low):g}-{max(feature.high):g}, not a pixel's 0-255, so its values "
            "are kept exactly as labels; if it is a picture, type it rgb or gray in the contract file (a camera is "
            "stored as video, which is lossy)"
        )
    return (
        f"{camera_advice(feature.shape, feature.dtype)}; a depth map of floats can be scaled to uint8 with one "
        "channel and typed depth in the contract file"
    )


def _observation_feature(name: str, sample: npt.NDArray[Any], space: gym.Space[Any] | None) -> Feature:
    if looks_like_camera(sample, space):
        kind = FeatureType.GRAY if sample.shape[-1] == 1 else FeatureType.RGB
        return Feature(
            role="observation", type=kind, dtype=str(sample.dtype), shape=sample.shape, names=list(CAMERA_NAMES)
        )
    shape = sample.shape if sample.ndim > 0 else (1,)
    size = math.prod(shape)
    low, high = _bounds(space, size)
    return Feature(
        role="observation",
        dtype=str(sample.dtype),
        shape=shape,
        names=[f"{name}_{i}" for i in range(size)],
        low=low,
        high=high,
    )


def _bounds(space: gym.Space[Any] | None, size: int) -> tuple[list[float] | None, list[float] | None]:
    """Flat finite bounds of a space when it has them (infinite bounds are left out of the file)."""
    if isinstance(space, gym.spaces.Box):
        low = np.asarray(space.low, dtype=np.float64).reshape(-1)
        high = np.asarray(space.high, dtype=np.float64).reshape(-1)
        if low.size == size and np.isfinite(low).all() and np.isfinite(high).all():
            return low.tolist(), high.tolist()
        return None, None
    if isinstance(space, gym.spaces.Discrete):
        return [float(space.start)] * size, [float(space.start + space.n - 1)] * size
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start, dtype=np.float64).reshape(-1)
        nvec = np.asarray(space.nvec, dtype=np.float64).reshape(-1)
        return start.tolist(), (start + nvec - 1).tolist()
    if isinstance(space, gym.spaces.MultiBinary):
        return [0.0] * size, [1.0] * size
    return None, None


def _subspace(space: gym.Space[Any] | None, name: str) -> gym.Space[Any] | None:
    """Find the leaf space that ``flatten_observation`` called ``name``."""
    node: gym.Space[Any] | None = space
    for part in name.split("/") if name else []:
        if _is_dict_space(node):
            node = node.spaces.get(part)
        elif _is_tuple_space(node):
            if not part.isdigit() or int(part) >= len(node.spaces):
                return None
            node = node.spaces[int(part)]
        else:
            return None
    return node


def _is_dict_space(space: object) -> TypeGuard[gym.spaces.Dict]:
    """A ``Dict`` space (gymnasium leaves the narrowed type's members partly untyped)."""
    return isinstance(space, gym.spaces.Dict)


def _is_tuple_space(space: object) -> TypeGuard[gym.spaces.Tuple[Any]]:
    return isinstance(space, gym.spaces.Tuple)


def _is_box(space: object) -> TypeGuard[gym.spaces.Box]:
    return isinstance(space, gym.spaces.Box)


def action_feature(space: gym.Space[Any]) -> Feature:
    """The flat action feature of a (single-env) action space."""
    whole = space  # the bounds read the space itself, not its narrowed kind
    if _is_box(space):
        size = math.prod(space.shape)
        dtype = str(space.dtype)
    elif isinstance(space, gym.spaces.Discrete):
        size, dtype = 1, "int64"
    elif isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        size, dtype = math.prod(space.shape), "int64"
    else:
        raise ContractError(f"unsupported action space {space!r}: use Box, Discrete, MultiDiscrete or MultiBinary")
    if size == 0:
        raise ContractError(f"the action space {space!r} holds no value: a policy would have nothing to give")
    low, high = _bounds(whole, size)
    return Feature(
        role="action", dtype=dtype, shape=(size,), names=[f"{ACTION}_{i}" for i in range(size)], low=low, high=high
    )


def control_rate_of(*envs: Any) -> float:
    """``metadata["render_fps"]``, else ``1/dt``, else :data:`DEFAULT_CONTROL_RATE`.

    Several objects may be given (a vector env, its first sub-env, ...): each is asked in turn,
    ``render_fps`` first, and its ``unwrapped`` env too.
    """
    holders = [h for env in envs if env is not None for h in (env, getattr(env, "unwrapped", None)) if h is not None]
    for holder in holders:
        metadata: Mapping[str, Any] = getattr(holder, "metadata", None) or {}
        fps = metadata.get("render_fps")
        if isinstance(fps, int | float) and not isinstance(fps, bool) and fps > 0:
            return float(fps)
    for holder in holders:
        dt = getattr(holder, "dt", None)
        if isinstance(dt, int | float) and not isinstance(dt, bool) and dt > 0:
            return 1.0 / float(dt)
    return DEFAULT_CONTROL_RATE


def derive_contract(
    observation_space: gym.Space[Any] | None,
    action_space: gym.Space[Any],
    sample_observation: object,
    *,
    control_rate: float,
    robot_type: str = "unknown",
) -> Contract:
    """Derive a contract from single-env spaces and one (unbatched) sample observation."""
    features: dict[str, Feature] = {}
    flat = flatten_observation(sample_observation)
    for name, sample in flat.items():
        key = name or ("image" if looks_like_camera(sample, observation_space) else "state")
        if key == ACTION:
            raise ContractError(f"an observation feature may not be called {ACTION!r}")
        check_dtype_name(sample.dtype, key)
        if sample.size == 0:  # it passed every check, then broke the dataset's statistics
            raise ContractError(
                f"observation {key!r} has shape {list(sample.shape)}, which holds no value: leave it out of the "
                "env's observations"
            )
        features[key] = _observation_feature(key, sample, _subspace(observation_space, name))
    features[ACTION] = action_feature(action_space)
    return Contract(control_rate=control_rate, robot_type=robot_type, features=features)


def check_dtype_name(dtype: np.dtype[Any], feature: str) -> None:
    if dtype.kind not in "biuf":
        raise ContractError(f"feature {feature!r} has dtype {dtype}: only bool, int and float features are supported")


# ---------------------------------------------------------------------------------------------
# from a live env


@dataclass(frozen=True)
class EnvContract:
    """A contract derived from a live env, and which feature each flattened observation key fills."""

    contract: Contract
    names: dict[str, str]
    """Flattened observation key -> contract feature (a bare observation's key ``""`` -> its feature)."""


def derive_env_contract(
    env: object,
    observation_space: gym.Space[Any] | None,
    action_space: gym.Space[Any],
    sample_observation: object,
    *,
    fallback_name: str,
) -> EnvContract:
    """The contract of ``env`` (a single env or a vector env) from its single-env spaces and one sample.

    ``fallback_name`` is the robot type when neither the env's metadata, nor a registry id, nor its
    class says anything (the sim bridge passes its factory's name).
    """
    sources = env_sources(env)
    metadata: Mapping[str, Any] = getattr(env, "metadata", None) or {}
    robot_type = str(metadata.get("robot_type") or robot_name(sources) or fallback_name)
    contract = derive_contract(
        observation_space,
        action_space,
        sample_observation,
        control_rate=control_rate_of(*sources),
        robot_type=robot_type,
    )
    default_name = next(iter(contract.observation_features))
    flat = flatten_observation(sample_observation)
    names = {name: name or default_name for name in flat}
    for name, sample in flat.items():
        declared = getattr(_subspace(observation_space, name), "shape", None)
        read_as = sample.shape if sample.ndim else (1,)  # a scalar is a feature of one value
        if declared is not None and tuple(declared) not in (sample.shape, read_as):
            log.warning(
                "env %s: its observation_space declares %r with shape %s, but its observation has shape %s: the "
                "contract follows the observation; correct the space if the observation is right",
                robot_type,
                names[name],
                tuple(declared),
                sample.shape,
            )
    return EnvContract(contract, names)


def env_sources(env: object) -> list[Any]:
    """What may state an env's rate and name, most specific first: the env, its ``unwrapped`` env, and
    a vector env's first sub-env (``None`` where there is none)."""
    sub_envs: Any = getattr(env, "envs", None) or [None]
    return [env, getattr(env, "unwrapped", None), sub_envs[0]]


def robot_name(sources: Sequence[object]) -> str | None:
    """What a sim that states no ``robot_type`` is called: its registry id, else its env class.

    Never a factory's function name (``make``), which says nothing about the robot.
    """
    for source in sources:
        spec = getattr(source, "spec", None)
        env_id = getattr(spec, "id", None)
        if isinstance(env_id, str) and env_id:
            return env_id
    for source in sources:
        unwrapped = getattr(source, "unwrapped", None)
        name = type(unwrapped).__name__ if unwrapped is not None else ""
        if name and name not in _GENERIC_BATCHERS:
            return name.removesuffix("VectorEnv") or name
    return None
