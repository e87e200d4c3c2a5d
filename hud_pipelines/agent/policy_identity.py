"""What a policy server says of its policy, as the identity a run records and holds its server to.

An openpi-style server's first frame on each connection says what it serves (its metadata: a policy name, an action
horizon, normalization statistics). A run records it in its results' provenance, so results of another policy
served at the same address are never pooled with these, and refuses a server that says otherwise mid-run. It is
kept as JSON a strict reader takes: arrays, bytes and long lists as their digest, keys as text, non-finite floats
as text. Light on purpose: the provenance reads it without the websocket client.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, cast

import numpy as np
import numpy.typing as npt

LONG_LIST = 64
"""A list longer than this (statistics sent as lists) is recorded as its length and digest, as an array is."""
SAID_CHARS = 300
"""How much of an identity a message quotes."""


def metadata_identity(metadata: Any) -> Any:
    """``metadata`` as JSON with its keys in order: an array, bytes or a long list as its digest (normalization
    statistics are not worth a provenance's bytes, and their digest tells them apart as well)."""
    if isinstance(metadata, np.ndarray):
        array = np.asarray(cast(npt.NDArray[Any], metadata)).copy(order="C")  # a 0-d array keeps its shape
        digest = _digest(array.tobytes())
        return {"array": array.dtype.str, "shape": list(array.shape), "sha256": digest}
    if isinstance(metadata, bytes | bytearray):
        return {"bytes": len(metadata), "sha256": _digest(bytes(metadata))}
    if isinstance(metadata, np.generic):
        return metadata_identity(metadata.item())
    if isinstance(metadata, dict):
        keyed: dict[str, Any] = {}
        for key, value in cast(dict[Any, Any], metadata).items():
            name = _key_text(key)
            keyed[repr(key) if name in keyed else name] = value  # b"a" and "a", 1 and "1": two keys still
        return {name: metadata_identity(keyed[name]) for name in sorted(keyed)}
    if isinstance(metadata, list | tuple):
        items = [metadata_identity(item) for item in cast(list[Any], metadata)]
        return items if len(items) <= LONG_LIST else {"list": len(items), "sha256": _digest(canonical(items).encode())}
    if isinstance(metadata, float) and not math.isfinite(metadata):
        return repr(metadata)  # NaN is no JSON a strict reader takes
    return metadata if metadata is None or isinstance(metadata, str | int | float) else repr(metadata)


def canonical(identity: Any) -> str:
    """One text per identity: what two identities are compared by."""
    return json.dumps(identity, sort_keys=True)


def said(identity: Any) -> str:
    """An identity in a line of a message (JSON, cut at :data:`SAID_CHARS`); an empty one says so."""
    if not identity:
        return "nothing of its policy (an empty metadata frame)"
    text = canonical(identity)
    return f"`{text if len(text) <= SAID_CHARS else text[: SAID_CHARS - 3] + '...'}`"


def changed(was: Any, now: Any) -> str:
    """How an identity changed, in a line: both as :func:`said` quotes them, or, where they read alike that far (a
    change past the cut), the top-level keys whose values differ."""
    before, after = said(was), said(now)
    if before != after or not isinstance(was, dict) or not isinstance(now, dict):
        return f"{before} -> {after}"
    old, new = cast(dict[str, Any], was), cast(dict[str, Any], now)
    keys = sorted(k for k in {*old, *new} if canonical(old.get(k)) != canonical(new.get(k)))
    return f"changed in {', '.join(keys)} (past the first {SAID_CHARS} characters of {before})"


def _key_text(key: object) -> str:
    """A map key as text: a text key as it is, a bytes key decoded (openpi's encoder writes either), others' repr."""
    if isinstance(key, bytes):
        return key.decode(errors="backslashreplace")
    return key if isinstance(key, str) else repr(key)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
