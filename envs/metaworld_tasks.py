"""MetaWorld (v3) manipulation tasks as sims: ``envs.metaworld_tasks:make``.

MetaWorld 3.0.0 needs MuJoCo 3.3 (under MuJoCo 4 its envs fail to build), so these sims run under
their own Python environment, ``sims/metaworld`` (``sim.python: ../sims/metaworld`` in a pipeline;
set up by ``scripts/setup``). This module imports ``metaworld`` only inside :func:`make`, so the
agent's environment, which has no MetaWorld, can still read the factory's signature (``hud-pipelines
validate``) and the task descriptions the experts in :mod:`envs.metaworld_experts` share.

Each sim is one MetaWorld task (``reach-v3``, ``push-v3``, ``pick-place-v3``, ...) of the MT1
benchmark with its goal and object positions drawn from the reset seed, as lerobot's MetaWorld env
does: the same seed gives the same episode. Its observation is MetaWorld's flat 39-dim vector
(feature ``state``: hand position, gripper opening, object poses, the previous frame, the goal), what
the scripted experts read; with ``camera`` it is ``{"state", "pixels"}`` with a ``size x size`` RGB
frame for the dataset and the trace videos. The episode terminates when MetaWorld reports success
(``info["is_success"]``), and is truncated after ``max_episode_steps`` (MetaWorld's own limit is 500).

Frames are rendered offscreen (``MUJOCO_GL=egl`` unless set) without shadows and multisampling:
with Mesa's software rasteriser a 96x96 frame then costs ~10 ms instead of ~60 ms. A first frame is
rendered while the sim builds, so a renderer that cannot start fails the sim's start-up with what to
install, and one that hangs is stopped by the start-up deadline with that advice as its last line.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from envs.mujoco_render import offscreen_renderer, render_hint

STATE = "state"
PIXELS = "pixels"
OBSERVATION_SIZE = 39
ROBOT_TYPE = "sawyer"
"""Every MetaWorld task is a Sawyer arm with a two-finger gripper."""
MAX_EPISODE_STEPS = 500
"""MetaWorld's ``max_path_length``: it refuses to step an episode further."""
TASK_DESCRIPTIONS = {
    "reach-v3": "reach the goal position with the gripper",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
}
"""The prompt each task offers (any other MetaWorld v3 task offers its own name)."""
FLIPPED_CAMERAS = frozenset({"corner2"})
"""Cameras whose frames MetaWorld renders upside down (lerobot flips them too)."""
CORNER2_POSITION = (0.75, 0.075, 0.7)
"""lerobot's placement of ``corner2``, which frames the table better than MetaWorld's default."""


class MetaWorldTask(gym.Env[Any, npt.NDArray[np.float32]]):
    """One MetaWorld task; see the module docstring for the observation, seeding and termination."""

    def __init__(
        self,
        task: str = "push-v3",
        *,
        camera: str | None = None,
        size: int = 96,
        max_episode_steps: int = MAX_EPISODE_STEPS,
        benchmark_seed: int = 0,
    ) -> None:
        if camera is not None:
            os.environ.setdefault("MUJOCO_GL", "egl")  # before MuJoCo is imported: headless rendering
        metaworld = _import_metaworld()
        if task not in metaworld.ALL_V3_ENVIRONMENTS:
            known = ", ".join(sorted(metaworld.ALL_V3_ENVIRONMENTS))
            raise ValueError(f"unknown MetaWorld task {task!r}; expected one of: {known}")
        if not 1 <= max_episode_steps <= MAX_EPISODE_STEPS:
            raise ValueError(f"max_episode_steps must be in [1, {MAX_EPISODE_STEPS}], got {max_episode_steps}")
        benchmark = metaworld.MT1(task, seed=benchmark_seed)
        self.env: Any = benchmark.train_classes[task]()
        self.env.set_task(benchmark.train_tasks[0])
        self.env._freeze_rand_vec = False  # a new goal and object placement at every reset...
        self.env.seeded_rand_vec = True  # ...drawn from the env's seeded generator
        self.task = task
        self.task_description = TASK_DESCRIPTIONS.get(task, task)
        self.max_episode_steps = max_episode_steps
        self.metadata = {"render_fps": self.env.metadata.get("render_fps", 80), "robot_type": ROBOT_TYPE}
        self.action_space = self.env.action_space
        state_space = gym.spaces.Box(-np.inf, np.inf, (OBSERVATION_SIZE,), np.float64)
        self.camera = camera
        self._renderer: Any = None
        if camera is None:
            self.observation_space: gym.Space[Any] = state_space
        else:
            self._renderer = _offscreen_renderer(self.env, camera, size)
            pixels = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
            self.observation_space = gym.spaces.Dict({STATE: state_space, PIXELS: pixels})
        self._elapsed = 0

    def _observation(self, state: npt.NDArray[np.float64]) -> Any:
        if self._renderer is None:
            return state
        return {STATE: state, PIXELS: self.render()}

    def render(self) -> npt.NDArray[np.uint8]:  # pyright: ignore[reportIncompatibleMethodOverride]
        if self._renderer is None:
            raise ValueError("this MetaWorld sim has no camera: pass camera='corner2' (or another camera) to make()")
        self._renderer.update_scene(self.env.data, camera=self.camera)
        frame: npt.NDArray[np.uint8] = self._renderer.render()
        return np.ascontiguousarray(np.flip(frame, (0, 1))) if self.camera in FLIPPED_CAMERAS else frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.env.seed(seed)
        state, _ = self.env.reset()
        self._elapsed = 0
        return self._observation(state), {"is_success": False}

    def step(self, action: npt.NDArray[np.float32]) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        state, reward, _, truncated, info = self.env.step(np.asarray(action, dtype=np.float32))
        self._elapsed += 1
        success = bool(info.get("success", 0.0))
        info = {**info, "is_success": success}
        truncated = bool(truncated) or self._elapsed >= self.max_episode_steps
        return self._observation(state), float(reward), success, truncated, info

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.env.close()


def _import_metaworld() -> Any:
    """``metaworld``; MuJoCo loads the GL library ``MUJOCO_GL`` names as it is imported, so that can fail here."""
    try:
        import metaworld  # pyright: ignore[reportMissingImports] - installed in sims/metaworld only
    except ModuleNotFoundError:
        raise
    except Exception as exc:
        if os.environ.get("MUJOCO_GL") is None:
            raise
        raise RuntimeError(f"{render_hint()} ({type(exc).__name__}: {exc})") from exc
    return metaworld


def _offscreen_renderer(env: Any, camera: str, size: int) -> Any:
    if camera == "corner2" and camera in {env.model.camera(i).name for i in range(env.model.ncam)}:
        env.model.cam_pos[env.model.camera(camera).id] = CORNER2_POSITION
    return offscreen_renderer(env.model, env.data, camera, size, sim="MetaWorld")


def make(
    task: str = "push-v3",
    camera: str | None = None,
    size: int = 96,
    max_episode_steps: int = MAX_EPISODE_STEPS,
    benchmark_seed: int = 0,
) -> gym.Env[Any, Any]:
    """A MetaWorld task (``reach-v3``, ``push-v3``, ``pick-place-v3``, ...); ``camera`` adds ``pixels``.

    ``benchmark_seed`` seeds MetaWorld's MT1 benchmark, which fixes the task's first goal; every reset
    seed then draws its own placement.
    """
    return MetaWorldTask(
        task, camera=camera, size=size, max_episode_steps=max_episode_steps, benchmark_seed=benchmark_seed
    )
