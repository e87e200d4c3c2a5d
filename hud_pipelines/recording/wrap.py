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

Grades follow the bridge: success is sticky once the env reports it, the score is success when the
env reports a success signal, else the episode return. An episode cut short by ``reset`` or
``close`` ends as failed with ``truncated=True``.

A wrapper writing a dataset is finalized at interpreter exit if it was never closed: the finalizer
is registered when the wrapper is created, and runs on the normal way out of the program (the end
of the script, ``sys.exit``, an uncaught exception) like ``close()`` does: open episodes end cut
short, the sinks close, the dataset is published. It runs before Python joins the remaining
threads (``threading``'s own exit hooks), while the dataset writers still take work; publishing
then starts no thread (Python refuses new threads at exit): a ``wrap()`` dataset is one part, which
is checked from its files and renamed into place. The env itself is not closed. Nothing runs on
``os._exit``, SIGKILL or an unhandled SIGTERM: then the finalized parts of the episodes already
written stay in the dataset's staging directory (``.<name>.staging-*``), unpublished.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import (
    Contract,
    control_rate_of,
    derive_contract,
    flatten_observation,
    resolve_contract,
    to_numpy,
)
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame
from hud_pipelines.sim.envs import prompt_of, success_of, vector_success

if TYPE_CHECKING:
    from hud_pipelines.dataset.publish import DatasetBuild

logger = logging.getLogger(__name__)

CUT_SHORT = "the episode was cut short by reset() or close()"
_REGISTER_EXIT_HOOKS_ON_IMPORT = ("concurrent.futures.thread", "concurrent.futures.process")


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
    when the program exits without closing it (see the module docstring for what that covers).
    The wrapper owns the sinks: closing it ends open episodes and closes them.
    """
    options = _Options(job, list(sinks or ()), trace_dir, prompt, contract_path, task, instance, video)
    options.dataset = dataset
    options.dataset_repo_id = dataset_repo_id
    if isinstance(env, gym.vector.VectorEnv):
        wrapper: RecordEpisodes | RecordVectorEpisodes = RecordVectorEpisodes(
            cast(gym.vector.VectorEnv[Any, Any, Any], env), options
        )
    else:
        wrapper = RecordEpisodes(env, options)
    if dataset is not None:
        wrapper.episodes.close_at_exit()
    return wrapper


class _Options:
    def __init__(
        self,
        job: str,
        sinks: list[EpisodeSink],
        trace_dir: Path | None,
        prompt: str | None,
        contract_path: Path | None,
        task: int,
        instance: int,
        video: bool,
    ) -> None:
        self.job = job
        self.sinks = sinks
        self.trace_dir = trace_dir
        self.prompt = prompt
        self.contract_path = contract_path
        self.task = task
        self.instance = instance
        self.video = video
        self.dataset: Path | None = None
        self.dataset_repo_id: str | None = None


class _Episodes:
    """Per-slot episode bookkeeping shared by the single-env and vector-env wrappers."""

    def __init__(self, options: _Options, num_slots: int) -> None:
        self.options = options
        self.sinks: list[EpisodeSink] = list(options.sinks)
        self.num_slots = num_slots
        self.contract: Contract | None = None
        self.names: dict[str, str] = {}
        self.prompt = ""
        self.open = [False] * num_slots
        self.episode = [-1] * num_slots
        self.keys: list[EpisodeKey | None] = [None] * num_slots
        self.steps = [0] * num_slots
        self.total = [0.0] * num_slots
        self.success = [False] * num_slots
        self.reported = [False] * num_slots
        self.last: list[dict[str, npt.NDArray[Any]]] = [{} for _ in range(num_slots)]
        self.dataset: DatasetBuild | None = None
        self._at_exit: _CloseAtExit | None = None

    def close_at_exit(self) -> None:
        """Close (and publish) at interpreter exit unless :meth:`close` ran first.

        Registered now, not at exit: by then Python refuses new exit hooks, and a module that
        registers one on import (``concurrent.futures``, which lerobot imports in the writer
        thread) fails to import. So those modules are imported here too.
        """
        for module in _REGISTER_EXIT_HOOKS_ON_IMPORT:
            importlib.import_module(module)
        if self._at_exit is None:
            self._at_exit = _CloseAtExit(self)
            threading._register_atexit(self._at_exit)  # pyright: ignore[reportAttributeAccessIssue, reportPrivateUsage, reportUnknownMemberType]

    def ensure_contract(self, env: Any, observation_space: Any, action_space: Any, sample: object) -> None:
        if self.contract is not None:
            return
        spec = getattr(env, "spec", None)
        metadata: Mapping[str, Any] = getattr(env, "metadata", None) or {}
        robot_type = str(metadata.get("robot_type") or (spec.id if spec is not None else type(env.unwrapped).__name__))
        derived = derive_contract(
            observation_space, action_space, sample, control_rate=control_rate_of(env), robot_type=robot_type
        )
        self.contract = resolve_contract(derived, self.options.contract_path)
        self.names = {name: name or next(iter(derived.observation_features)) for name in flatten_observation(sample)}
        if self.options.trace_dir is not None:
            from hud_pipelines.recording.traces import TraceRecorder

            self.sinks.append(TraceRecorder(self.options.trace_dir, self.contract, video=self.options.video))
        if self.options.dataset is not None:
            from hud_pipelines.dataset.publish import DatasetBuild

            self.dataset = DatasetBuild(self.options.dataset, self.contract, repo_id=self.options.dataset_repo_id)
            self.sinks.append(self.dataset.sink(self.options.job.replace("/", "_") or "wrap"))
        default_prompt = prompt_of(env) or (spec.id if spec is not None else type(env.unwrapped).__name__)
        self.prompt = self.options.prompt if self.options.prompt is not None else default_prompt

    def observation(self, flat: dict[str, npt.NDArray[Any]], slot: int | None) -> dict[str, npt.NDArray[Any]]:
        """One slot's observation in contract keys and dtypes (``slot=None``: an unbatched observation)."""
        assert self.contract is not None
        out: dict[str, npt.NDArray[Any]] = {}
        for name, value in flat.items():
            key = self.names.get(name, name)
            feature = self.contract.features[key]
            row = value if slot is None else value[slot]
            out[key] = np.array(row, dtype=feature.dtype).reshape(feature.shape)
        return out

    def begin(self, slot: int, seed: int | None, observation: dict[str, npt.NDArray[Any]]) -> None:
        if self.open[slot]:
            self.end(slot, terminated=False, truncated=True, reason=CUT_SHORT)
        self.episode[slot] += 1
        o = self.options
        key = EpisodeKey(o.job, o.task, o.instance, slot, self.episode[slot], seed)
        self.keys[slot] = key
        self.open[slot] = True
        self.steps[slot] = 0
        self.total[slot] = 0.0
        self.success[slot] = False
        self.reported[slot] = False
        self.last[slot] = observation
        for sink in self.sinks:
            sink.begin(key, self.prompt)

    def step(
        self,
        slot: int,
        action: object,
        observation: dict[str, npt.NDArray[Any]],
        reward: float,
        terminated: bool,
        truncated: bool,
        success: int,
    ) -> None:
        """Record one step of an open episode; ``success`` is -1 when the env reported none."""
        key = self.keys[slot]
        assert key is not None
        assert self.contract is not None
        if success >= 0:
            self.reported[slot] = True
            self.success[slot] = self.success[slot] or bool(success)
        frame = Frame(
            index=self.steps[slot],
            observation=self.last[slot],
            action=np.asarray(to_numpy(action), dtype=np.float32).reshape(self.contract.action.size),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=self.success[slot],
        )
        for sink in self.sinks:
            sink.add(key, frame)
        self.steps[slot] += 1
        self.total[slot] += reward
        self.last[slot] = observation
        if terminated or truncated:
            self.end(slot, terminated=terminated, truncated=truncated)

    def end(self, slot: int, *, terminated: bool, truncated: bool, reason: str | None = None) -> None:
        key = self.keys[slot]
        if not self.open[slot] or key is None:
            return
        self.open[slot] = False
        success = self.success[slot]
        score = float(success) if self.reported[slot] else self.total[slot]
        outcome = EpisodeOutcome(
            status=EpisodeStatus.SUCCEEDED if success else EpisodeStatus.FAILED,
            score=score,
            success=success,
            total_reward=self.total[slot],
            steps=self.steps[slot],
            terminated=terminated,
            truncated=truncated,
            extra={} if reason is None else {"reason": reason},
        )
        for sink in self.sinks:
            sink.end(key, outcome)

    def close(self) -> None:
        if self._at_exit is not None:
            self._at_exit.episodes = None
            self._at_exit = None
        for slot in range(self.num_slots):
            self.end(slot, terminated=False, truncated=True, reason=CUT_SHORT)
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        if self.dataset is not None:
            build, self.dataset = self.dataset, None
            build.publish()


class _CloseAtExit:
    """An exit hook that closes the episodes of a wrapper nobody closed (and then forgets them)."""

    def __init__(self, episodes: _Episodes) -> None:
        self.episodes: _Episodes | None = episodes

    def __call__(self) -> None:
        episodes, self.episodes = self.episodes, None
        if episodes is None:
            return
        try:
            episodes.close()
        except Exception:
            logger.exception("closing an unclosed wrap() at exit failed; its dataset was not published")


class RecordEpisodes(gym.Wrapper[Any, Any, Any, Any]):
    """Single-env wrapper (see :func:`wrap`)."""

    def __init__(self, env: gym.Env[Any, Any], options: _Options) -> None:
        super().__init__(env)
        self.episodes = _Episodes(options, 1)

    @property
    def contract(self) -> Contract | None:
        return self.episodes.contract

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self.episodes.ensure_contract(self.env, self.env.observation_space, self.env.action_space, observation)
        self.episodes.begin(0, seed, self.episodes.observation(flatten_observation(observation), None))
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        episodes = self.episodes
        if episodes.open[0]:
            episodes.step(
                0,
                action,
                episodes.observation(flatten_observation(observation), None),
                float(to_numpy(reward)),
                bool(terminated),
                bool(truncated),
                success_of(info),
            )
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        self.episodes.close()
        super().close()


class RecordVectorEpisodes(gym.vector.VectorWrapper):
    """Vector-env wrapper: one episode stream per sub-env (see :func:`wrap`)."""

    def __init__(self, env: gym.vector.VectorEnv[Any, Any, Any], options: _Options) -> None:
        super().__init__(env)
        self.episodes = _Episodes(options, int(env.num_envs))
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
        observation, info = cast(Any, self.env).reset(seed=seed, options=options)
        episodes = self.episodes
        flat = flatten_observation(observation)
        episodes.ensure_contract(
            self.env, self.env.single_observation_space, self.env.single_action_space, _row(observation, 0)
        )
        mask = np.ones(episodes.num_slots, dtype=np.bool_)
        if options and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"], dtype=np.bool_)
        seeds = _seeds(seed, episodes.num_slots)
        restarted: list[int] = np.flatnonzero(mask).tolist()
        for slot in restarted:
            episodes.begin(slot, seeds[slot], episodes.observation(flat, slot))
        self._pending_reset[mask] = False
        return observation, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
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
            if not episodes.open[slot]:
                continue
            done = bool(terms[slot]) or bool(truncs[slot])
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


def _row(observation: object, row: int) -> object:
    """Row ``row`` of a batched (possibly nested) observation."""
    if isinstance(observation, Mapping):
        mapping = cast(Mapping[str, Any], observation)
        return {k: _row(v, row) for k, v in mapping.items()}
    if isinstance(observation, tuple):
        return tuple(_row(v, row) for v in cast(tuple[Any, ...], observation))
    return to_numpy(observation)[row]
