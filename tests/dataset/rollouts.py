"""Drive a real sim through ``GymBridge`` and feed a sink exactly as the agent loop does.

Per step and running slot: the observation the action was chosen from, the action, then the
reward, done flags and success that came back; ``end`` when the slot is done or errored, or when
``max_steps`` cuts the episode (its last frame is then marked truncated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame
from hud_pipelines.sim.bridge import GymBridge

Policy = Callable[[Mapping[str, npt.NDArray[Any]], int], npt.NDArray[np.float32]]


def random_policy(contract: Contract, seed: int = 0) -> Policy:
    """Uniform actions within the contract's bounds (or [-1, 1]); integer actions rounded."""
    action = contract.action
    low = np.asarray(action.low if action.low is not None else [-1.0] * action.size, dtype=np.float32)
    high = np.asarray(action.high if action.high is not None else [1.0] * action.size, dtype=np.float32)
    rng = np.random.default_rng(seed)
    integer = np.dtype(action.dtype).kind in "iub"

    def act(observation: Mapping[str, npt.NDArray[Any]], num_slots: int) -> npt.NDArray[np.float32]:
        values = rng.uniform(low, high, size=(num_slots, action.size)).astype(np.float32)
        return np.round(values) if integer else values

    return act


def contract_of(factory: str, build_args: Mapping[str, Any] | None = None) -> Contract:
    with GymBridge(factory, 1, build_args=build_args) as bridge:
        return bridge.contract


def rollout(
    sink: EpisodeSink,
    factory: str,
    *,
    num_envs: int,
    rounds: int,
    max_steps: int,
    build_args: Mapping[str, Any] | None = None,
    job: str = "test",
    instance: int = 0,
    seed: int = 0,
    policy: Policy | None = None,
) -> tuple[Contract, list[EpisodeOutcome]]:
    outcomes: list[EpisodeOutcome] = []
    with GymBridge(factory, num_envs, build_args=build_args) as bridge:
        contract = bridge.contract
        act = policy or random_policy(contract, seed)
        for round_index in range(rounds):
            tasks = [{"seed": seed + round_index * num_envs + slot} for slot in range(num_envs)]
            obs = bridge.reset(tasks)
            keys = [EpisodeKey(job, 0, instance, slot, round_index, tasks[slot]["seed"]) for slot in range(num_envs)]
            prompts = obs.prompt or [""] * num_envs
            for slot, key in enumerate(keys):
                sink.begin(key, prompts[slot])
            running = [status == "running" for status in obs.status]
            totals = [0.0] * num_envs
            steps = [0] * num_envs
            for step in range(max_steps):
                if not any(running):
                    break
                action = act(obs.observation, num_envs)
                nxt = bridge.step(action)
                for slot in range(num_envs):
                    if not running[slot]:
                        continue
                    last = step == max_steps - 1
                    frame = Frame(
                        index=steps[slot],
                        observation={k: v[slot] for k, v in obs.observation.items()},
                        action=action[slot],
                        reward=float(nxt.reward[slot]),
                        terminated=bool(nxt.terminated[slot]),
                        truncated=bool(nxt.truncated[slot]) or last,
                        success=bool(nxt.success[slot]),
                    )
                    if nxt.status[slot] != "errored":
                        sink.add(keys[slot], frame)
                        totals[slot] += frame.reward
                        steps[slot] += 1
                    if nxt.status[slot] != "running" or last:
                        status = (
                            EpisodeStatus.ERRORED
                            if nxt.status[slot] == "errored"
                            else EpisodeStatus.SUCCEEDED
                            if frame.success
                            else EpisodeStatus.FAILED
                        )
                        outcome = EpisodeOutcome(
                            status=status,
                            score=float(frame.success),
                            success=frame.success,
                            total_reward=totals[slot],
                            steps=steps[slot],
                            terminated=frame.terminated,
                            truncated=frame.truncated,
                        )
                        sink.end(keys[slot], outcome)
                        outcomes.append(outcome)
                        running[slot] = False
                obs = nxt
    return contract, outcomes
