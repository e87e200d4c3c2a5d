"""Contract -> LeRobot features, and one recorded :class:`~hud_pipelines.recording.events.Frame` -> one LeRobot frame.

The layout, in lerobot's own vocabulary (each field's storage is :mod:`.fields`, the input
features :mod:`.sources`):

- cameras -> ``observation.images.<name>`` (converted as :class:`~.fields.CameraField` says);
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

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import ACTION as ACTION_FEATURE
from hud_pipelines.contract import Contract, FeatureType
from hud_pipelines.dataset.fields import CameraField, VectorField, lerobot_keys, sanitize_key
from hud_pipelines.dataset.sources import UNKNOWN_ROBOT, SourceFeature, source_features
from hud_pipelines.errors import ContractError
from hud_pipelines.recording.events import Frame
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions, VideoCodec

logger = logging.getLogger(__name__)

AV1_MIN_WIDTH = 25
"""The narrowest frame SVT-AV1 (3.0, as PyAV ships it) encodes: narrower ones end the process with SIGFPE."""
ERRORED = "episode.errored"
"""Per-frame flag of an episode that ended errored; only declared when errored episodes are kept."""
FLOAT32_EXACT = 2.0**24
"""float32, ``observation.state``'s dtype, holds every integer up to this magnitude, and skips some above it."""

FrameDict = dict[str, npt.NDArray[Any]]


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
    action_bounds: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
    """The contract's action bounds, which the sim clips a continuous action into before the env applies it."""
    codec: VideoCodec = VideoCodec.H264
    """What RGB video cameras are encoded with."""

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
        state_names = options.state_features
        if state_names is None:  # every vector whose values observation.state's float32 keeps
            state_names = [name for name, feature in vectors.items() if exact_in_float32(feature)]
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
            action_bounds=_bounds(actions[0]),
            codec=options.codec,
        )
        layout.check_keys()
        layout.check_codec()
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

        filled = replace(
            self,
            cameras=tuple(fill(c, observation.get(c.source)) for c in self.cameras),
            state=tuple(fill(v, observation.get(v.source)) for v in self.state),
            vectors=tuple(fill(v, observation.get(v.source)) for v in self.vectors),
            action=fill(self.action, action),
        )
        filled.check_codec()
        return filled

    # -- lerobot features --------------------------------------------------------------------

    def check_keys(self) -> None:
        """Two contract names that sanitize to one lerobot key are an error naming both."""
        seen: dict[str, str] = {}
        for key, source in self._keyed_sources():
            if key in seen and seen[key] != source:
                raise ContractError(f"features {seen[key]!r} and {source!r} both map to the lerobot key {key!r}")
            seen[key] = source

    def check_codec(self) -> None:
        """Refuse a video camera the codec cannot encode (one whose shape is known; depth maps have their own codec),
        before a frame is written:
        SVT-AV1 kills the whole process, every grade with it, on frames narrower than :data:`AV1_MIN_WIDTH`."""
        if self.codec is not VideoCodec.AV1:
            return
        for camera in self.cameras:
            if camera.storage is CameraStorage.VIDEO and camera.kind is not FeatureType.DEPTH and camera.source_shape:
                width = camera.stored_shape[1]
                if width < AV1_MIN_WIDTH:
                    raise ContractError(
                        f"camera {camera.source!r} is {width} pixels wide: codec {self.codec.value} crashes the "
                        f"process on frames narrower than {AV1_MIN_WIDTH}; store it with codec h264 (the default)"
                    )

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
        """The action the env applied, in the contract's dtype: integer and bool actions rounded to the nearest
        integer, and every action clipped into the contract's bounds, as the sim does before the env sees it (the
        policy's own, beyond the bounds, would not be what produced the next observation)."""
        action = np.asarray(value)
        if action.size != self.action.size:
            raise ContractError(f"action has {action.size} values, the contract says {self.action.size}")
        action = action.reshape(self.action.size)
        if self.action.dtype.kind in "biu" and action.dtype.kind == "f":
            action = np.rint(action)
        if self.action_bounds is not None:
            action = np.clip(action, *self.action_bounds)
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


def _bounds(action: SourceFeature) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
    """The action's flat bounds where the contract gives both, one per value (``None``: it clips nothing)."""
    if action.low is None or action.high is None or len(action.low) != len(action.high):
        return None
    return np.asarray(action.low, dtype=np.float64), np.asarray(action.high, dtype=np.float64)


def exact_in_float32(feature: SourceFeature) -> bool:
    """Whether ``observation.state`` (float32) keeps every value of the vector ``feature``: an integer one of 32 or
    64 bits, unless its bounds stay within 2^24, may count past it (a tick counter, an id, a timestamp), where
    float32 rounds 33554433 to 33554432; such a feature keeps its own ``observation.<name>`` in its own dtype by
    default. Floats are stored as float32 as lerobot's policies read them."""
    if feature.dtype.kind not in "iu" or feature.dtype.itemsize < 4:
        return True
    if feature.low is None or feature.high is None:
        return False
    return max(abs(value) for value in (*feature.low, *feature.high)) <= FLOAT32_EXACT
