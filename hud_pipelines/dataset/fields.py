"""How one source feature is stored in a LeRobot dataset: its key, shape, names and pixel conversion.

In lerobot's own vocabulary (its key constants are used, not retyped):

- a camera -> ``observation.images.<name>``: ``rgb`` as is (an alpha channel is dropped), ``bgr``
  flipped to RGB, ``gray`` replicated to three channels (lerobot reads one channel as depth),
  ``depth`` as a one-channel depth map; float pixels in [0, 1] become uint8. An RGB camera stored
  as video has an even height and width: an odd one is padded by one edge pixel
  (:func:`~hud_pipelines.recording.even_frames.pad_to_even`), since its 4:2:0 video cannot be odd and
  lerobot decodes what the video holds; the declared shape, the stats and the decoded frames then
  agree (``LeRobotDataset(...)[i]`` gives the padded frame). Images (PNG) and depth maps keep their size;
- a vector (a state part, another observation vector, the action) keeps its dtype and shape, one
  name per dimension.

Flattened dict observations are named ``a/b`` in the contract; lerobot forbids ``/`` in keys, so it
becomes ``_``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import FeatureType
from hud_pipelines.errors import ContractError
from hud_pipelines.recording.even_frames import even_size, pad_to_even
from hud_pipelines.spec.dataset_options import CameraStorage

CAMERA_AXES = ["height", "width", "channels"]


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


def sanitize_key(name: str) -> str:
    """A contract name as a lerobot key part: ``/`` (flattened dicts) is not allowed there."""
    return name.replace("/", "_")


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
        height, width, channels = _stored_camera_shape(self.source, self.kind, self.source_shape)
        if self.padded:
            height, width = even_size(height, width)
        return (height, width, channels)

    @property
    def padded(self) -> bool:
        """Whether frames are padded to an even size: RGB video (4:2:0) cannot be odd, while PNGs
        can and lerobot encodes depth maps without chroma."""
        return self.storage is CameraStorage.VIDEO and self.kind is not FeatureType.DEPTH

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
            pixels = np.repeat(pixels[..., :1], 3, axis=-1)
        elif self.kind is FeatureType.BGR:
            pixels = pixels[..., 2::-1]
        else:
            pixels = np.array(pixels[..., :3], copy=True)
        return pad_to_even(pixels) if self.padded else np.ascontiguousarray(pixels)

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
