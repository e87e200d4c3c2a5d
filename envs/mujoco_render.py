"""Offscreen MuJoCo rendering for the bundled MuJoCo sims (MetaWorld, ALOHA), failing loudly.

A renderer is made and tried once when the sim is built, so a GL stack that cannot start fails the
sim's start-up with what to install instead of the first step; the log line before it is what a
hanging GL stack leaves as the last line of the sim's stderr (the start-up deadline then stops the
sim, which writes every thread's stack too). MuJoCo is imported here only when a camera is asked for.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

RENDER_HINT = (
    "MuJoCo cannot render offscreen with MUJOCO_GL={backend}: install EGL and Mesa's drivers "
    "(`apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri`), or set MUJOCO_GL=osmesa with libosmesa6 installed, "
    "or leave out 'camera' for a state-only sim"
)


def render_hint() -> str:
    """:data:`RENDER_HINT` for the backend this process renders with."""
    return RENDER_HINT.format(backend=os.environ.get("MUJOCO_GL", ""))


def offscreen_renderer(model: Any, data: Any, camera: str, size: int, *, sim: str) -> Any:
    """A cheap ``size`` x ``size`` renderer of ``camera`` (no shadows, no multisampling), tried once now."""
    import mujoco  # pyright: ignore[reportMissingImports]

    names = [model.camera(i).name for i in range(model.ncam)]
    if camera not in names:
        raise ValueError(f"unknown {sim} camera {camera!r}; expected one of: {', '.join(names)}")
    model.vis.quality.shadowsize = 0
    model.vis.quality.offsamples = 0
    log.info("starting the offscreen renderer; if the sim hangs here: %s", render_hint())
    try:
        renderer = mujoco.Renderer(model, size, size)
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0  # pyright: ignore[reportAttributeAccessIssue]
        renderer.update_scene(data, camera=camera)
        renderer.render()
    except Exception as exc:
        raise RuntimeError(f"{render_hint()} ({type(exc).__name__}: {exc})") from exc
    return renderer
