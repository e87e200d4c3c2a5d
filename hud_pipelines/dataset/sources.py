"""What the sim delivers, normalised for the dataset: its features and the name of its robot.

A dataset is built from a :class:`~hud_pipelines.contract.Contract` or from a plain dict spec
(``{name: {dtype, shape, names, ...}}``, or a contract-shaped ``{"features": ...}``). Both camera
conventions are accepted: the contract's ``type: rgb|bgr|gray|depth`` and lerobot's
``dtype: image|video``. A missing dtype means float32 (uint8 for a camera); a missing shape is
filled from the first real frame before any dataset is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal, TypeGuard

import numpy as np

from hud_pipelines.contract import ACTION as ACTION_FEATURE
from hud_pipelines.contract import Contract, Feature, FeatureType
from hud_pipelines.contract.observations import is_mapping
from hud_pipelines.errors import ContractError
from hud_pipelines.spec.dataset_options import CameraStorage

_SPEC_KEYS = {"role", "type", "dtype", "shape", "names", "description", "low", "high", "info"}
_STORAGE_DTYPES = {storage.value for storage in CameraStorage}
UNKNOWN_ROBOT = "unknown"

Role = Literal["observation", "action"]


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
    low: list[float] | None = None
    high: list[float] | None = None
    """The flat bounds of a contract's feature, where it knows them (the action's: the sim clips into them)."""


def source_features(source: Contract | Mapping[str, Any]) -> list[SourceFeature]:
    """Normalise a contract, a contract-shaped dict or a ``{name: spec}`` dict into source features."""
    if isinstance(source, Contract):
        return [_from_contract_feature(name, feature) for name, feature in source.features.items()]
    specs: object = source.get("features", source)
    if not is_mapping(specs) or not specs:
        raise ContractError("a dataset needs a contract or a non-empty {name: feature spec} mapping")
    out: list[SourceFeature] = []
    for name, spec in specs.items():
        if not isinstance(name, str) or not name:
            raise ContractError(f"feature names must be non-empty strings, got {name!r}")
        if isinstance(spec, Feature):
            out.append(_from_contract_feature(name, spec))
        elif is_mapping(spec):
            out.append(_from_spec(name, spec))
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
        low=feature.low,
        high=feature.high,
    )


def _from_spec(name: str, spec: Mapping[Any, object]) -> SourceFeature:
    unknown = sorted(set(map(str, spec)) - _SPEC_KEYS)
    if unknown:
        raise ContractError(f"feature {name!r}: unknown keys {unknown} (allowed: {sorted(_SPEC_KEYS)})")
    role = _role(name, spec.get("role", "action" if name == ACTION_FEATURE else "observation"))
    raw_dtype = spec.get("dtype")
    storage = CameraStorage(raw_dtype) if isinstance(raw_dtype, str) and raw_dtype in _STORAGE_DTYPES else None
    kind = _camera_kind(name, spec.get("type"), storage, spec.get("info"))
    names = spec.get("names")
    if names is not None and not _is_names(names):
        raise ContractError(f"feature {name!r}: names must be a list of strings")
    if kind is not None and role == "action":
        raise ContractError(f"feature {name!r}: an action cannot be a camera")
    pixel_dtype = None if storage is not None else raw_dtype
    return SourceFeature(
        name=name,
        role=role,
        camera=kind,
        dtype=_dtype(name, pixel_dtype or ("uint8" if kind is not None else "float32")),
        shape=_shape(name, spec.get("shape")),
        names=names,
        storage=storage,
    )


def _role(name: str, role: object) -> Role:
    if role == "observation":
        return "observation"
    if role == "action":
        return "action"
    raise ContractError(f"feature {name!r}: role must be 'observation' or 'action', got {role!r}")


def _camera_kind(name: str, raw_type: object, storage: CameraStorage | None, info: object) -> FeatureType | None:
    """The camera kind a spec asks for: its ``type``, else a lerobot ``image|video`` dtype (depth by ``info``)."""
    kind: FeatureType | None = None
    if raw_type is not None:
        try:
            kind = FeatureType(raw_type)
        except ValueError:
            allowed = [t.value for t in FeatureType]
            raise ContractError(f"feature {name!r}: type {raw_type!r} is not one of {allowed}") from None
    if kind is None or kind is FeatureType.STATE:
        is_depth = is_mapping(info) and bool(info.get("is_depth_map"))
        kind = (FeatureType.DEPTH if is_depth else FeatureType.RGB) if storage is not None else None
    return kind


def _is_sequence(value: object) -> TypeGuard[list[object] | tuple[object, ...]]:
    return isinstance(value, list | tuple)


def _is_names(value: object) -> TypeGuard[list[str]]:
    return _is_sequence(value) and isinstance(value, list) and all(isinstance(n, str) for n in value)


def _is_shape(value: object) -> TypeGuard[list[int] | tuple[int, ...]]:
    return _is_sequence(value) and all(isinstance(d, int) and d > 0 for d in value)


def _is_dtype_like(value: object) -> TypeGuard[str | np.dtype[Any] | type]:
    """What may name a dtype in a spec: a string (``float32``), a numpy dtype or a scalar type."""
    return isinstance(value, str | np.dtype | type)


def _dtype(name: str, dtype: object) -> np.dtype[Any]:
    if not _is_dtype_like(dtype):
        raise ContractError(f"feature {name!r}: {dtype!r} is not a numpy dtype")
    try:
        resolved: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise ContractError(f"feature {name!r}: {dtype!r} is not a numpy dtype") from None
    if resolved.kind not in "biuf":
        raise ContractError(f"feature {name!r}: dtype {resolved} is not bool, int or float")
    return resolved


def _shape(name: str, shape: object) -> tuple[int, ...] | None:
    if shape is None:
        return None
    if not _is_shape(shape):
        raise ContractError(f"feature {name!r}: shape must be a list of positive ints, got {shape!r}")
    return tuple(shape)


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
