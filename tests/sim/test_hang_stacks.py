"""A hung sim says where it is stuck: every thread's stack, taken just before it is killed.

A sim that misses its start-up deadline, or a step's, is killed (its episodes error); the stacks
its threads were in are the one clue to why, and a renderer that never comes up (EGL/OSMesa
without its driver) is named with what to install.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from hud_pipelines.errors import SimStartError, SimTimeoutError
from hud_pipelines.sim.process import SimProcess

HUNG = f"{Path(__file__).with_name('hung_sims.py')}"


def _left(factory: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if factory in " ".join(p.info["cmdline"] or [])]


def test_a_sim_stuck_rendering_at_start_up_fails_in_its_deadline_naming_the_frame_and_what_to_install() -> None:
    factory = f"{HUNG}:hangs_rendering_at_start"
    started = time.monotonic()
    with pytest.raises(SimStartError) as caught:  # 6 s: a loaded machine's imports must reach the factory first
        SimProcess.spawn(factory, startup_timeout_s=6.0, env={"MUJOCO_GL": "egl"})
    assert time.monotonic() - started < 6.0 + 7.0, "the deadline, the stacks and the kill: seconds, not minutes"
    message = str(caught.value)
    assert "did not become ready within 6 s" in message
    assert "create_offscreen_gl_context" in message, "the stack the main thread was stuck in"
    assert "the sim seems stuck in its renderer" in message
    assert "libegl1 libegl-mesa0 libgl1-mesa-dri" in message
    assert "now: MUJOCO_GL=egl" in message
    assert caught.value.child_error is None, "a hang is not an error the child reported"
    assert not _left(factory), "no sim process left"


def test_a_step_that_hangs_is_reported_with_the_stack_it_hung_in() -> None:
    factory = f"{HUNG}:hangs_on_its_second_step"
    sim = SimProcess.spawn(factory, startup_timeout_s=30.0)
    try:
        client = sim.connect(step_timeout_s=1.0)
        client.reset({"seed": 0})
        client.step([[0.0]])
        with pytest.raises(SimTimeoutError) as caught:
            client.step([[0.0]])
        message = str(caught.value)
        assert "did not answer step within 1 s" in message
        assert "wait_for_the_physics_lock" in message
        assert "stuck in its renderer" not in message, "only a renderer's frames call for the renderer hint"
        assert not sim.alive()
    finally:
        sim.close(grace_s=1.0)
    assert not _left(factory)


def test_a_sim_that_fails_at_start_up_is_not_asked_for_stacks() -> None:
    with pytest.raises(SimStartError) as caught:
        SimProcess.spawn("hud_pipelines_no_such_module:make", startup_timeout_s=30.0)
    assert "most recent call first" not in str(caught.value)
    assert caught.value.child_error is not None
