"""``wrap(env)``: a user who owns the loop gets the same episode records as the managed agent loop.

The wrapper derives the contract the way the sim bridge does (from the env's spaces and the first
observation, resolved against ``contract_path`` when given) and reports every episode to the sinks
(a :class:`~hud_pipelines.recording.traces.TraceRecorder` under ``trace_dir``, plus any sinks
passed in): the same keys, frames and grades the agent loop produces for the same seeds and
actions. Nothing else in the user's code changes::

    env = hud_pipelines.wrap(gym.make("CartPole-v1"), job="mine", trace_dir=Path("traces"))
    obs, info = env.reset(seed=0)
    ...

A vector env is wrapped the same way: one trace per sub-env per episode. Gymnasium's autoreset
modes are followed: with ``NEXT_STEP`` the step that resets a finished sub-env records nothing;
with ``SAME_STEP`` the next episode starts from the observation that step returns; with
``DISABLED`` a ``reset(options={"reset_mask": ...})`` restarts the masked sub-envs.

Grades follow the bridge (:mod:`.episodes` keeps each slot's record): success is sticky once the
env reports it, the score is success when the env reports a success signal, else the episode
return. An episode cut short by ``reset`` or ``close`` ends as failed with ``truncated=True``.

A wrapper writing anything (traces, a dataset, sinks of the caller's) is finalized at interpreter exit if it
was never closed: the finalizer is registered when the wrapper is created, and runs on the normal way out of
the program (the end of the script, ``sys.exit``, an uncaught exception) like ``close()`` does: open episodes
end cut short (their traces get their grade line), the sinks close, the dataset is published. A wrapper
writing no dataset is held weakly meanwhile: dropped unclosed, it is let go (its open trace file closes as
any dropped file does, with Python's ``ResourceWarning``). Only the process that made it runs it. It runs
before Python joins the remaining threads (``threading``'s own exit hooks), while the dataset writers
still take work; publishing then starts no thread (Python refuses new threads at exit): a ``wrap()``
dataset is one part, which is checked from its files and laid out by task and seed with pyarrow (no Python
thread; ``test_an_unclosed_wrap_dataset_is_published_at_exit``). The env itself is not
closed. Nothing runs on ``os._exit``, SIGKILL or an unhandled SIGTERM: then the finalized parts of the
episodes already written stay in the dataset's staging directory (``.<name>.staging-*``), unpublished.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np

from hud_pipelines.contract import Contract, flatten_observation, to_numpy
from hud_pipelines.contract.observations import observation_row
from hud_pipelines.recording.episodes import CUT_SHORT, Episodes, WrapOptions
from hud_pipelines.recording.events import EpisodeSink
from hud_pipelines.sim.step_values import reward_of, success_of, vector_success

__all__ = ["CUT_SHORT", "RecordEpisodes", "RecordVectorEpisodes", "wrap"]


def wrap(
    env: Any,
    *,
    job: str = "wrap",
    sinks: Sequence[EpisodeSink] | None = None,
    trace_dir: Path | None = None,
    prompt: str | None = None,
    contract_path: Path | None = None,
    task: int = 0,
    instance: int = 0,
    video: bool = False,
    dataset: Path | None = None,
    dataset_repo_id: str | None = None,
) -> Any:
    """Wrap a gymnasium env or vector env so every episode is reported to ``sinks`` (and traced).

    With ``dataset``, the episodes are also written as a LeRobot v3 dataset, exactly as an eval's
    dataset asset writes them, and published there (atomically) when the wrapper is closed, or
    when the program exits without closing it, as traces and sinks are closed then (see the module docstring).
    The wrapper owns the sinks: closing it ends open episodes and closes them.
    """
    options = WrapOptions(
        job=job,
        sinks=list(sinks or ()),
        trace_dir=trace_dir,
        prompt=prompt,
        contract_path=contract_path,
        task=task,
        instance=instance,
        video=video,
        dataset=dataset,
        dataset_repo_id=dataset_repo_id,
    )
    if _is_vector_env(env):
        wrapper: RecordEpisodes | RecordVectorEpisodes = RecordVectorEpisodes(env, options)
    else:
        wrapper = RecordEpisodes(env, options)
    if dataset is not None or trace_dir is not None or sinks:  # what it writes ends whole, even unclosed
        wrapper.episodes.close_at_exit()
    return wrapper


def _is_vector_env(env: object) -> TypeGuard[gym.vector.VectorEnv[Any, Any, Any]]:
    """A gymnasium vector env: one episode stream per sub-env."""
    return isinstance(env, gym.vector.VectorEnv)


class RecordEpisodes(gym.Wrapper[Any, Any, Any, Any]):
    """Single-env wrapper (see :func:`wrap`)."""

    def __init__(self, env: gym.Env[Any, Any], options: WrapOptions) -> None:
        super().__init__(env)
        self.episodes = Episodes(options, 1)

    @property
    def contract(self) -> Contract | None:
        return self.episodes.contract

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self.episodes.ensure_contract(self.env, self.env.observation_space, self.env.action_space, observation)
        self.episodes.begin(0, seed, self.episodes.observation(flatten_observation(observation), None))
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        episodes = self.episodes
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
            if episodes.is_open(0):
                episodes.step(
                    0,
                    action,
                    episodes.observation(flatten_observation(observation), None),
                    reward_of(reward),
                    bool(terminated),
                    bool(truncated),
                    success_of(info),
                )
        except Exception as exc:  # the episode errored: recorded so, then the loop hears it
            episodes.fail(0, exc)
            raise
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        self.episodes.close()
        super().close()


class RecordVectorEpisodes(gym.vector.VectorWrapper):
    """Vector-env wrapper: one episode stream per sub-env (see :func:`wrap`)."""

    def __init__(self, env: gym.vector.VectorEnv[Any, Any, Any], options: WrapOptions) -> None:
        super().__init__(env)
        self.episodes = Episodes(options, int(env.num_envs))
        metadata: Mapping[str, Any] = getattr(env, "metadata", None) or {}
        mode: Any = metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self.autoreset = gym.vector.AutoresetMode(mode)
        self._pending_reset = np.zeros(self.episodes.num_slots, dtype=np.bool_)

    @property
    def contract(self) -> Contract | None:
        return self.episodes.contract

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        # gymnasium types a vector reset's seed as one int; its vector envs take a list of seeds too
        reset: Callable[..., tuple[Any, dict[str, Any]]] = self.env.reset
        episodes = self.episodes
        mask = np.ones(episodes.num_slots, dtype=np.bool_)
        if options and "reset_mask" in options:  # read first: gymnasium's vector envs pop it from the options
            mask = np.asarray(options["reset_mask"], dtype=np.bool_)
        observation, info = reset(seed=seed, options=options)
        flat = flatten_observation(observation)
        episodes.ensure_contract(
            self.env, self.env.single_observation_space, self.env.single_action_space, observation_row(observation, 0)
        )
        seeds = _seeds(seed, episodes.num_slots)
        restarted: list[int] = np.flatnonzero(mask).tolist()
        for slot in restarted:
            episodes.begin(slot, seeds[slot], episodes.observation(flat, slot))
        self._pending_reset[mask] = False
        return observation, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        episodes = self.episodes
        try:
            return self._step(actions)
        except Exception as exc:  # a vector env's step raised for all of its sub-envs: each open episode errored
            for slot in range(episodes.num_slots):
                episodes.fail(slot, exc)
            raise

    def _step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(actions)
        episodes = self.episodes
        flat = flatten_observation(observation)
        rewards = to_numpy(reward).reshape(-1)
        terms = to_numpy(terminated).reshape(-1)
        truncs = to_numpy(truncated).reshape(-1)
        success = vector_success(info, episodes.num_slots)
        action_rows = to_numpy(actions).reshape(episodes.num_slots, -1)
        for slot in range(episodes.num_slots):
            if self._pending_reset[slot]:  # NEXT_STEP: this step reset the sub-env, its action was ignored
                self._pending_reset[slot] = False
                episodes.begin(slot, None, episodes.observation(flat, slot))
                continue
            done = bool(terms[slot]) or bool(truncs[slot])
            if episodes.is_open(slot):  # one that errored (a non-finite value) waits for its sub-env's end
                next_observation = episodes.observation(flat, slot)
                if done and self.autoreset is gym.vector.AutoresetMode.SAME_STEP:
                    final = info.get("final_obs")
                    if final is not None:
                        next_observation = episodes.observation(flatten_observation(final[slot]), None)
                episodes.step(
                    slot,
                    action_rows[slot],
                    next_observation,
                    float(rewards[slot]),
                    bool(terms[slot]),
                    bool(truncs[slot]),
                    int(success[slot]),
                )
            if done and self.autoreset is gym.vector.AutoresetMode.NEXT_STEP:
                self._pending_reset[slot] = True
            elif done and self.autoreset is gym.vector.AutoresetMode.SAME_STEP:
                episodes.begin(slot, None, episodes.observation(flat, slot))
        return observation, reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        self.episodes.close()
        super().close(**kwargs)


def _seeds(seed: int | list[int | None] | None, num_slots: int) -> list[int | None]:
    """Per-sub-env seeds the way gymnasium's vector envs spread them."""
    if seed is None:
        return [None] * num_slots
    if isinstance(seed, int):
        return [seed + i for i in range(num_slots)]
    return list(seed)
