"""Helpers of the agent tests: a scripted in-process sim and a recording sink.

The fake sim stands beside the real ones (GymBridge over gymnasium, served PushT) to make the loop's
rules checkable step by step: slot ``i`` ends after ``lengths[i]`` steps and observes
``[slot, step]``, so every assertion can name the slot and the tick it is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract, Feature
from hud_pipelines.errors import SimCrashedError
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, Frame, Inference, PerSlotSink
from hud_pipelines.wire.messages import Observation, SlotError


def countdown_contract() -> Contract:
    return Contract(
        control_rate=10.0,
        robot_type="countdown",
        features={
            "state": Feature(role="observation", dtype="float32", shape=(2,), names=["slot", "step"]),
            "action": Feature(role="action", dtype="float32", shape=(1,), names=["push"], low=[-1e6], high=[1e6]),
        },
    )


class CountdownSim:
    """Slot ``i`` terminates after ``lengths[i]`` steps (succeeding when listed in ``succeed``).

    ``crash_at`` raises a :class:`SimCrashedError` on that tick; ``slot_errors`` maps a tick to the
    slots the sim reports as errored on it. Every action frame received is kept in ``actions``.
    """

    def __init__(
        self,
        lengths: list[int],
        *,
        succeed: tuple[int, ...] = (),
        reports: tuple[int, ...] | None = None,
        crash_at: int | None = None,
        slot_errors: dict[int, list[int]] | None = None,
    ) -> None:
        self.lengths = lengths
        self.num_envs = len(lengths)
        self.contract = countdown_contract()
        self.succeed = succeed
        self.reports = succeed if reports is None else reports
        """Slots whose env gives a success signal (default: those that succeed)."""
        self.crash_at = crash_at
        self.slot_errors = slot_errors or {}
        self.actions: list[npt.NDArray[Any]] = []
        self.tick = 0
        self.status = ["idle"] * self.num_envs
        self.steps = np.zeros(self.num_envs, dtype=np.int64)

    def reset(self, tasks: list[dict[str, Any]]) -> Observation:
        assert len(tasks) == self.num_envs
        self.tick = 0
        self.steps[:] = 0
        self.status = ["running"] * self.num_envs
        return self._observation(np.zeros(self.num_envs), prompt=[f"count {n}" for n in self.lengths])

    def step(self, action: npt.NDArray[Any]) -> Observation:
        self.tick += 1
        if self.crash_at == self.tick:
            raise SimCrashedError("the sim went away during step (test)")
        self.actions.append(np.array(action, copy=True))
        running = np.array([s == "running" for s in self.status])
        self.steps[running] += 1
        errors = [SlotError(slot=s, message=f"slot {s} broke") for s in self.slot_errors.get(self.tick, [])]
        for error in errors:
            self.status[error.slot] = "errored"
        for slot in np.flatnonzero(running):
            if self.status[slot] == "running" and self.steps[slot] >= self.lengths[slot]:
                self.status[slot] = "done"
        reward = np.where(running, 1.0, 0.0)
        return self._observation(reward, errors=errors)

    def _observation(
        self, reward: npt.NDArray[Any], *, prompt: list[str] | None = None, errors: list[SlotError] | None = None
    ) -> Observation:
        done = np.array([s == "done" for s in self.status])
        state = np.stack([np.arange(self.num_envs), self.steps], axis=1).astype(np.float32)
        return Observation(
            seq=self.tick,
            observation={"state": state},
            reward=reward.astype(np.float64),
            terminated=done,
            truncated=np.zeros(self.num_envs, dtype=np.bool_),
            success=done & np.isin(np.arange(self.num_envs), self.succeed),
            success_reported=np.isin(np.arange(self.num_envs), self.reports),
            success_now=done & np.isin(np.arange(self.num_envs), self.succeed),
            status=list(self.status),
            prompt=prompt,
            errors=errors or [],
        )


@dataclass
class RecordingSink(PerSlotSink):
    """Keeps everything an EpisodeSink is told, per trace id."""

    begun: dict[str, str] = field(default_factory=dict[str, str])
    keys: dict[str, EpisodeKey] = field(default_factory=dict[str, EpisodeKey])
    frames: dict[str, list[Frame]] = field(default_factory=dict[str, list[Frame]])
    inferences: dict[str, list[Inference]] = field(default_factory=dict[str, list[Inference]])
    ended: dict[str, EpisodeOutcome] = field(default_factory=dict[str, EpisodeOutcome])
    closed: int = 0

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self.begun[key.trace_id] = prompt
        self.keys[key.trace_id] = key
        self.frames[key.trace_id] = []
        self.inferences[key.trace_id] = []

    def add(self, key: EpisodeKey, frame: Frame) -> None:
        assert key.trace_id not in self.ended, "a frame after the episode ended"
        self.frames[key.trace_id].append(frame)

    def inference(self, key: EpisodeKey, record: Inference) -> None:
        assert key.trace_id not in self.ended, "an inference after the episode ended"
        self.inferences[key.trace_id].append(record)

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        assert key.trace_id not in self.ended, "an episode ended twice"
        self.ended[key.trace_id] = outcome

    def close(self) -> None:
        self.closed += 1

    def by_slot(self) -> dict[int, str]:
        return {key.slot: trace_id for trace_id, key in self.keys.items()}


class _NeverSucceeds(gym.Wrapper[Any, Any, Any, Any]):
    """Reports ``is_success: False`` on every step: an env that grades itself, and always fails."""

    def step(self, action: Any) -> Any:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {**info, "is_success": False}


def never_succeeding_cartpole() -> gym.Env[Any, Any]:
    """CartPole-v1 that says every step that the episode has not succeeded (loaded by path in a sim child)."""
    return _NeverSucceeds(gym.make("CartPole-v1"))


class ResetCounter:
    """A scripted CartPole controller that counts the resets every instance of it gets."""

    resets: ClassVar[list[int]] = []

    def __init__(self) -> None:
        ResetCounter.resets.append(0)
        self.index = len(ResetCounter.resets) - 1

    def reset(self) -> None:
        ResetCounter.resets[self.index] += 1

    def __call__(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        return np.zeros((len(observation["state"]), 1), dtype=np.float32)
