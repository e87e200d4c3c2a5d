"""How an eval gets its sims: the pipeline's sim section as the pool reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES


@dataclass(frozen=True)
class SimSettings:
    """How to get a sim: spawn ``factory`` or attach to ``url``."""

    factory: str | None = None
    build_args: dict[str, Any] = field(default_factory=dict[str, Any])
    num_envs: int = 1
    contract_path: Path | None = None
    startup_timeout_s: float = 120.0
    step_timeout_s: float = 60.0
    options: tuple[str, ...] = ()
    servers: tuple[tuple[str, str], ...] = ()
    """``(url, token)`` of served sims to attach to instead of spawning: each serves one instance at a time."""
    busy_timeout_s: float = 600.0
    """How long an instance waits for served sims that other clients drive (they refuse it with HTTP 409)."""
    cwd: Path | None = None
    python: Path | None = None
    """The spawned children's interpreter (a file, or a uv project directory); ``None``: the agent's."""
    shards: int = 1
    """Children per spawned instance, each serving a slice of the ``num_envs`` slots (stepped in parallel)."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """The largest message of a spawned sim's link, both ways (its child's ``--max-frame-bytes`` says it too)."""
