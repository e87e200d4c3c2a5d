"""How one env's observation is written into the slots' batch buffers: checked against the contract, row by row.

Both backends (:mod:`hud_pipelines.sim.envs`) write through here. The usual step of a state env, a bare array of
the contract's one feature, is copied with two comparisons; anything else is flattened and checked key by key,
and what does not fit is the env's :class:`~hud_pipelines.errors.ContractError`, naming the slot and the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract
from hud_pipelines.errors import ContractError

ObservationBuffer = dict[str, npt.NDArray[Any]]


def copied_bare(target: npt.NDArray[Any], observation: object, slot: int) -> bool:
    """Whether ``observation`` is a bare array of ``target``'s row shape and dtype, copied into row ``slot``."""
    kind = type(observation)  # exactly an array: a subclass (a masked array) takes the checked way
    if kind is not np.ndarray:
        return False
    array = np.asarray(observation)
    if array.shape != target.shape[1:] or array.dtype != target.dtype:
        return False
    target[slot] = array
    return True


def write_rows(
    out: ObservationBuffer,
    names: dict[str, str],
    contract: Contract,
    flat: dict[str, npt.NDArray[Any]],
    rows: slice | int,
    where: str,
) -> None:
    """Check a flattened observation against the contract and copy it into ``out[key][rows]``."""
    if flat.keys() != names.keys():
        raise ContractError(
            f"{where}: the env returned observation keys {sorted(flat)}, the contract has {sorted(names)}"
        )
    for name, array in flat.items():
        key = names[name]
        feature = contract.features[key]
        target = out[key][rows]
        expected = target.shape
        if array.shape != expected and array.size == target.size and array.ndim <= 1:
            array = array.reshape(expected)  # a scalar observation (e.g. Discrete) becomes shape (1,)
        if array.shape != expected or array.dtype != target.dtype:
            raise ContractError(
                f"{where}: observation {key!r} is {array.dtype}{list(array.shape)}, the contract says "
                f"{feature.dtype}{list(expected)}"
            )
        out[key][rows] = array
