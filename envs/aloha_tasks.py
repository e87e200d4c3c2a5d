"""ALOHA bimanual tasks with end-effector (mocap) control, as sims: ``envs.aloha_tasks:make``.

gym-aloha 0.1.5 (the release lerobot's ``aloha`` extra allows) pins MuJoCo < 3.9 through dm-control,
while the agent's environment has MuJoCo 4, so these sims run under their own Python environment,
``sims/aloha`` (``sim.python: ../sims/aloha`` in a pipeline; set up by ``scripts/setup``). This module
imports ``gym_aloha`` and MuJoCo only when a sim is built, so the agent's environment can still read
the factory's signature (``hud-pipelines validate``).

gym-aloha registers only joint-space envs (``gym_aloha/AlohaTransferCube-v0``: 14 joint targets per
step). It ships the end-effector variant of each task (the ``bimanual_viperx_end_effector_*.xml``
scenes, where a weld ties each gripper to a mocap body, and ``TransferCubeEndEffectorTask`` /
``InsertionEndEffectorTask``), but its ``AlohaEnv`` refuses to build them, and their observation
renders three 640x480 cameras every step (~0.25 s here with Mesa's software rasteriser). This sim
therefore drives those scenes and tasks itself: gym-aloha's task places the robots and the mocap
bodies, turns an action into mocap poses and finger targets (``before_step``) and grades
(``get_reward``), and MuJoCo's weld does the inverse kinematics, as in ACT's EE sim. Two things are
this module's: the welds get MuJoCo's default impedance instead of the scenes' soft ``.25 .25``
(with those, under MuJoCo 3.8, the gripper lags its target by centimetres and knocks the cube
away: the scripted expert solved 1 of 10 seeds), and the observation:

- ``agent_pos`` ``[14]``: each arm's six joint positions and its normalised gripper opening (what
  gym-aloha's ``pixels_agent_pos`` observation calls ``agent_pos`` and lerobot's ALOHA datasets
  store as ``observation.state``);
- ``env_state`` ``[7]`` (cube) or ``[14]`` (peg, then socket): each object's position and
  quaternion ``(w, x, y, z)``; the reset observation holds the initial pose a scripted expert plans
  from;
- ``mocap_pose`` ``[14]``: each end effector's mocap target (xyz, quaternion), left then right;
- with ``camera``: that camera's ``size x size`` RGB frame, under the camera's name (``top`` becomes
  lerobot's ``observation.images.top``).

The action is ``[16]``: per arm (left, then right) the end effector's target position and
quaternion and the gripper opening (0 closed, 1 open). A quaternion is normalised before it reaches
MuJoCo (a zero one holds the arm's current orientation target).

The reset seed places the objects with gym-aloha's own samplers (``sample_box_pose(seed)``,
``sample_insertion_pose(seed)``): a seed gives the same cube as ``AlohaTransferCube-v0`` reset with
it. The reward is gym-aloha's stage (0-4; for the transfer cube 1 touched by the right gripper, 2
lifted, 3 touched by the left, 4 held by the left gripper off the table; for the insertion 1 each
object touched by its gripper, 2 both held off the table, 3 the peg touching the socket, 4 the peg
touching the pin inside it); the episode terminates with ``info["is_success"]`` when it reaches 4,
and is truncated after ``max_episode_steps`` (400, as ACT's scripted episodes).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from envs.mujoco_render import offscreen_renderer, render_hint

AGENT_POS = "agent_pos"
ENV_STATE = "env_state"
MOCAP_POSE = "mocap_pose"
ROBOT_TYPE = "aloha"
CONTROL_RATE = 50
"""gym-aloha's ``FPS``: one action every ``DT = 0.02`` s."""
MAX_EPISODE_STEPS = 400
"""ACT's scripted episodes last 400 steps (8 s)."""
MAX_REWARD = 4
"""gym-aloha's last stage: the task is solved."""
JOINTS = 14
ARM_ACTION = 8
"""Per arm: xyz, quaternion (w, x, y, z), gripper opening."""
TASKS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "transfer_cube": (
        "bimanual_viperx_end_effector_transfer_cube.xml",
        ("red_box_joint",),
        "pick up the red cube with the right arm and hand it over to the left arm",
    ),
    "insertion": (
        "bimanual_viperx_end_effector_insertion.xml",
        ("red_peg_joint", "blue_socket_joint"),
        "pick up the peg and the socket, one in each gripper, and insert the peg into the socket",
    ),
}
"""Per task: gym-aloha's end-effector scene, the free joints of its objects, the prompt it offers."""
WELD_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)
"""MuJoCo's default constraint impedance, for the welds instead of the scenes' ``.25 .25 0.001``."""


def _action_space() -> gym.spaces.Box[np.float32]:
    """Positions within a metre of the table's centre, quaternion components in [-1, 1], grippers in [0, 1]."""
    arm_low = [-1.0] * 7 + [0.0]
    arm_high = [1.0] * 8
    low = np.asarray(arm_low * 2, dtype=np.float32)
    high = np.asarray(arm_high * 2, dtype=np.float32)
    return gym.spaces.Box(low, high, dtype=np.float32)


def normalized_quaternions(
    action: npt.NDArray[np.float64], current: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``action`` with each arm's quaternion of unit length; a zero one becomes ``current``'s (per arm, ``[2, 4]``)."""
    arms = action.reshape(2, ARM_ACTION).copy()
    norms = np.linalg.norm(arms[:, 3:7], axis=1, keepdims=True)
    arms[:, 3:7] = np.where(norms > 1e-9, arms[:, 3:7] / np.maximum(norms, 1e-9), current)
    return arms.reshape(-1)


class AlohaEndEffectorTask(gym.Env[Any, npt.NDArray[np.float32]]):
    """One ALOHA task under end-effector control; see the module docstring for what it observes and grades."""

    def __init__(
        self,
        task: str = "transfer_cube",
        *,
        camera: str | None = None,
        size: int = 128,
        max_episode_steps: int = MAX_EPISODE_STEPS,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown ALOHA task {task!r}; expected one of: {', '.join(TASKS)}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        # Before MuJoCo and dm-control are imported: headless rendering for a camera, else none at all
        # (dm-control would otherwise try GLFW first, which warns without a display).
        os.environ.setdefault("MUJOCO_GL", "egl" if camera is not None else "disable")
        scene, self.objects, self.task_description = TASKS[task]
        self.physics, self._task = _build(task, scene)
        self._object_addresses = [
            self.physics.model.jnt_qposadr[self.physics.model.name2id(name, "joint")] for name in self.objects
        ]
        self._substeps = max(1, round(1.0 / CONTROL_RATE / float(self.physics.model.opt.timestep)))
        self.task = task
        self.max_episode_steps = max_episode_steps
        self.metadata = {"render_fps": CONTROL_RATE, "robot_type": ROBOT_TYPE}
        self.action_space = _action_space()
        spaces: dict[str, gym.Space[Any]] = {
            AGENT_POS: gym.spaces.Box(-np.inf, np.inf, (JOINTS,), np.float64),
            ENV_STATE: gym.spaces.Box(-np.inf, np.inf, (7 * len(self.objects),), np.float64),
            MOCAP_POSE: gym.spaces.Box(-np.inf, np.inf, (14,), np.float64),
        }
        self.camera = camera
        self._renderer: Any = None
        if camera is not None:
            self._renderer = _offscreen_renderer(self.physics, camera, size)
            spaces[camera] = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.observation_space: gym.Space[Any] = gym.spaces.Dict(spaces)
        self._elapsed = 0

    def _observation(self) -> dict[str, npt.NDArray[Any]]:
        data = self.physics.data
        observation: dict[str, npt.NDArray[Any]] = {
            AGENT_POS: np.asarray(self._task.get_qpos(self.physics), dtype=np.float64),
            ENV_STATE: np.concatenate([data.qpos[address : address + 7] for address in self._object_addresses]),
            MOCAP_POSE: np.concatenate([data.mocap_pos[0], data.mocap_quat[0], data.mocap_pos[1], data.mocap_quat[1]]),
        }
        if self.camera is not None:
            observation[self.camera] = self.render()
        return observation

    def render(self) -> npt.NDArray[np.uint8]:  # pyright: ignore[reportIncompatibleMethodOverride]
        if self._renderer is None:
            raise ValueError("this ALOHA sim has no camera: pass camera='top' (or another camera) to make()")
        self._renderer.update_scene(self.physics.data.ptr, camera=self.camera)
        return self._renderer.render()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
        super().reset(seed=seed)
        poses = _sample_poses(self.task, seed if seed is not None else int(self.np_random.integers(2**31)))
        with self.physics.reset_context():
            self._task.initialize_robots(self.physics)
            for address, pose in zip(self._object_addresses, poses, strict=True):
                self.physics.data.qpos[address : address + 7] = pose
        self._elapsed = 0
        return self._observation(), {"is_success": False}

    def step(
        self, action: npt.NDArray[np.float32]
    ) -> tuple[dict[str, npt.NDArray[Any]], float, bool, bool, dict[str, Any]]:
        data = self.physics.data
        current = np.stack([data.mocap_quat[0], data.mocap_quat[1]])
        self._task.before_step(normalized_quaternions(np.asarray(action, dtype=np.float64), current), self.physics)
        self.physics.step(self._substeps)
        self._elapsed += 1
        reward = int(self._task.get_reward(self.physics))
        success = reward == MAX_REWARD
        truncated = self._elapsed >= self.max_episode_steps
        return self._observation(), float(reward), success, truncated and not success, {"is_success": success}

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def _build(task: str, scene: str) -> tuple[Any, Any]:
    """gym-aloha's end-effector scene as dm-control physics, and gym-aloha's task that drives and grades it."""
    try:
        mujoco = _module("dm_control.mujoco")
        constants = _module("gym_aloha.constants")
        sim_end_effector = _module("gym_aloha.tasks.sim_end_effector")
    except ModuleNotFoundError:
        raise
    except Exception as exc:  # MuJoCo loads the GL library MUJOCO_GL names as it is imported
        if os.environ.get("MUJOCO_GL") is None:
            raise
        raise RuntimeError(f"{render_hint()} ({type(exc).__name__}: {exc})") from exc
    physics = mujoco.Physics.from_xml_path(str(constants.ASSETS_DIR / scene))
    _stiffen_gripper_welds(physics.model.ptr)
    tasks = {
        "transfer_cube": sim_end_effector.TransferCubeEndEffectorTask,
        "insertion": sim_end_effector.InsertionEndEffectorTask,
    }
    return physics, tasks[task]()


def _module(name: str) -> Any:
    """A module of the sim's own environment (gym-aloha, dm-control), which the agent's lacks."""
    return importlib.import_module(name)


def _stiffen_gripper_welds(model: Any) -> None:
    """Give the welds that tie each gripper to its mocap body MuJoCo's default stiffness.

    The scenes' soft welds (``solimp .25 .25 0.001``) let the grippers lag their targets by
    centimetres under MuJoCo 3.8, so they knock the cube away (the expert solved 1 of 10 seeds).
    The welds keep the bodies' relative pose at ``qpos0`` (each gripper link sits about 66 mm in x and
    118 mm in z from its mocap body); the experts' waypoints are mocap poses measured against that.
    """
    for weld in range(model.neq):
        model.eq_solimp[weld] = WELD_SOLIMP


def _sample_poses(task: str, seed: int) -> list[npt.NDArray[np.float64]]:
    """gym-aloha's placement of the task's objects for ``seed`` (the one its joint-space envs use)."""
    utils = _module("gym_aloha.utils")
    if task == "transfer_cube":
        return [np.asarray(utils.sample_box_pose(seed), dtype=np.float64)]
    peg, socket = utils.sample_insertion_pose(seed)
    return [np.asarray(peg, dtype=np.float64), np.asarray(socket, dtype=np.float64)]


def _offscreen_renderer(physics: Any, camera: str, size: int) -> Any:
    return offscreen_renderer(physics.model.ptr, physics.data.ptr, camera, size, sim="ALOHA")


def make(
    task: str = "transfer_cube",
    camera: str | None = None,
    size: int = 128,
    max_episode_steps: int = MAX_EPISODE_STEPS,
) -> gym.Env[Any, Any]:
    """An ALOHA task under end-effector control (``transfer_cube`` or ``insertion``); ``camera`` adds its frames."""
    return AlohaEndEffectorTask(task, camera=camera, size=size, max_episode_steps=max_episode_steps)
