"""Observation trees: the nested dicts and tuples (of arrays or torch tensors) envs return, walked one way.

Every reader of an env's observation goes through these: the contract derivation, the slots'
batch buffers and ``wrap(env)``. A ``Dict`` (or ``Tuple``) observation flattens to ``{"a/b": array}``
keys; a tensor is converted without this module importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt


def is_mapping(value: object) -> TypeGuard[Mapping[Any, object]]:
    """A dict-like node of an observation tree (its values are unknown until walked). A plain ``dict`` is told
    first: the ABC check costs a microsecond, and every slot's ``info`` of every step is read through here."""
    return type(value) is dict or isinstance(value, Mapping)


def is_tuple(value: object) -> TypeGuard[tuple[object, ...]]:
    """A tuple node of an observation tree."""
    return isinstance(value, tuple)


def to_numpy(value: object) -> npt.NDArray[Any]:
    """Convert an array-like, including a torch tensor on any device, to numpy without importing torch."""
    detach: Any = getattr(value, "detach", None)
    if callable(detach):
        tensor: Any = detach()
        return np.asarray(tensor.cpu().numpy())
    return np.asarray(value)


def flatten_observation(observation: object, prefix: str = "") -> dict[str, npt.NDArray[Any]]:
    """Flatten a (nested) dict/tuple observation into ``{"a/b": array}``; a bare value is one entry."""
    if is_mapping(observation):
        flat: dict[str, npt.NDArray[Any]] = {}
        for key, value in observation.items():
            flat.update(flatten_observation(value, f"{prefix}{key}/"))
        return flat
    if is_tuple(observation):
        flat = {}
        for index, value in enumerate(observation):
            flat.update(flatten_observation(value, f"{prefix}{index}/"))
        return flat
    return {prefix.rstrip("/"): to_numpy(observation)}


def observation_row(observation: object, row: int) -> object:
    """Row ``row`` of a batched (vector env) observation, keeping its nesting (for contract derivation)."""
    if is_mapping(observation):
        return {k: observation_row(v, row) for k, v in observation.items()}
    if is_tuple(observation):
        return tuple(observation_row(v, row) for v in observation)
    return to_numpy(observation)[row]


def leaves(observation: object) -> list[object]:
    """The leaves of a (nested) dict/tuple observation, without converting them."""
    if is_mapping(observation):
        return [x for v in observation.values() for x in leaves(v)]
    if is_tuple(observation):
        return [x for v in observation for x in leaves(v)]
    return [observation]
