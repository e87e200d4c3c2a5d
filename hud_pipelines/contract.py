"""The contract: what a sim observes and accepts, shared by the sim, the agent and the dataset.

A contract is derived from the env's spaces plus one sample observation, then written to an
editable ``contract.json`` at an explicit path. Later runs load that file and merge it with a fresh
derivation: human edits to names, descriptions, types, bounds, the control rate and the robot type
survive, while a shape or dtype that no longer matches the env is an error naming the feature, the
file, both shapes and the command that refreshes the file (``hud-pipelines contract <pipeline>``,
see :func:`refresh_contract`: the env's new shapes, the edits that still fit, a line per change).
An eval never refreshes a file by itself: a contract is what its results are read by. The file
never lands in the working directory by accident: without a path the contract lives in memory only.

Feature naming:

- a ``Dict`` (or ``Tuple``) observation is flattened, nested keys joined with ``/``;
- a bare observation is called ``image`` when it looks like a camera, else ``state``;
- the action is always the single feature ``action``, a flat vector of ``A`` values;
- per-dimension names default to ``<feature>_<i>`` (``state_0``, ``robot/joints_2``, ``action_1``).

The control rate is ``metadata["render_fps"]``, else ``1/dt``, else :data:`DEFAULT_CONTROL_RATE`.

Cameras are detected as ``HWC`` ``uint8`` arrays with 1, 3 or 4 channels (``gray`` for one channel,
``rgb`` otherwise; edit the type to ``bgr`` or ``depth`` when that is what the sim renders).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hud_pipelines.errors import ContractError

CONTRACT_VERSION = 1
DEFAULT_CONTROL_RATE = 30.0
"""Hz, used when the env states neither ``metadata["render_fps"]`` nor a ``dt``."""
ACTION = "action"
CAMERA_CHANNELS = (1, 3, 4)
CAMERA_NAMES = ["height", "width", "channel"]


class FeatureType(StrEnum):
    """What a feature holds; the camera types tell consumers how to read the pixels."""

    STATE = "state"
    RGB = "rgb"
    BGR = "bgr"
    GRAY = "gray"
    DEPTH = "depth"

    @property
    def is_camera(self) -> bool:
        return self is not FeatureType.STATE


class Feature(BaseModel):
    """One named array of the contract, without the batch axis."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["observation", "action"]
    type: FeatureType = FeatureType.STATE
    dtype: str = Field(description="numpy dtype name, e.g. float32, uint8, int64, bool")
    shape: tuple[int, ...]
    names: list[str] | None = Field(
        default=None,
        description="one name per element for vectors; ['height', 'width', 'channel'] for cameras",
    )
    description: str | None = None
    low: list[float] | None = Field(default=None, description="flat lower bounds, when known")
    high: list[float] | None = Field(default=None, description="flat upper bounds, when known")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_camera(self) -> bool:
        return self.type.is_camera


class Contract(BaseModel):
    """Observation and action features, control rate and robot type of one sim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = CONTRACT_VERSION
    control_rate: float = Field(gt=0, description="steps per second of simulated time (Hz)")
    robot_type: str = "unknown"
    features: dict[str, Feature]

    @property
    def action(self) -> Feature:
        return self.features[ACTION]

    @property
    def observation_features(self) -> dict[str, Feature]:
        return {k: f for k, f in self.features.items() if f.role == "observation"}

    @property
    def cameras(self) -> dict[str, Feature]:
        return {k: f for k, f in self.observation_features.items() if f.is_camera}

    @property
    def state_features(self) -> dict[str, Feature]:
        return {k: f for k, f in self.observation_features.items() if not f.is_camera}

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True) + "\n"


# ---------------------------------------------------------------------------------------------
# derivation


def flatten_observation(observation: object, prefix: str = "") -> dict[str, npt.NDArray[Any]]:
    """Flatten a (nested) dict/tuple observation into ``{"a/b": array}``; a bare value is one entry."""
    if isinstance(observation, Mapping):
        flat: dict[str, npt.NDArray[Any]] = {}
        for key, value in cast("Mapping[Any, object]", observation).items():
            flat.update(flatten_observation(value, f"{prefix}{key}/"))
        return flat
    if isinstance(observation, tuple):
        flat = {}
        for index, value in enumerate(cast("tuple[object, ...]", observation)):
            flat.update(flatten_observation(value, f"{prefix}{index}/"))
        return flat
    return {prefix.rstrip("/"): to_numpy(observation)}


def to_numpy(value: object) -> npt.NDArray[Any]:
    """Convert an array-like, including a torch tensor on any device, to numpy without importing torch."""
    detach = getattr(value, "detach", None)
    if callable(detach):
        value = cast(Any, detach()).cpu().numpy()
    return np.asarray(value)


def looks_like_camera(array: npt.NDArray[Any]) -> bool:
    return array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] in CAMERA_CHANNELS


def _observation_feature(name: str, sample: npt.NDArray[Any], space: gym.Space[Any] | None) -> Feature:
    if looks_like_camera(sample):
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
        if isinstance(node, gym.spaces.Dict):
            node = cast("dict[str, gym.Space[Any]]", node.spaces).get(part)
        elif isinstance(node, gym.spaces.Tuple):
            children = cast("tuple[gym.Space[Any], ...]", node.spaces)
            if not part.isdigit() or int(part) >= len(children):
                return None
            node = children[int(part)]
        else:
            return None
    return node


def action_feature(space: gym.Space[Any]) -> Feature:
    """The flat action feature of a (single-env) action space."""
    if isinstance(space, gym.spaces.Box):
        size = math.prod(space.shape)
        dtype = str(cast("np.dtype[Any]", space.dtype))
    elif isinstance(space, gym.spaces.Discrete):
        size, dtype = 1, "int64"
    elif isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        size, dtype = math.prod(space.shape), "int64"
    else:
        raise ContractError(f"unsupported action space {space!r}: use Box, Discrete, MultiDiscrete or MultiBinary")
    low, high = _bounds(cast("gym.Space[Any]", space), size)
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
        metadata = cast("Mapping[str, Any]", getattr(holder, "metadata", None) or {})
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
        key = name or ("image" if looks_like_camera(sample) else "state")
        if key == ACTION:
            raise ContractError(f"an observation feature may not be called {ACTION!r}")
        check_dtype_name(sample.dtype, key)
        features[key] = _observation_feature(key, sample, _subspace(observation_space, name))
    features[ACTION] = action_feature(action_space)
    return Contract(control_rate=control_rate, robot_type=robot_type, features=features)


def check_dtype_name(dtype: np.dtype[Any], feature: str) -> None:
    if dtype.kind not in "biuf":
        raise ContractError(f"feature {feature!r} has dtype {dtype}: only bool, int and float features are supported")


# ---------------------------------------------------------------------------------------------
# the editable file


def load_contract(path: Path) -> Contract:
    """Read a contract file; a malformed one is an error naming the file and the field."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    try:
        return Contract.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ContractError(f"{path}: invalid contract: {problems}") from exc


def merge_contract(edited: Contract, derived: Contract, *, source: Path | str, fix: str | None = None) -> Contract:
    """Keep the edits of ``edited`` where they still fit the env that produced ``derived``.

    Names, descriptions, types, bounds, the control rate and the robot type come from ``edited``;
    a feature whose shape or dtype changed, or that the env no longer has, is an error that ends
    with ``fix`` (how to refresh the file) when given. Features the env gained are added as derived.
    """
    hint = f"; {fix}" if fix else ""
    gone = sorted(set(edited.features) - set(derived.features))
    if gone:
        raise ContractError(
            f"{source}: features {gone} are in the contract file but not in the env "
            f"(the env has {sorted(derived.features)}){hint}"
        )
    merged: dict[str, Feature] = {}
    for name, fresh in derived.features.items():
        kept = edited.features.get(name)
        if kept is None:
            merged[name] = fresh
            continue
        if not _same_layout(kept, fresh):
            raise ContractError(
                f"{source}: feature {name!r} is {kept.role} {_layout(kept)} in the contract file but "
                f"{fresh.role} {_layout(fresh)} in the env{hint or '; fix the file or delete it to derive it again'}"
            )
        if not _names_fit(kept, fresh):
            raise ContractError(
                f"{source}: feature {name!r} has {len(kept.names or [])} names for {fresh.size} values{hint}"
            )
        merged[name] = kept
    return edited.model_copy(update={"features": merged})


def resolve_contract(derived: Contract, path: Path | None) -> Contract:
    """Write ``derived`` to ``path`` the first time; afterwards load the file and merge.

    With ``path=None`` nothing touches the disk. The file is rewritten only when the merge added
    features, so a user's formatting survives ordinary runs. A file the env no longer fits is an
    error that names the command refreshing it (:func:`refresh_hint`).
    """
    if path is None:
        return derived
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(derived.to_json())
        return derived
    edited = load_contract(path)
    try:
        merged = merge_contract(edited, derived, source=path)
    except ContractError:
        # the same refusal, now naming the command that refreshes the file (looked up only when needed)
        merge_contract(edited, derived, source=path, fix=refresh_hint(path))
        raise
    if set(merged.features) != set(edited.features):
        path.write_text(merged.to_json())
    return merged


# ---------------------------------------------------------------------------------------------
# refreshing a file after the env changed


def refresh_contract(edited: Contract, derived: Contract) -> tuple[Contract, list[str]]:
    """The contract of the env that produced ``derived``, with the edits of ``edited`` that still fit.

    Unlike :func:`merge_contract` this never refuses: a feature whose shape, dtype or role changed
    takes the env's, keeping its description and (camera for camera) its edited type, and its names
    when there is still one per value; bounds are kept while the shape is. Features the env gained
    are added, those it lost are dropped; the control rate and robot type stay as edited. The second
    value has one line per changed feature (old -> new, and the edited names it had to drop).
    """
    refreshed: dict[str, Feature] = {}
    changes: list[str] = []
    for name, fresh in derived.features.items():
        kept = edited.features.get(name)
        if kept is None:
            refreshed[name] = fresh
            changes.append(f"{name}: added, {fresh.role} {_layout(fresh)}")
            continue
        feature, change = _refresh_feature(name, kept, fresh)
        refreshed[name] = feature
        if change:
            changes.append(change)
    for name, gone in edited.features.items():
        if name not in derived.features:
            changes.append(f"{name}: removed, {gone.role} {_layout(gone)} (the env no longer has it)")
    return edited.model_copy(update={"features": refreshed}), changes


def _refresh_feature(name: str, kept: Feature, fresh: Feature) -> tuple[Feature, str | None]:
    """One feature refreshed, and the line that says what changed (``None``: nothing did)."""
    names_fit = _names_fit(kept, fresh)
    if _same_layout(kept, fresh) and names_fit:
        return kept, None
    same_shape = kept.shape == fresh.shape
    feature = fresh.model_copy(
        update={
            "description": kept.description,
            "type": kept.type if kept.is_camera == fresh.is_camera else fresh.type,
            "names": kept.names if names_fit else fresh.names,
            "low": kept.low if same_shape else fresh.low,
            "high": kept.high if same_shape else fresh.high,
        }
    )
    return feature, _change_line(name, kept, fresh, names_fit=names_fit)


def _change_line(name: str, kept: Feature, fresh: Feature, *, names_fit: bool) -> str:
    """``name: old -> new`` (roles shown when they differ), plus the edited names that were dropped."""
    roles = kept.role != fresh.role
    old = f"{kept.role} {_layout(kept)}" if roles else _layout(kept)
    new = f"{fresh.role} {_layout(fresh)}" if roles else _layout(fresh)
    line = f"{name}: {old} -> {new}" if not _same_layout(kept, fresh) else f"{name}: {new}"
    dropped = [] if names_fit or kept.names == _default_names(name, kept) else (kept.names or [])
    return f"{line} (names dropped: {', '.join(dropped)})" if dropped else line


def refresh_hint(path: Path) -> str:
    """How to refresh the contract file at ``path``: the ``hud-pipelines contract`` command of each
    pipeline that names it (found next to the file and in the pipelines directory)."""
    from hud_pipelines.spec.loader import contract_refresh_targets

    commands = [f"`hud-pipelines contract {target}`" for target in contract_refresh_targets(path)]
    command = " or ".join(commands) or "`hud-pipelines contract <pipeline>`"
    return (
        f"to take the env's shapes, refresh it with {command} "
        "(it keeps the names and descriptions that still fit and lists what changed)"
    )


def _same_layout(kept: Feature, fresh: Feature) -> bool:
    return kept.shape == fresh.shape and np.dtype(kept.dtype) == np.dtype(fresh.dtype) and kept.role == fresh.role


def _names_fit(kept: Feature, fresh: Feature) -> bool:
    """A camera's names are its axes (they fit another camera); a vector needs one name per value."""
    if kept.names is None:
        return True
    if kept.is_camera or fresh.is_camera:
        return kept.is_camera and fresh.is_camera
    return len(kept.names) == fresh.size


def _layout(feature: Feature) -> str:
    return f"{feature.dtype}{list(feature.shape)}"


def _default_names(name: str, feature: Feature) -> list[str]:
    if feature.is_camera:
        return list(CAMERA_NAMES)
    return [f"{name}_{i}" for i in range(feature.size)]
