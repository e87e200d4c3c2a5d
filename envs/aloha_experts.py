"""Scripted end-effector experts for the ALOHA sims (:mod:`envs.aloha_tasks`), batched and in numpy only.

The structure is ACT's scripted policies (``PickAndTransferPolicy``, ``InsertionPolicy``, MIT-licensed,
not shipped by gym-aloha): at an episode's first step each arm gets a list of waypoints (a time step,
an end-effector position and quaternion, a gripper opening) computed from the initial mocap poses
and object poses of the reset observation (features ``mocap_pose`` and ``env_state``), and every
step then executes the pose linearly interpolated in time between the two waypoints around it, open
loop. The sim turns that pose into joint motion through MuJoCo's mocap weld (its end-effector
variant of gym-aloha's scenes), so no inverse kinematics happens here. After the last waypoint the
arms hold it.

Measured through ``pipelines/aloha_transfer_cube.yaml`` (seeds 0-99): the transfer-cube expert
succeeds in 100 of 100 episodes (95% CI 96.3-100%), each ending at the handover, ~210 steps in.
Through ``pipelines/aloha_insertion.yaml`` (seeds 0-99) the insertion expert succeeds in 100 of 100
(95% CI 96.3-100%), each ending as the peg touches the pin, ~336 steps in; with ACT's own peg lift it
solved 16 of seeds 0-39, the others jamming the peg against the socket's floor (see :data:`PEG_LIFT`).

Episodes are told apart by the ids the agent passes (``PolicyBatch.episodes``): each row of a call
is one step of its episode, so a slot's waypoints are planned the first time its episode is seen and
its clock advances by one per call::

    policy: {kind: scripted, target: envs.aloha_experts:AlohaExpert, args: {task: transfer_cube}}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hud_pipelines.agent.policy import Actions, PolicyBatch

ENV_STATE = "env_state"
MOCAP_POSE = "mocap_pose"
Array = npt.NDArray[np.float64]
ACTION_SIZE = 16
IDENTITY = np.array([1.0, 0.0, 0.0, 0.0])
Y_AXIS = np.array([0.0, 1.0, 0.0])
X_AXIS = np.array([1.0, 0.0, 0.0])
CLOSED, OPEN = 0.0, 1.0
PEG_LIFT = 0.0175
"""How much higher than the socket's gripper the peg's meets it (ACT: 7.15 mm), so that their axes line up.

Both grippers grasp 3 cm below the objects' sampled height (``z = 0.05``), but the objects fall to the
table first: the peg's centre comes to rest at 1.0 cm, the socket's at 2.2 cm (its 4 mm floor lies
2 cm below its centre), and in transport the peg hangs a few millimetres lower in its grip still
(measured 126-131 mm below its gripper link, the socket 113-116 mm). With ACT's 7.15 mm the peg met
the socket 6-12 mm low and jammed against its floor (stage 3) in 24 of seeds 0-39. Lifts of 16, 17.5
and 19 mm each solved seeds 0-99 (13 and 22 mm lost 2 and 1, 25 mm 35): this one is the window's middle.
"""


def axis_angle(axis: Array, degrees: float) -> Array:
    """The unit quaternion ``(w, x, y, z)`` of a rotation by ``degrees`` about ``axis``."""
    half = np.deg2rad(degrees) / 2
    return np.concatenate([[np.cos(half)], np.sin(half) * axis / np.linalg.norm(axis)])


def multiply(left: Array, right: Array) -> Array:
    """Hamilton products ``left * right`` of quaternions ``[..., 4]`` (``w`` first), broadcast."""
    w1, x1, y1, z1 = np.moveaxis(left, -1, 0)
    w2, x2, y2, z2 = np.moveaxis(right, -1, 0)
    return np.stack(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ],
        axis=-1,
    )


def shifted(points: Array, dx: float, dy: float, dz: float) -> Array:
    """``points`` (``[3]`` or ``[B, 3]``) moved by ``(dx, dy, dz)`` metres."""
    return points + np.array([dx, dy, dz])


@dataclass(frozen=True)
class Waypoints:
    """One arm's plan for ``B`` episodes: time steps ``[K]`` (increasing) and poses ``[B, K, 8]``.

    A pose is xyz, quaternion ``(w, x, y, z)`` and gripper opening: the arm's slice of the action.
    """

    times: npt.NDArray[np.int64]
    poses: Array

    def at(self, steps: npt.NDArray[np.int64]) -> Array:
        """Each row's pose at its own step ``[B]``: linear in time between waypoints, the last one held."""
        last = len(self.times) - 1
        after = np.clip(np.searchsorted(self.times, steps, side="right"), 1, last)
        start, end = self.times[after - 1], self.times[after]
        fraction = np.clip((steps - start) / (end - start), 0.0, 1.0)[:, None]
        rows = np.arange(len(steps))
        before_pose, after_pose = self.poses[rows, after - 1], self.poses[rows, after]
        return before_pose + (after_pose - before_pose) * fraction

    def rows(self) -> list[Array]:
        """Each episode's poses ``[K, 8]``."""
        return list(self.poses)

    def stacked(self, poses: list[Array]) -> Waypoints:
        """These times with other episodes' poses (each ``[K, 8]``)."""
        return Waypoints(self.times, np.stack(poses))


def waypoints(plan: list[tuple[int, Array, Array, float]], rows: int) -> Waypoints:
    """Stack ``(time, xyz [B, 3] or [3], quaternion [B, 4] or [4], gripper)`` waypoints into :class:`Waypoints`."""
    times = np.asarray([time for time, *_ in plan], dtype=np.int64)
    poses = [
        np.concatenate(
            [np.broadcast_to(xyz, (rows, 3)), np.broadcast_to(quat, (rows, 4)), np.full((rows, 1), grip)], axis=1
        )
        for _, xyz, quat, grip in plan
    ]
    return Waypoints(times, np.stack(poses, axis=1))


def transfer_cube(env_state: Array, mocap_pose: Array) -> tuple[Waypoints, Waypoints]:
    """``PickAndTransferPolicy``: the right arm picks the cube and lifts it to the meeting point, the left takes it.

    The right gripper pitches 60 degrees down from its initial orientation to grasp the cube from
    above; the left meets it rolled 90 degrees, closes on the cube as the right opens, and pulls away.
    """
    rows = len(env_state)
    cube = env_state[:, :3]
    left_xyz, left_quat = mocap_pose[:, 0:3], mocap_pose[:, 3:7]
    right_xyz, right_quat = mocap_pose[:, 7:10], mocap_pose[:, 10:14]
    pick = multiply(right_quat, axis_angle(Y_AXIS, -60.0))
    meet_left = axis_angle(X_AXIS, 90.0)
    meet = np.array([0.0, 0.5, 0.25])
    left = [
        (0, left_xyz, left_quat, CLOSED),  # wait
        (100, shifted(meet, -0.1, 0, -0.02), meet_left, OPEN),  # approach the meeting point
        (260, shifted(meet, 0.02, 0, -0.02), meet_left, OPEN),  # move to the meeting point
        (310, shifted(meet, 0.02, 0, -0.02), meet_left, CLOSED),  # close on the cube
        (360, shifted(meet, -0.1, 0, -0.02), IDENTITY, CLOSED),  # pull it away to the left
        (400, shifted(meet, -0.1, 0, -0.02), IDENTITY, CLOSED),  # stay
    ]
    right = [
        (0, right_xyz, right_quat, CLOSED),  # wait
        (90, shifted(cube, 0, 0, 0.08), pick, OPEN),  # above the cube
        (130, shifted(cube, 0, 0, -0.015), pick, OPEN),  # down around it
        (170, shifted(cube, 0, 0, -0.015), pick, CLOSED),  # grasp
        (200, shifted(meet, 0.05, 0, 0), pick, CLOSED),  # lift towards the meeting point
        (220, meet, pick, CLOSED),  # at the meeting point
        (310, meet, pick, OPEN),  # let go as the left arm holds it
        (360, shifted(meet, 0.1, 0, 0), pick, OPEN),  # move away to the right
        (400, shifted(meet, 0.1, 0, 0), pick, OPEN),  # stay
    ]
    return waypoints(left, rows), waypoints(right, rows)


def insertion(env_state: Array, mocap_pose: Array) -> tuple[Waypoints, Waypoints]:
    """``InsertionPolicy``: the left arm picks the socket, the right the peg, and they meet peg into socket.

    ACT's waypoints, but for the peg's lift at the meeting point (:data:`PEG_LIFT`).
    """
    rows = len(env_state)
    peg, socket = env_state[:, 0:3], env_state[:, 7:10]
    left_xyz, left_quat = mocap_pose[:, 0:3], mocap_pose[:, 3:7]
    right_xyz, right_quat = mocap_pose[:, 7:10], mocap_pose[:, 10:14]
    # both picks turn ACT's initial right-arm orientation (the identity in gym-aloha's scenes)
    pick_right = multiply(right_quat, axis_angle(Y_AXIS, -60.0))
    pick_left = multiply(right_quat, axis_angle(Y_AXIS, 60.0))
    meet = np.array([0.0, 0.5, 0.15])
    lift_right = PEG_LIFT
    left = [
        (0, left_xyz, left_quat, CLOSED),  # wait
        (120, shifted(socket, 0, 0, 0.08), pick_left, OPEN),  # above the socket
        (170, shifted(socket, 0, 0, -0.03), pick_left, OPEN),  # down around it
        (220, shifted(socket, 0, 0, -0.03), pick_left, CLOSED),  # grasp
        (285, shifted(meet, -0.1, 0, 0), pick_left, CLOSED),  # towards the meeting point
        (340, shifted(meet, -0.05, 0, 0), pick_left, CLOSED),  # insert
        (400, shifted(meet, -0.05, 0, 0), pick_left, CLOSED),  # hold
    ]
    right = [
        (0, right_xyz, right_quat, CLOSED),  # wait
        (120, shifted(peg, 0, 0, 0.08), pick_right, OPEN),  # above the peg
        (170, shifted(peg, 0, 0, -0.03), pick_right, OPEN),  # down around it
        (220, shifted(peg, 0, 0, -0.03), pick_right, CLOSED),  # grasp
        (285, shifted(meet, 0.1, 0, lift_right), pick_right, CLOSED),  # towards the meeting point
        (340, shifted(meet, 0.05, 0, lift_right), pick_right, CLOSED),  # insert
        (400, shifted(meet, 0.05, 0, lift_right), pick_right, CLOSED),  # hold
    ]
    return waypoints(left, rows), waypoints(right, rows)


PLANS: dict[str, tuple[int, Callable[[Array, Array], tuple[Waypoints, Waypoints]]]] = {
    "transfer_cube": (7, transfer_cube),
    "insertion": (14, insertion),
}
"""Per task: the size of ``env_state`` it reads, and its planner."""


@dataclass
class _Episode:
    """One episode's plan (each arm's poses ``[K, 8]``) and how many steps it has executed."""

    left: Array
    right: Array
    step: int = 0


class AlohaExpert:
    """The scripted expert of one ALOHA task, a policy keyed on the agent's episode ids (see the module docstring)."""

    def __init__(self, task: str = "transfer_cube") -> None:
        if task not in PLANS:
            raise ValueError(f"no ALOHA expert for task {task!r}; expected one of: {', '.join(PLANS)}")
        self.task = task
        self._state_size, self._plan = PLANS[task]
        self._episodes: dict[str, _Episode] = {}
        self._times: tuple[Waypoints, Waypoints] | None = None
        """An empty plan of each arm: the waypoint times every episode shares."""

    def reset(self) -> None:
        self._episodes.clear()

    def infer(self, batch: PolicyBatch) -> Actions:
        if batch.episodes is None:
            raise ValueError(
                "the ALOHA expert keeps a plan per episode: it needs the agent's episode ids (batch.episodes)"
            )
        new = [row for row, episode in enumerate(batch.episodes) if episode not in self._episodes]
        if new:
            self._start(batch, new)
        assert self._times is not None
        episodes = [self._episodes[episode] for episode in batch.episodes]
        steps = np.asarray([episode.step for episode in episodes], dtype=np.int64)
        left_times, right_times = self._times
        left = left_times.stacked([episode.left for episode in episodes]).at(steps)
        right = right_times.stacked([episode.right for episode in episodes]).at(steps)
        for episode in episodes:
            episode.step += 1
        return np.concatenate([left, right], axis=1).astype(np.float32)[:, None, :]

    def _start(self, batch: PolicyBatch, rows: list[int]) -> None:
        """Plan the episodes of ``rows`` from their (first) observation."""
        env_state = self._feature(batch, ENV_STATE, self._state_size)[rows]
        mocap_pose = self._feature(batch, MOCAP_POSE, 14)[rows]
        left, right = self._plan(env_state, mocap_pose)
        self._times = (left, right)
        assert batch.episodes is not None
        for row, left_poses, right_poses in zip(rows, left.rows(), right.rows(), strict=True):
            self._episodes[batch.episodes[row]] = _Episode(left_poses, right_poses)

    def _feature(self, batch: PolicyBatch, name: str, size: int) -> Array:
        if name not in batch.observation:
            raise KeyError(f"the ALOHA expert reads feature {name!r}; the observation has {sorted(batch.observation)}")
        values = np.asarray(batch.observation[name], dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != size:
            raise ValueError(f"feature {name!r} must be [B, {size}] for task {self.task!r}, got {list(values.shape)}")
        return values
