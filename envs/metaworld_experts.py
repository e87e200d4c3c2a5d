"""MetaWorld's scripted experts, batched and in numpy only, for the agent's process.

The sim runs MetaWorld under its own environment (``sims/metaworld``); the agent's environment has
no MetaWorld, so its experts (``metaworld.policies.Sawyer*V3Policy``, MIT-licensed) are restated
here from their source, rule for rule: each reads MetaWorld's flat observation (feature ``state``,
``[B, 39]``: hand xyz, gripper opening, puck xyz and quaternion, ..., goal xyz as the last three) and
returns ``[B, 4]`` actions (an xyz move, then the grab effort). ``tests/eval/test_metaworld.py``
checks them against MetaWorld's own policies on the same observations. The moves are not clipped,
as MetaWorld's are not: the sim's bounds (``[-1, 1]``) clip them::

    policy: {kind: scripted, target: envs.metaworld_experts:MetaWorldExpert, args: {task: push-v3}}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

STATE = "state"
OBSERVATION_SIZE = 39
Array = npt.NDArray[np.float64]
PUCK_OFFSET = np.array([-0.005, 0.0, 0.0])
"""The experts aim a little behind the puck's centre."""


def _parts(state: Array) -> tuple[Array, Array, Array, Array]:
    """Hand position, gripper opening, puck (object) position and goal of each row."""
    return state[:, :3], state[:, 3], state[:, 4:7], state[:, -3:]


def _lift(points: Array, height: float) -> Array:
    return points + np.array([0.0, 0.0, height])


def _actions(move: Array, grab: Array) -> npt.NDArray[np.float32]:
    return np.concatenate([move, grab[:, None]], axis=1).astype(np.float32)


def reach(state: Array) -> npt.NDArray[np.float32]:
    """``SawyerReachV3Policy``: move to the goal, gripper open."""
    hand, _, _, goal = _parts(state)
    return _actions(5.0 * (goal - hand), np.zeros(len(state)))


def push(state: Array) -> npt.NDArray[np.float32]:
    """``SawyerPushV3Policy``: above the puck, down onto it, then to the goal; grip once at the puck."""
    hand, _, puck, goal = _parts(state)
    aim = puck + PUCK_OFFSET
    away_in_xy = np.linalg.norm(hand[:, :2] - aim[:, :2], axis=1) > 0.02
    above = np.abs(hand[:, 2] - aim[:, 2]) > 0.04
    target = np.where(away_in_xy[:, None], _lift(aim, 0.2), np.where(above[:, None], _lift(aim, 0.03), goal))
    at_puck = (np.linalg.norm(hand[:, :2] - puck[:, :2], axis=1) <= 0.02) & (np.abs(hand[:, 2] - puck[:, 2]) <= 0.10)
    return _actions(10.0 * (target - hand), np.where(at_puck, 0.6, 0.0))


def pick_place(state: Array) -> npt.NDArray[np.float32]:
    """``SawyerPickPlaceV3Policy``: above the puck, down, close the gripper and wait for it, then to the goal."""
    hand, gripper, puck, goal = _parts(state)
    aim = puck + PUCK_OFFSET
    away_in_xy = np.linalg.norm(hand[:, :2] - aim[:, :2], axis=1) > 0.02
    above = (np.abs(hand[:, 2] - aim[:, 2]) > 0.05) & (aim[:, 2] < 0.04)
    gripper_open = gripper > 0.73
    target = np.where(
        away_in_xy[:, None],
        _lift(aim, 0.1),
        np.where(above[:, None], _lift(aim, 0.03), np.where(gripper_open[:, None], hand, goal)),
    )
    near = np.linalg.norm(hand - puck, axis=1) < 0.07
    return _actions(10.0 * (target - hand), np.where(near, 1.0, 0.0))


EXPERTS: dict[str, Callable[[Array], npt.NDArray[np.float32]]] = {
    "reach-v3": reach,
    "push-v3": push,
    "pick-place-v3": pick_place,
}


class MetaWorldExpert:
    """The scripted expert of one MetaWorld task, as a batched observation function."""

    def __init__(self, task: str = "push-v3", key: str = STATE) -> None:
        if task not in EXPERTS:
            raise ValueError(f"no MetaWorld expert for task {task!r}; expected one of: {', '.join(EXPERTS)}")
        self.task = task
        self.key = key
        self._expert = EXPERTS[task]

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        if self.key not in observation:
            raise KeyError(
                f"the MetaWorld expert reads feature {self.key!r}; the observation has {sorted(observation)}"
            )
        state = np.asarray(observation[self.key], dtype=np.float64)
        if state.ndim != 2 or state.shape[1] != OBSERVATION_SIZE:
            raise ValueError(
                f"feature {self.key!r} must be MetaWorld's flat observation [B, {OBSERVATION_SIZE}], got {state.shape}"
            )
        return self._expert(state)
