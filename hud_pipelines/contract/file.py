"""The editable ``contract.json``: written once at an explicit path, then loaded and merged.

Later runs load that file and merge it with a fresh derivation: human edits to names,
descriptions, types, bounds, the control rate and the robot type survive, while a shape or dtype
that no longer matches the env is an error naming the feature, the file, both shapes and the
command that refreshes the file (``hud-pipelines contract <pipeline>``, see
:func:`refresh_contract`: the env's new shapes, the edits that still fit, a line per change). An
eval never refreshes a file by itself: a contract is what its results are read by. The file never
lands in the working directory by accident: without a path the contract lives in memory only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from hud_pipelines.contract.derive import camera_advice, camera_shaped
from hud_pipelines.contract.model import CAMERA_NAMES, Contract, Feature
from hud_pipelines.errors import ContractError


def load_contract(path: Path) -> Contract:
    """Read a contract file; a malformed one is an error naming the file and the field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    except UnicodeDecodeError as exc:  # a value typed in another encoding (a Latin-1 accent)
        raise ContractError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
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
        switched = kept.is_camera != fresh.is_camera  # the file's word, where a uint8 image's bounds were unsure
        if switched and not camera_shaped(fresh.dtype, fresh.shape):
            raise ContractError(f"{source}: {_camera_mismatch(name, kept, fresh)}{hint}")
        if not _names_fit(kept, kept if switched else fresh):
            raise ContractError(
                f"{source}: feature {name!r} has {len(kept.names or [])} names for {fresh.size} values{hint}"
            )
        wider = _wider_bounds(kept, fresh)
        if wider:
            raise ContractError(
                f"{source}: feature {name!r} has action bounds wider than the env's action space ({wider}): "
                "actions are clipped to the file's bounds, so the env would get actions outside its space; narrow "
                "them to the env's or within"
            )
        merged[name] = kept
    return edited.model_copy(update={"features": merged})


def _wider_bounds(edited: Feature, env: Feature) -> str:
    """Where an action feature's edited bounds reach past the env's finite ones (``[0] low -10 < -1``), or ``""``.
    Narrower bounds are an edit like any other (a gentler controller); wider ones break the env's space."""
    if edited.role != "action":
        return ""
    found: list[str] = []
    for side, mine, theirs, past in (
        ("low", edited.low, env.low, np.less),
        ("high", edited.high, env.high, np.greater),
    ):
        if mine is None or theirs is None or len(mine) != len(theirs):
            continue
        ours, limit = np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        outside = np.isfinite(limit) & past(ours, limit)
        found += [
            f"[{i}] {side} {ours[i]:g} {'<' if side == 'low' else '>'} {limit[i]:g}" for i in np.flatnonzero(outside)
        ]
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def resolve_contract(derived: Contract, path: Path | None) -> Contract:
    """Write ``derived`` to ``path`` the first time; afterwards load the file and merge.

    With ``path=None`` nothing touches the disk. The file is rewritten only when the merge added
    features, so a user's formatting survives ordinary runs. A file the env no longer fits is an
    error; the eval that reads it from the sim child adds the command that refreshes the file
    (:func:`hud_pipelines.spec.loader.refresh_hint`: the sim side knows nothing of pipelines).
    """
    if path is None:
        return derived
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(derived.to_json())
        return derived
    edited = load_contract(path)
    merged = merge_contract(edited, derived, source=path)
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


def _same_layout(kept: Feature, fresh: Feature) -> bool:
    return kept.shape == fresh.shape and np.dtype(kept.dtype) == np.dtype(fresh.dtype) and kept.role == fresh.role


def _names_fit(kept: Feature, fresh: Feature) -> bool:
    """A camera's names are its axes (they fit another camera); a vector needs one name per value."""
    if kept.names is None:
        return True
    if kept.is_camera or fresh.is_camera:
        return kept.is_camera and fresh.is_camera
    return len(kept.names) == fresh.size


def _camera_mismatch(name: str, kept: Feature, fresh: Feature) -> str:
    """Why a feature cannot change between state and camera in the file: cameras are what the env gives as
    ``uint8`` ``HWC`` images, and the dataset and the traces store them as such (channel-first, or another
    dtype, is read as state: transpose or convert it in the env)."""
    return (
        f"feature {name!r} is typed {kept.type.value} in the contract file, but the env gives {_layout(fresh)}, which "
        f"is read as state ({fresh.size} values): {camera_advice(fresh.shape, fresh.dtype)}"
    )


def _layout(feature: Feature) -> str:
    return f"{feature.dtype}{list(feature.shape)}"


def _default_names(name: str, feature: Feature) -> list[str]:
    if feature.is_camera:
        return list(CAMERA_NAMES)
    return [f"{name}_{i}" for i in range(feature.size)]
