"""Contract -> LeRobot features, and one recorded :class:`~hud_pipelines.recording.events.Frame` -> one LeRobot frame.

The mapping, in lerobot's own vocabulary (its key constants are used, not retyped):

- cameras -> ``observation.images.<name>``: ``rgb`` as is (an alpha channel is dropped), ``bgr``
  flipped to RGB, ``gray`` replicated to three channels (lerobot reads one channel as depth),
  ``depth`` as a one-channel depth map; float pixels in [0, 1] become uint8;
- the state features -> ``observation.state``: flattened and concatenated in contract order (or the
  order the options give) as float32, one name per dimension. By default every non-camera
  observation feature is state, because that is what lerobot policies read;
- any other vector -> ``observation.<name>`` with its own dtype and shape;
- the action -> ``action`` with the contract's dtype (a discrete action stays an integer, rounded to
  the value the env was given), plus ``next.reward``, ``next.done``, ``next.success``, and
  ``episode.errored`` when errored episodes are kept.

A frame holding NaN or infinity anywhere in its numbers is named by :meth:`DatasetLayout.non_finite`,
so the sink can keep such an episode out of the dataset (or flagged, and out of the stats): one
non-finite value turns lerobot's stats of its feature into NaN for the whole dataset.

Flattened dict observations are named ``a/b`` in the contract; lerobot forbids ``/`` in keys, so it
becomes ``_`` (a collision between two sanitized names is an error naming both).

Both camera conventions are accepted: the contract's ``type: rgb|bgr|gray|depth`` and a plain dict
spec with lerobot's ``dtype: image|video``. A missing dtype means float32; a missing shape is filled
from the first real frame (:meth:`DatasetLayout.with_shapes_from`) before any dataset is created.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import ACTION as ACTION_FEATURE
from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.dataset.options import CameraStorage, DatasetOptions
from hud_pipelines.errors import ContractError
from hud_pipelines.recording.events import Frame

logger = logging.getLogger(__name__)

ERRORED = "episode.errored"
"""Per-frame flag of an episode that ended errored; only declared when errored episodes are kept."""
CAMERA_AXES = ["height", "width", "channels"]
_SPEC_KEYS = {"role", "type", "dtype", "shape", "names", "description", "low", "high", "info"}
_STORAGE_DTYPES = {storage.value for storage in CameraStorage}

Role = Literal["observation", "action"]


@dataclass(frozen=True)
class LeRobotKeys:
    """lerobot's own key constants (``lerobot.utils.constants``)."""

    action: str
    state: str
    images: str
    observation_prefix: str
    reward: str
    done: str
    success: str


@functools.cache
def lerobot_keys() -> LeRobotKeys:
    """Imported on first use: ``lerobot.utils.constants`` pulls in huggingface_hub (~5 s)."""
    from lerobot.utils import constants

    return LeRobotKeys(
        action=constants.ACTION,
        state=constants.OBS_STATE,
        images=constants.OBS_IMAGES,
        observation_prefix=constants.OBS_PREFIX,
        reward=constants.REWARD,
        done=constants.DONE,
        success=constants.SUCCESS,
    )


FrameDict = dict[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class SourceFeature:
    """One feature as the sim delivers it, normalised from a :class:`Contract` or a plain dict spec."""

    name: str
    role: Role
    camera: FeatureType | None
    """The camera kind, ``None`` for a vector."""
    dtype: np.dtype[Any]
    shape: tuple[int, ...] | None
    names: list[str] | None = None
    storage: CameraStorage | None = None
    """A per-camera storage asked for by a dict spec (``dtype: image|video``); else the options decide."""


def source_features(source: Contract | Mapping[str, Any]) -> list[SourceFeature]:
    """Normalise a contract, a contract-shaped dict or a ``{name: spec}`` dict into source features."""
    if isinstance(source, Contract):
        return [_from_contract_feature(name, feature) for name, feature in source.features.items()]
    specs = source.get("features", source)
    if not isinstance(specs, Mapping) or not specs:
        raise ContractError("a dataset needs a contract or a non-empty {name: feature spec} mapping")
    out: list[SourceFeature] = []
    for name, spec in cast(Mapping[Any, Any], specs).items():
        if not isinstance(name, str) or not name:
            raise ContractError(f"feature names must be non-empty strings, got {name!r}")
        if isinstance(spec, Feature):
            out.append(_from_contract_feature(name, spec))
        elif isinstance(spec, Mapping):
            out.append(_from_spec(name, cast(Mapping[str, Any], spec)))
        else:
            raise ContractError(f"feature {name!r}: expected a mapping spec, got {type(spec).__name__}")
    return out


def _from_contract_feature(name: str, feature: Feature) -> SourceFeature:
    return SourceFeature(
        name=name,
        role=feature.role,
        camera=feature.type if feature.is_camera else None,
        dtype=_dtype(name, feature.dtype),
        shape=feature.shape,
        names=feature.names,
    )


def _from_spec(name: str, spec: Mapping[str, Any]) -> SourceFeature:
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ContractError(f"feature {name!r}: unknown keys {unknown} (allowed: {sorted(_SPEC_KEYS)})")
    role = spec.get("role", "action" if name == ACTION_FEATURE else "observation")
    if role not in ("observation", "action"):
        raise ContractError(f"feature {name!r}: role must be 'observation' or 'action', got {role!r}")
    raw_type = spec.get("type")
    raw_dtype = spec.get("dtype")
    kind: FeatureType | None = None
    if raw_type is not None:
        try:
            kind = FeatureType(raw_type)
        except ValueError:
            allowed = [t.value for t in FeatureType]
            raise ContractError(f"feature {name!r}: type {raw_type!r} is not one of {allowed}") from None
    storage = CameraStorage(raw_dtype) if raw_dtype in _STORAGE_DTYPES else None
    info = spec.get("info")
    is_depth = isinstance(info, Mapping) and bool(cast(Mapping[str, Any], info).get("is_depth_map"))
    if kind is None or kind is FeatureType.STATE:
        kind = (FeatureType.DEPTH if is_depth else FeatureType.RGB) if storage is not None else None
    shape = spec.get("shape")
    names = spec.get("names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in cast(list[Any], names))):
        raise ContractError(f"feature {name!r}: names must be a list of strings")
    if kind is not None and role == "action":
        raise ContractError(f"feature {name!r}: an action cannot be a camera")
    pixel_dtype = None if storage is not None else raw_dtype
    return SourceFeature(
        name=name,
        role=role,
        camera=kind,
        dtype=_dtype(name, pixel_dtype or ("uint8" if kind is not None else "float32")),
        shape=_shape(name, shape),
        names=cast(list[str] | None, names),
        storage=storage,
    )


def _dtype(name: str, dtype: object) -> np.dtype[Any]:
    try:
        resolved = cast(np.dtype[Any], np.dtype(cast(Any, dtype)))
    except TypeError:
        raise ContractError(f"feature {name!r}: {dtype!r} is not a numpy dtype") from None
    if resolved.kind not in "biuf":
        raise ContractError(f"feature {name!r}: dtype {resolved} is not bool, int or float")
    return resolved


def _shape(name: str, shape: object) -> tuple[int, ...] | None:
    if shape is None:
        return None
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d > 0 for d in cast(Sequence[Any], shape)):
        raise ContractError(f"feature {name!r}: shape must be a list of positive ints, got {shape!r}")
    return tuple(cast(Sequence[int], shape))


UNKNOWN_ROBOT = "unknown"


def dataset_robot_type(robot_type: str, factory: str | None) -> str:
    """The ``robot_type`` a dataset of this sim stores: the contract's, unless it says nothing.

    A sim's contract names its robot from the env's ``metadata["robot_type"]`` or, failing that,
    from its factory; for a callable factory (``module:function`` or ``file.py:function``) that is
    the bare function name (``make``), which says nothing about the robot. Then the dataset names
    the factory's module with it (``camera_pendulum.make``); an empty or unknown robot type becomes
    the factory (a registry id such as ``CartPole-v1`` as it is). ``factory`` is ``None`` for a sim
    attached by URL, whose contract is taken as it is.
    """
    if factory is None:
        return robot_type or UNKNOWN_ROBOT
    module, colon, function = factory.rpartition(":")
    if robot_type and robot_type != UNKNOWN_ROBOT and not (colon and robot_type == function):
        return robot_type
    if not colon:
        return factory
    stem = PurePath(module).stem if module.endswith(".py") else module.rpartition(".")[2]
    return f"{stem}.{function}" if stem else function


def sanitize_key(name: str) -> str:
    """A contract name as a lerobot key part: ``/`` (flattened dicts) is not allowed there."""
    return name.replace("/", "_")


# ---------------------------------------------------------------------------------------------
# fields of the layout


@dataclass(frozen=True)
class CameraField:
    """One camera: where it comes from, its lerobot key and how its pixels are converted."""

    source: str
    key: str
    kind: FeatureType
    storage: CameraStorage
    source_shape: tuple[int, ...] | None

    @property
    def stored_shape(self) -> tuple[int, int, int]:
        if self.source_shape is None:
            raise ContractError(f"camera {self.source!r} has no shape yet")
        return _stored_camera_shape(self.source, self.kind, self.source_shape)

    def convert(self, value: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Pixels as lerobot stores them (always a copy, so the caller's buffers stay its own)."""
        pixels = np.asarray(value)
        if self.kind is FeatureType.DEPTH:
            return np.array(pixels.reshape(self.stored_shape), copy=True)
        if pixels.dtype != np.uint8:
            pixels = (np.clip(pixels, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        if pixels.ndim == 2:
            pixels = pixels[..., None]
        if self.kind is FeatureType.GRAY:
            return np.ascontiguousarray(np.repeat(pixels[..., :1], 3, axis=-1))
        if self.kind is FeatureType.BGR:
            return np.ascontiguousarray(pixels[..., 2::-1])
        return np.array(pixels[..., :3], copy=True)

    def lerobot_feature(self) -> dict[str, Any]:
        feature: dict[str, Any] = {
            "dtype": self.storage.value,
            "shape": self.stored_shape,
            "names": list(CAMERA_AXES),
        }
        if self.kind is FeatureType.DEPTH:
            feature["info"] = {"is_depth_map": True}
        return feature


def _stored_camera_shape(name: str, kind: FeatureType, shape: tuple[int, ...]) -> tuple[int, int, int]:
    channels = shape[2] if len(shape) == 3 else 1
    if len(shape) not in (2, 3) or (kind is FeatureType.DEPTH and channels != 1):
        raise ContractError(f"camera {name!r} ({kind}) has shape {list(shape)}: expected [H, W] or [H, W, C]")
    if kind is FeatureType.DEPTH:
        return (shape[0], shape[1], 1)
    if kind in (FeatureType.RGB, FeatureType.BGR) and channels not in (3, 4):
        raise ContractError(f"camera {name!r} ({kind}) has {channels} channels: expected 3 or 4")
    return (shape[0], shape[1], 3)


@dataclass(frozen=True)
class VectorField:
    """One numeric feature stored as an array (state parts, other vectors, the action)."""

    source: str
    key: str
    dtype: np.dtype[Any]
    source_shape: tuple[int, ...] | None
    names: list[str] | None

    @property
    def size(self) -> int:
        if self.source_shape is None:
            raise ContractError(f"feature {self.source!r} has no shape yet")
        return math.prod(self.source_shape)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        if self.source_shape is None:
            raise ContractError(f"feature {self.source!r} has no shape yet")
        return self.source_shape or (1,)

    def dimension_names(self) -> list[str]:
        if self.names is not None and len(self.names) == self.size:
            return list(self.names)
        return [f"{sanitize_key(self.source)}_{i}" for i in range(self.size)]


# ---------------------------------------------------------------------------------------------
# the layout


@dataclass(frozen=True)
class DatasetLayout:
    """How one contract's frames become LeRobot frames; complete once every shape is known."""

    fps: int
    robot_type: str
    cameras: tuple[CameraField, ...]
    state: tuple[VectorField, ...]
    vectors: tuple[VectorField, ...]
    action: VectorField
    keep_errored: bool

    @classmethod
    def build(
        cls,
        source: Contract | Mapping[str, Any],
        options: DatasetOptions | None = None,
        *,
        fps: float | None = None,
        robot_type: str | None = None,
    ) -> DatasetLayout:
        """Map a contract (or a dict spec, then ``fps`` is required) to LeRobot features."""
        options = options or DatasetOptions()
        features = source_features(source)
        if isinstance(source, Contract):
            fps = source.control_rate if fps is None else fps
            robot_type = source.robot_type if robot_type is None else robot_type
        else:
            fps = fps if fps is not None else source.get("control_rate", source.get("fps"))
            robot_type = robot_type or source.get("robot_type") or UNKNOWN_ROBOT
        if not isinstance(fps, int | float) or fps <= 0:
            raise ContractError("a dataset needs a positive fps (the contract's control_rate)")
        actions = [f for f in features if f.role == "action"]
        if [f.name for f in actions] != [ACTION_FEATURE]:
            raise ContractError(
                f"the contract needs exactly one action feature called {ACTION_FEATURE!r}, got {actions}"
            )
        keys = lerobot_keys()
        observations = [f for f in features if f.role == "observation"]
        cameras = tuple(
            CameraField(
                source=f.name,
                key=f"{keys.images}.{sanitize_key(f.name)}",
                kind=f.camera,
                storage=f.storage or options.cameras,
                source_shape=f.shape,
            )
            for f in observations
            if f.camera is not None
        )
        vectors = {f.name: f for f in observations if f.camera is None}
        state_names = list(vectors) if options.state_features is None else options.state_features
        unknown = [n for n in state_names if n not in vectors]
        if unknown:
            raise ContractError(
                f"state_features {unknown} are not non-camera observation features (those are {list(vectors)})"
            )
        state = tuple(_vector(vectors[n], keys.state, np.dtype(np.float32)) for n in state_names)
        others = tuple(
            _vector(f, f"{keys.observation_prefix}{sanitize_key(n)}", f.dtype)
            for n, f in vectors.items()
            if n not in state_names
        )
        action = _vector(actions[0], keys.action, actions[0].dtype)
        layout = cls(
            fps=_integer_fps(float(fps)),
            robot_type=str(robot_type),
            cameras=cameras,
            state=state,
            vectors=others,
            action=action,
            keep_errored=options.keep_errored,
        )
        layout.check_keys()
        return layout

    # -- shapes ------------------------------------------------------------------------------

    @property
    def missing_shapes(self) -> list[str]:
        """Source features whose shape is still unknown."""
        fields: list[CameraField | VectorField] = [*self.cameras, *self.state, *self.vectors, self.action]
        return [f.source for f in fields if f.source_shape is None]

    @property
    def complete(self) -> bool:
        return not self.missing_shapes

    def with_shapes_from(self, observation: Mapping[str, npt.NDArray[Any]], action: npt.NDArray[Any]) -> DatasetLayout:
        """Fill every missing shape from one real (unbatched) frame."""
        if self.complete:
            return self

        def fill[F: (CameraField, VectorField)](field: F, value: npt.NDArray[Any] | None) -> F:
            if field.source_shape is not None:
                return field
            if value is None:
                raise ContractError(f"feature {field.source!r} has no shape and is missing from the first frame")
            return replace(field, source_shape=tuple(np.shape(value)))

        return replace(
            self,
            cameras=tuple(fill(c, observation.get(c.source)) for c in self.cameras),
            state=tuple(fill(v, observation.get(v.source)) for v in self.state),
            vectors=tuple(fill(v, observation.get(v.source)) for v in self.vectors),
            action=fill(self.action, action),
        )

    # -- lerobot features --------------------------------------------------------------------

    def check_keys(self) -> None:
        """Two contract names that sanitize to one lerobot key are an error naming both."""
        seen: dict[str, str] = {}
        for key, source in self._keyed_sources():
            if key in seen and seen[key] != source:
                raise ContractError(f"features {seen[key]!r} and {source!r} both map to the lerobot key {key!r}")
            seen[key] = source

    def _keyed_sources(self) -> list[tuple[str, str]]:
        pairs = [(c.key, c.source) for c in self.cameras]
        pairs += [(v.key, v.source) for v in self.vectors]
        if self.state:
            pairs.append((lerobot_keys().state, "+".join(v.source for v in self.state)))
        return pairs

    @property
    def uses_video(self) -> bool:
        return any(c.storage is CameraStorage.VIDEO for c in self.cameras)

    def lerobot_features(self) -> dict[str, dict[str, Any]]:
        """The ``features`` argument of ``LeRobotDataset.create``; needs a complete layout."""
        if not self.complete:
            raise ContractError(f"shapes of {self.missing_shapes} are unknown until the first frame")
        keys = lerobot_keys()
        features: dict[str, dict[str, Any]] = {c.key: c.lerobot_feature() for c in self.cameras}
        if self.state:
            features[keys.state] = {
                "dtype": "float32",
                "shape": (sum(v.size for v in self.state),),
                "names": self.state_names(),
            }
        for v in self.vectors:
            features[v.key] = {"dtype": str(v.dtype), "shape": v.stored_shape, "names": v.dimension_names()}
        features[keys.action] = {
            "dtype": str(self.action.dtype),
            "shape": (self.action.size,),
            "names": self.action.dimension_names(),
        }
        features[keys.reward] = {"dtype": "float32", "shape": (1,), "names": None}
        features[keys.done] = {"dtype": "bool", "shape": (1,), "names": None}
        features[keys.success] = {"dtype": "bool", "shape": (1,), "names": None}
        if self.keep_errored:
            features[ERRORED] = {"dtype": "bool", "shape": (1,), "names": None}
        return features

    def state_names(self) -> list[str]:
        """One name per state dimension; prefixed by the feature name where two features share one."""
        names = [n for v in self.state for n in v.dimension_names()]
        if len(set(names)) == len(names):
            return names
        return [f"{sanitize_key(v.source)}.{n}" for v in self.state for n in v.dimension_names()]

    # -- frames ------------------------------------------------------------------------------

    def lerobot_frame(self, frame: Frame) -> FrameDict:
        """One recorded frame as a LeRobot frame (without ``task`` and the errored flag)."""
        keys = lerobot_keys()
        observation = frame.observation
        out: FrameDict = {}
        for camera in self.cameras:
            value = self._get(observation, camera.source, camera.source_shape)
            out[camera.key] = camera.convert(value)
        if self.state:
            parts = [
                np.asarray(self._get(observation, v.source, v.source_shape), dtype=np.float32).reshape(-1)
                for v in self.state
            ]
            out[keys.state] = np.concatenate(parts)
        for v in self.vectors:
            value = self._get(observation, v.source, v.source_shape)
            out[v.key] = np.array(value, dtype=v.dtype).reshape(v.stored_shape)
        out[keys.action] = self._action(frame.action)
        out[keys.reward] = np.array([frame.reward], dtype=np.float32)
        out[keys.done] = np.array([frame.done], dtype=np.bool_)
        out[keys.success] = np.array([frame.success], dtype=np.bool_)
        return out

    def _action(self, value: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The action in the contract's dtype; integer and bool actions rounded to the nearest integer,
        as the sim rounds them before the env sees them."""
        action = np.asarray(value)
        if action.size != self.action.size:
            raise ContractError(f"action has {action.size} values, the contract says {self.action.size}")
        action = action.reshape(self.action.size)
        if self.action.dtype.kind in "biu" and action.dtype.kind == "f":
            action = np.rint(action)
        return action.astype(self.action.dtype, copy=True)

    def non_finite(self, frame: Frame, converted: FrameDict) -> list[str]:
        """The lerobot keys of this frame holding NaN or infinity (``converted`` is its LeRobot frame).

        Float RGB cameras are checked on the recorded pixels: converting to uint8 would hide the NaN.
        """
        keys = [key for key, value in converted.items() if value.dtype.kind == "f" and not np.isfinite(value).all()]
        for camera in self.cameras:
            if camera.kind is FeatureType.DEPTH or camera.key in keys:
                continue
            pixels = np.asarray(frame.observation[camera.source])
            if pixels.dtype.kind == "f" and not np.isfinite(pixels).all():
                keys.append(camera.key)
        return keys

    @staticmethod
    def _get(observation: Mapping[str, npt.NDArray[Any]], name: str, shape: tuple[int, ...] | None) -> npt.NDArray[Any]:
        value = observation.get(name)
        if value is None:
            raise ContractError(f"observation feature {name!r} is missing from a frame (it has {sorted(observation)})")
        if shape is not None and np.shape(value) != shape:
            raise ContractError(
                f"observation feature {name!r} has shape {list(np.shape(value))}, the contract says {list(shape)}"
            )
        return value


def _vector(feature: SourceFeature, key: str, dtype: np.dtype[Any]) -> VectorField:
    return VectorField(source=feature.name, key=key, dtype=dtype, source_shape=feature.shape, names=feature.names)


def _integer_fps(rate: float) -> int:
    """lerobot stores an integer fps; a fractional control rate is rounded (and said so)."""
    fps = round(rate)
    if fps < 1:
        raise ContractError(f"control rate {rate} Hz is below 1 frame per second, which lerobot cannot store")
    if abs(fps - rate) > 1e-6:
        logger.warning("control rate %.6g Hz stored as fps %d (lerobot needs an integer fps)", rate, fps)
    return fps
