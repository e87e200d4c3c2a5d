"""How the errors of a sharded instance name the child they came from and its slots.

A sharded instance's K children each number their slots from 0 and know nothing of the others; the
grade rows, the traces and the agent number them as the instance's. Every error of a child is said in
the instance's terms here: led by the child (``shard 1 of 2 (slots 2-3)``), of the same type (so the
same :class:`~hud_pipelines.errors.Fault`), with the slot numbers its messages give as the instance's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hud_pipelines import errors
from hud_pipelines.contract import Contract


def describe(shard: int, slots: range, shards: int) -> str:
    """``shard 1 of 2 (slots 2-3)``: how errors name a child."""
    span = f"slot {slots.start}" if len(slots) == 1 else f"slots {slots.start}-{slots.stop - 1}"
    return f"shard {shard} of {shards} ({span})"


_SLOT_NUMBER = re.compile(r"(?:^|(?<=: ))slot (\d+)(?=: )")
"""A slot as the sim's own whole-request messages name it (``slot 2: seed must be an integer or null, got ...``); an
env's own text (``gripper slot 0 jammed``) is left as it is. An episode's own end (an env that raised, a refused
row, a value not finite, an observation the contract refuses) names its seed and step instead, which no split of
the slots changes."""


def instance_slots(message: str, offset: int) -> str:
    """A child's message with the slot numbers it gives as the instance's: the child numbers its own slice
    from 0 (``slot 1`` of the child of slots 2-3 is slot 3 of the instance, the grade row's)."""
    return _SLOT_NUMBER.sub(lambda found: f"slot {int(found[1]) + offset}", message) if offset else message


def contract_difference(first: Contract, other: Contract) -> str:
    """What differs between two contracts, in a few words (the first difference found)."""
    for name in sorted(set(first.features) | set(other.features)):
        mine, theirs = first.features.get(name), other.features.get(name)
        if mine is None or theirs is None:
            return f"feature {name!r} only in {'the first' if theirs is None else 'the other'}"
        if mine != theirs:
            fields = [k for k, v in mine.model_dump().items() if theirs.model_dump()[k] != v]
            return f"feature {name!r} differs in {', '.join(fields)}"
    mine_top: Mapping[str, Any] = first.model_dump(exclude={"features"})
    theirs_top: Mapping[str, Any] = other.model_dump(exclude={"features"})
    fields = [k for k, v in mine_top.items() if theirs_top.get(k) != v]
    return f"{', '.join(fields)} differ" if fields else "they differ"


def shard_error(exc: errors.SimError | errors.WireError, where: str, offset: int) -> errors.HudPipelinesError:
    """The same error (type and details, hence the same fault), its message led by the child it came from.

    A remote error's slot, and the slots its message names, are renumbered as the instance's (``offset``: the
    child's first slot).
    """
    match exc:
        case errors.RemoteError():
            slot = None if exc.slot is None else exc.slot + offset
            return errors.RemoteError(
                f"{where}: {instance_slots(exc.message, offset)}",
                phase=exc.phase,
                slot=slot,
                remote_traceback=exc.remote_traceback,
                cause=exc.cause,
            )
        case errors.SimContractError():
            return errors.SimContractError(f"{where}: {exc}")
        case errors.WireError():
            return errors.WireError(f"{where}: {exc}")
        case errors.SimStartError():
            return errors.SimStartError(f"{where}: {exc}", child_error=exc.child_error, signalled=exc.signalled)
        case errors.SimCrashedError():
            return errors.SimCrashedError(f"{where}: {exc}", returncode=exc.returncode)
        case errors.SimTimeoutError():
            return errors.SimTimeoutError(f"{where}: {exc}", deadline_s=exc.deadline_s)
        case errors.SimRefusedError():
            return errors.SimRefusedError(f"{where}: {exc}", status=exc.status, running_for_s=exc.running_for_s)
        case _:
            return errors.SimError(f"{where}: {exc}")
