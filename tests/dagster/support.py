"""Helpers of the Dagster tests: pipeline files written on the fly, a scan for leftover sim processes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIMS = Path(__file__).with_name("sims.py").resolve()
REPO = Path(__file__).resolve().parents[2]

WritePipeline = Callable[..., Path]


def pipeline_text(name: str, label: str, **overrides: Any) -> str:
    """A small CartPole pipeline (constant policy, short episodes) with ``overrides`` merged in."""
    spec: dict[str, Any] = {
        "name": name,
        "sim": {"factory": f"{SIMS}:cartpole", "num_envs": 2, "args": {"label": label}},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "group": 2,
        "max_steps": 30,
        "max_concurrent": 2,
        "graders": [{"kind": "return", "threshold": 25}],
    }
    for key, value in overrides.items():
        if key == "sim":
            args = {**spec["sim"]["args"], **value.get("args", {})}
            spec["sim"] = {**spec["sim"], **value, "args": args}
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return json.dumps(spec, indent=2)  # JSON is YAML


def sim_label(tmp_path: Path) -> str:
    """A label for one test's sims, unique across the suite's parallel workers.

    Each xdist worker numbers its ``tmp_path`` folders on its own, so two workers running the same
    test at once get the same folder name: the label holds a digest of the whole path.
    """
    return f"hud-test-{tmp_path.name}-{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]}"


def sim_processes(label: str) -> list[int]:
    """Live sim processes started with ``label`` (the tests' pipelines pass it as a build argument)."""
    marker = f"label={json.dumps(label)}"
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if marker in cmdline and "hud_pipelines.sim" in cmdline and state != "Z" and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found
