"""What identifies a pipeline's content and its results: canonical hashes, and what they leave out.

A rollout hash decides whether a stored result is current. Credentials never enter it (rotating a key
changes who may connect, not what a rollout does), and neither does where a sweep's checkpoints are
listed: a sweep member is identified by its weights' content (:func:`checkpoint_rollout_hash`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

from hud_pipelines.spec.agent import DEFAULT_SEND_AHEAD

CREDENTIALS: dict[str, Any] = {"sim": {"token"}, "agent": {"policy": {"api_key"}}}
"""The secret fields of a pipeline, as a pydantic ``exclude`` (they never decide a rollout)."""

SWEEP_SOURCES: dict[str, Any] = {"sim": {"token"}, "agent": {"policy": {"api_key", "checkpoints"}}}
"""What a sweep's rollout hash leaves out: the credentials and where its checkpoints are listed."""

LATER_DEFAULTS: dict[str, dict[str, object]] = {"graders": {"at": "any"}}
"""Keys that came after results existed, per item of a list section, with their defaults: left out of the
rollout hash while at the default, so that upgrading keeps every earlier result current (a success grader
without ``at`` counted success at any step before ``at`` existed, as ``at: any`` does)."""

SCHEDULING: dict[str, dict[str, object]] = {"agent": {"send_ahead": DEFAULT_SEND_AHEAD}}
"""Settings that only schedule the work, with their defaults: hashed at the default whatever they hold, since they
make the same episodes (steps pipelined to a served sim), so tuning one keeps every result current."""

REGISTRY_SLOTS_APART: dict[str, str] = {"slots": "one gym.make env each"}
"""What the sim of a registry id with several slots and no ``vectorization_mode`` adds to its rollout hash. Its slots
were one gymnasium ``SyncVectorEnv`` before they were one env each: a vector env autoresets a slot without its task's
options and casts observations to its space's dtype, so an env that needs either ran other episodes then, and
results of that stepping are not current."""

LINK_SETTINGS: dict[str, set[str]] = {"sim": {"max_frame_mb"}}
"""Settings of the link to a sim, never in the rollout hash: a frame that fits makes the same episode under any limit,
and one that does not makes none."""

TRACKED_FILES: dict[str, set[str]] = {"sim": {"data_files"}}
"""What lists files whose content the provenance holds, never in the rollout hash: listing one adds its digest to the
results' fingerprint (:mod:`hud_pipelines.eval.sources`), it does not change what a rollout does."""

MISSING = object()


def with_slot_stepping(dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` with :data:`REGISTRY_SLOTS_APART` in its sim where a registry id (a ``factory`` without ``:``, or a
    ``lerobot_env``) has sims of several slots (``num_envs`` over ``shards``) that its ``args`` do not make one vector
    env (no ``vectorization_mode``, or ``null``, which meant ``sync`` then)."""
    sim: dict[str, Any] = dumped.get("sim") or {}
    factory, args = sim.get("factory"), dict[str, Any](sim.get("args") or {})
    registry = bool(sim.get("lerobot_env")) or (isinstance(factory, str) and ":" not in factory)
    slots_per_sim = -(-int(sim.get("num_envs", 1)) // int(sim.get("shards", 1)))  # the largest shard's
    apart = registry and slots_per_sim > 1 and args.get("vectorization_mode") is None
    return {**dumped, "sim": {**sim, **REGISTRY_SLOTS_APART}} if apart else dumped


def without_later_defaults(dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` without the :data:`LATER_DEFAULTS` keys that hold their default nor the :data:`LINK_SETTINGS` and
    :data:`TRACKED_FILES`, and the :data:`SCHEDULING` settings at theirs."""
    out = dict(dumped)
    for section, keys in (*LINK_SETTINGS.items(), *TRACKED_FILES.items()):
        held_link: dict[str, Any] = out.get(section) or {}
        if keys & held_link.keys():
            out[section] = {k: v for k, v in held_link.items() if k not in keys}
    for section, defaults in SCHEDULING.items():
        held: dict[str, Any] = out.get(section) or {}
        if held:
            out[section] = {**held, **{k: v for k, v in defaults.items() if k in held}}
    for section, defaults in LATER_DEFAULTS.items():
        items = out.get(section)
        if isinstance(items, list):
            out[section] = [
                {k: v for k, v in cast(dict[str, Any], item).items() if defaults.get(k, MISSING) != v}
                if isinstance(item, dict)
                else item
                for item in cast(list[object], items)
            ]
    return out


def flat(value: object, prefix: str = "") -> dict[str, Any]:
    """``{"sim": {"num_envs": 2}}`` -> ``{"sim.num_envs": 2}`` (lists stay whole: they are one setting)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in cast(dict[str, Any], value).items():
            out |= flat(item, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): value}


def checkpoint_rollout_hash(sweep_rollout_hash: str, content_hash: str) -> str:
    """The rollout hash of one checkpoint of a sweep: the sweep's and the weights' content, nothing else."""
    return canonical_hash({"sweep": sweep_rollout_hash, "checkpoint": content_hash})


def canonical_hash(value: object) -> str:
    """SHA-256 (hex) of a JSON-able value in canonical form: the same content, the same hash, in any process."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def rollout_content(dumped: dict[str, Any]) -> dict[str, Any]:
    """What of a pipeline's dump its rollout hash is taken of (:func:`with_slot_stepping`,
    :func:`without_later_defaults`)."""
    return without_later_defaults(with_slot_stepping(dumped))
