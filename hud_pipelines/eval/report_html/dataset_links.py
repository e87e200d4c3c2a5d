"""Which dataset episode each card's episode became: ``report_files/dataset.js`` beside the page.

The report is written before the dataset is published (they are separate Dagster assets, and the
report must exist even when the dataset step fails), so the links cannot be in the page itself: the
report step writes this file from whatever dataset is published now (or none), the dataset step
writes it again after publishing, and the page's script fills each card's link from it. A script
rather than JSON so that it loads from ``file://`` too, where a page may not fetch files.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.eval.outputs import write_atomically

DATASET_SCRIPT = "dataset.js"
GLOBAL = "HUD_DATASET"
"""The name the script assigns: ``null``, ``{repo_id, root, href, episodes: {trace_id: index}}``, or a list of
those (a sweep's page: one per checkpoint's dataset)."""


def dataset_links(dataset: Path, repo_id: str, page_dir: Path) -> dict[str, Any] | None:
    """The published dataset at ``dataset`` as the page's links; ``None`` when none is published there."""
    records = read_episode_records(dataset)
    if not records:
        return None
    episodes = {str(r["trace_id"]): int(str(r["episode_index"])) for r in records if r.get("trace_id")}
    return {
        "repo_id": repo_id,
        "root": str(dataset),
        "href": urllib.parse.quote(Path(os.path.relpath(dataset, page_dir)).as_posix()),
        "episodes": episodes,
    }


def write_dataset_links(assets_dir: Path, dataset: Path | None, repo_id: str, *, members: Sequence[str] = ()) -> Path:
    """Write ``dataset.js`` into the page's assets folder (``null`` links without a published dataset).

    A sweep's page (``members``: its checkpoints' labels) shows every checkpoint's episodes, each published in its
    checkpoint's own dataset, a folder of ``dataset`` per label: the script then assigns a list of their links.
    """
    links: dict[str, Any] | list[dict[str, Any]] | None = None
    if dataset is not None and members:
        found = (dataset_links(dataset / label, repo_id, assets_dir.parent) for label in members)
        links = [link for link in found if link is not None] or None
    elif dataset is not None:
        links = dataset_links(dataset, repo_id, assets_dir.parent)
    path = assets_dir / DATASET_SCRIPT
    assets_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(links, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")
    write_atomically(path, f"window.{GLOBAL} = {text};\n")
    return path
