"""The episodes of a loop the user owns (``wrap(env)``): one record per slot, reported to the sinks.

A slot is the single env, or one sub-env of a vector env; unlike the sim's lockstep slots each
starts its episodes on its own (a vector env's autoreset restarts one sub-env at a time). Grades
follow the bridge: success is sticky once the env reports it, the score is success when the env
reports a success signal, else the episode return. An episode cut short by ``reset`` or ``close``
ends as failed with ``truncated=True``.

A wrapper writing a dataset is finalized at interpreter exit if it was never closed
(:meth:`Episodes.close_at_exit`; see :mod:`.wrap` for what that covers).
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract, derive_env_contract, resolve_contract, to_numpy
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink, EpisodeStatus, Frame
from hud_pipelines.sim.envs import prompt_of

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
        """Derive the contract from the first observation, as the sim bridge derives it, and open the sinks."""
        if self.contract is not None:
            return
        derived = derive_env_contract(env, observation_space, action_space, sample, fallback_name=type(env).__name__)
        self.contract = resolve_contract(derived.contract, self.options.contract_path)
        self.names = derived.names
        spec = getattr(env, "spec", None)
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

    def __init__(self, episodes: Episodes) -> None:
        self.episodes: Episodes | None = episodes

    def __call__(self) -> None:
        episodes, self.episodes = self.episodes, None
        if episodes is None:
            return
        try:
            episodes.close()
        except Exception:
            logger.exception("closing an unclosed wrap() at exit failed; its dataset was not published")
