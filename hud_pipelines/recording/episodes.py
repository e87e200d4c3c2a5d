"""The episodes of a loop the user owns (``wrap(env)``): one record per slot, reported to the sinks.

A slot is the single env, or one sub-env of a vector env; unlike the sim's lockstep slots each
starts its episodes on its own (a vector env's autoreset restarts one sub-env at a time). Grades
follow the bridge: success is sticky once the env reports it, the score is success when the env
reports a success signal, else the episode return. An episode cut short by ``reset`` or ``close``
ends as failed with ``truncated=True``; one whose env raised, or whose observation no longer fits the
contract, ends errored with its fault, as an eval's does (an error is never a failure).

A wrapper writing a dataset is finalized at interpreter exit if it was never closed
(:meth:`Episodes.close_at_exit`; see :mod:`.wrap` for what that covers).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract, derive_env_contract, env_sources, resolve_contract, robot_name, to_numpy
from hud_pipelines.errors import ContractError, Fault, HudPipelinesError, fault_of
from hud_pipelines.recording.events import (
    EpisodeKey,
    EpisodeOutcome,
    EpisodeSink,
    EpisodeStatus,
    Frame,
    FrameBatch,
    checked_sinks,
    errored,
)
from hud_pipelines.sim.envs import prompt_of
from hud_pipelines.sim.slots import SlotBatch, SlotRecord, seed_named

if TYPE_CHECKING:
    from hud_pipelines.dataset.publish import DatasetBuild

logger = logging.getLogger(__name__)

CUT_SHORT = "the episode was cut short by reset() or close()"
_REGISTER_EXIT_HOOKS_ON_IMPORT = ("concurrent.futures.thread", "concurrent.futures.process")


@dataclass(frozen=True)
class WrapOptions:
    """What ``wrap(env)`` was asked for (see :func:`hud_pipelines.recording.wrap.wrap`)."""

    job: str = "wrap"
    sinks: list[EpisodeSink] = field(default_factory=list[EpisodeSink])
    trace_dir: Path | None = None
    prompt: str | None = None
    contract_path: Path | None = None
    task: int = 0
    instance: int = 0
    video: bool = False
    dataset: Path | None = None
    dataset_repo_id: str | None = None


class Episodes:
    """Per-slot episode bookkeeping shared by the single-env and vector-env wrappers."""

    def __init__(self, options: WrapOptions, num_slots: int) -> None:
        self.options = options
        self.sinks: list[EpisodeSink] = checked_sinks(options.sinks)
        self.num_slots = num_slots
        self.contract: Contract | None = None
        self.names: dict[str, str] = {}
        self.prompt = ""
        self.records = [SlotBatch(1) for _ in range(num_slots)]
        """Each slot's episode record, kept by the sim's own bookkeeping: a sub-env starts its episodes on
        its own (autoreset, ``reset_mask``), so each is a batch of one slot."""
        self.keys: list[EpisodeKey | None] = [None] * num_slots
        """The key of each slot's open episode; ``None`` once it was reported ended (or before it began)."""
        self.last: list[dict[str, npt.NDArray[Any]]] = [{} for _ in range(num_slots)]
        self.dataset: DatasetBuild | None = None
        self._at_exit: _CloseAtExit | None = None
        self.closed = False

    def close_at_exit(self) -> None:
        """Close (and publish) at interpreter exit unless :meth:`close` ran first.

        Registered now, not at exit: by then Python refuses new exit hooks, and a module that
        registers one on import (``concurrent.futures``, which lerobot imports in the writer
        thread) fails to import. So those modules are imported here too.
        """
        for module in _REGISTER_EXIT_HOOKS_ON_IMPORT:
            importlib.import_module(module)
        if self._at_exit is None:
            self._at_exit = _CloseAtExit(self, keep=self.options.dataset is not None)
            _register_before_threads_join(self._at_exit)

    def ensure_contract(self, env: Any, observation_space: Any, action_space: Any, sample: object) -> None:
        """Derive the contract from the first observation, as the sim bridge derives it, and open the sinks."""
        if self.contract is not None:
            return
        derived = derive_env_contract(env, observation_space, action_space, sample, fallback_name=type(env).__name__)
        self.contract = resolve_contract(derived.contract, self.options.contract_path)
        self.names = derived.names
        if self.options.trace_dir is not None:
            from hud_pipelines.recording.traces import TraceRecorder

            self.sinks.append(TraceRecorder(self.options.trace_dir, self.contract, video=self.options.video))
        if self.options.dataset is not None:
            from hud_pipelines.dataset.publish import DatasetBuild

            self.dataset = DatasetBuild(self.options.dataset, self.contract, repo_id=self.options.dataset_repo_id)
            self.sinks.append(self.dataset.sink(self.options.job.replace("/", "_") or "wrap"))
        # as the sim names an episode's task: a vector env's by its sub-envs (a SyncVectorEnv is no task's name)
        sources = env_sources(env)
        default_prompt = next(filter(None, map(prompt_of, sources)), None) or robot_name(sources)
        self.prompt = self.options.prompt if self.options.prompt is not None else default_prompt or "task"

    def observation(self, flat: dict[str, npt.NDArray[Any]], slot: int | None) -> dict[str, npt.NDArray[Any]]:
        """One slot's observation in contract keys and dtypes (``slot=None``: an unbatched observation)."""
        assert self.contract is not None
        out: dict[str, npt.NDArray[Any]] = {}
        for name, value in flat.items():
            key = self.names.get(name, name)
            feature = self.contract.features[key]
            row = np.asarray(value if slot is None else value[slot])
            if row.size != feature.size:
                raise ContractError(
                    f"observation {key!r} is {row.dtype}{list(row.shape)}, the contract says "
                    f"{feature.dtype}{list(feature.shape)}"
                )
            out[key] = np.array(row, dtype=feature.dtype).reshape(feature.shape)
        return out

    def is_open(self, slot: int) -> bool:
        return self.keys[slot] is not None

    def begin(self, slot: int, seed: int | None, observation: dict[str, npt.NDArray[Any]]) -> None:
        if self.closed:  # its sinks are closed and its dataset published: an episode now would go nowhere
            raise HudPipelinesError(
                "this wrap() was closed: its traces and dataset are written; wrap the env again to record more "
                "episodes (into another dataset folder: publishing replaces the folder's dataset)"
            )
        if self.is_open(slot):
            self.end(slot, terminated=False, truncated=True, reason=CUT_SHORT)
        record = self.records[slot]
        record.begin([seed])
        o = self.options
        key = EpisodeKey(o.job, o.task, o.instance, slot, record.record(0).episode, seed)
        self.keys[slot] = key
        self.last[slot] = observation
        for sink in self.sinks:
            sink.begin(key, self.prompt)
        if (problem := _not_finite(observation, None, f"at reset ({seed_named(seed)})")) is not None:
            self._finish(slot, lambda record: errored(problem, 0, 0.0, Fault.NONFINITE))

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
        record = self.records[slot]
        index = int(record.steps[0])
        if (problem := _not_finite(observation, reward, f"({seed_named(key.seed)}, step {index + 1})")) is not None:
            # as the sim's screening ends it: errored, with the steps before it (the agent loop's grade)
            self._finish(slot, lambda ended: errored(problem, ended.steps, ended.total_reward, Fault.NONFINITE))
            return
        record.record_step(
            np.array([reward], dtype=np.float64),
            np.array([terminated]),
            np.array([truncated]),
            np.array([success], dtype=np.int8),
        )
        frame = Frame(
            index=index,
            observation=self.last[slot],
            action=np.asarray(to_numpy(action), dtype=np.float32).reshape(self.contract.action.size),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success == 1,  # the env's word on this step, as the agent loop's frames say it
        )
        batch = FrameBatch.of(key, frame)
        for sink in self.sinks:
            sink.add_frames(batch)
        self.last[slot] = observation
        if terminated or truncated:
            self.end(slot, terminated=terminated, truncated=truncated)

    def end(self, slot: int, *, terminated: bool, truncated: bool, reason: str | None = None) -> None:
        def graded(record: SlotRecord) -> EpisodeOutcome:
            return EpisodeOutcome(
                EpisodeStatus.SUCCEEDED if record.success else EpisodeStatus.FAILED,
                record.score,
                record.success,
                record.total_reward,
                record.steps,
                terminated,
                truncated,
                extra={} if reason is None else {"reason": reason},
                success_reported=record.success_reported,
                success_at_end=record.success_now,
            )

        self._finish(slot, graded)

    def fail(self, slot: int, exc: Exception) -> None:
        """End ``slot``'s open episode as errored: its env raised (or its observation left the contract), so the
        episode has no answer; it is not counted a failure, and a dataset keeps it out as an eval's does."""
        reason = f"{type(exc).__name__}: {exc}"
        self._finish(slot, lambda record: errored(reason, record.steps, record.total_reward, fault_of(exc)))

    def _finish(self, slot: int, outcome: Callable[[SlotRecord], EpisodeOutcome]) -> None:
        """End ``slot``'s open episode (none open: nothing) with the outcome of its record, in every sink."""
        key, self.keys[slot] = self.keys[slot], None
        if key is None:
            return
        ended = outcome(self.records[slot].record(0))
        for sink in self.sinks:
            sink.end(key, ended)

    def close(self) -> None:
        self.closed = True
        if self._at_exit is not None:
            self._at_exit.forget()
            self._at_exit = None
        for slot in range(self.num_slots):
            self.end(slot, terminated=False, truncated=True, reason=CUT_SHORT)
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        if self.dataset is not None:
            build, self.dataset = self.dataset, None
            build.publish()


def _register_before_threads_join(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit *before* Python joins non-daemon threads.

    ``atexit`` runs only after that join, when the dataset's writer threads are gone and no new
    thread may start; ``threading``'s own exit registry (private, the one ``concurrent.futures``
    uses) runs first, while the writers still take work.
    """
    register: Callable[[Callable[[], None]], None] = vars(threading)["_register_atexit"]
    register(hook)


class _CloseAtExit:
    """An exit hook that closes the episodes of a wrapper nobody closed (and then forgets them).

    It keeps a wrapper writing a dataset alive to the end (the dataset is published then); any other it holds
    weakly, so that a wrapper dropped unclosed is let go, its open files with it. It runs only in the process
    that registered it: a forked child's exit must not end the parent's episodes in the parent's files.
    """

    def __init__(self, episodes: Episodes, *, keep: bool) -> None:
        self._kept: Episodes | None = episodes if keep else None
        self._weak: weakref.ref[Episodes] | None = weakref.ref(episodes)
        self._pid = os.getpid()

    def forget(self) -> None:
        self._kept, self._weak = None, None

    def __call__(self) -> None:
        episodes = self._weak() if self._weak is not None else None
        self.forget()
        if episodes is None or os.getpid() != self._pid:
            return
        try:
            episodes.close()
        except Exception:
            said = "; its dataset was not published" if episodes.options.dataset is not None else ""
            logger.exception("closing an unclosed wrap() at exit failed%s", said)


def _not_finite(observation: dict[str, npt.NDArray[Any]], reward: float | None, when: str) -> str | None:
    """Why an episode ends as errored, as the sim's screening says it (:mod:`hud_pipelines.sim.screen`): a float
    observation or the reward holds NaN or infinity; ``None`` when none does. ``when`` names the episode and the
    step (``(seed 7, step 2)``), never the slot."""
    for key, value in observation.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"observation {key!r} is not finite {when}"
    if reward is not None and not math.isfinite(reward):
        return f"reward {reward} is not finite {when}"
    return None
