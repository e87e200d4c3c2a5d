"""The agent loop: N slots of one sim, one loop, batched first (``N = 1`` is a batch of one).

Every slot has an open-loop queue of actions. On each tick:

1. the slots that are still running and whose queue ran dry are refilled by **one** ``infer`` over
   exactly those rows (slots with actions left are not asked);
2. each refilled slot's chunk is cut to the horizon and converted by ``adapt_chunk(chunk, obs)``
   against that slot's own observation (e.g. deltas to absolute targets);
3. every running slot pops its next action (through ``adapt_action(action, obs)`` when set);
   finished slots repeat their last row, which the sim replaces by its hold action;
4. one ``[N, A]`` step; running slots report a frame to every sink, and a slot whose episode ended
   clears its queue and records nothing more.

With a served sim the steps are pipelined: while every running slot still has queued actions (and
no ``adapt_action`` needs the observation), up to ``send_ahead`` later ticks' steps are sent before
this tick's observation is read, so the sim steps while replies cross the wire and the agent
records frames. The actions, episodes and records are exactly those of the unpipelined loop: a
slot that ends ignores the rows already sent for it (the sim holds finished slots), and steps sent
for ticks that never come (every slot ended) are refused by the sim ("no slot is running") and
dropped. ``send_ahead=0`` waits for every reply.

The loop ends when no slot is running or after ``max_steps`` ticks; slots still running then end as
failed with ``truncated=True``. An error from the sim (a :class:`~hud_pipelines.errors.SimError`
from a served sim, or any :class:`~hud_pipelines.errors.HudPipelinesError` an in-process bridge
raises), a policy's deadline or lost server, or an answer of the wrong shape ends the running slots as
errored with the reason; a policy that raised ends only the rows it raised on (the forward's rows are run
again one by one to find them). Finished slots keep their outcome, and ``run`` returns normally: every slot
always gets exactly one outcome.

Scores follow the one scoring rule (:func:`~hud_pipelines.sim.slots.episode_score`) from what each
frame says: a slot's success and whether its env reports success at all (``success_reported``),
which decides whether the score is the success or the return. Sinks hear ``end`` on the tick the
episode ended, with that grade.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hud_pipelines.agent.episodes import OutcomeGrader
from hud_pipelines.agent.loop import (
    ActionAdapter,
    ChunkAdapter,
    LockstepRun,
    LoopSettings,
    PipelinedSim,
    RunStats,
    Sim,
    StopCause,
    forward_rows,
)
from hud_pipelines.agent.policy import BasePolicy, Policy, as_base_policy
from hud_pipelines.contract import Contract
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeSink
from hud_pipelines.spec.agent import DEFAULT_SEND_AHEAD

EpisodeKeyFactory = Callable[[int, int | None], EpisodeKey]
"""``key(slot, seed) -> EpisodeKey``"""

__all__ = [
    "ActionAdapter",
    "BasePolicy",
    "ChunkAdapter",
    "EpisodeKeyFactory",
    "EpisodeKeys",
    "OutcomeGrader",
    "PipelinedSim",
    "RobotAgent",
    "RunStats",
    "Sim",
    "StopCause",
    "forward_rows",
]


@dataclass(frozen=True)
class EpisodeKeys:
    """Keys of one run's episodes: ``(job, task, instance, slot, episode, seed)``."""

    job: str
    task: int = 0
    instance: int = 0
    episode: int = 0

    def __call__(self, slot: int, seed: int | None) -> EpisodeKey:
        return EpisodeKey(self.job, self.task, self.instance, slot, self.episode, seed)


class RobotAgent:
    """Drives every slot of a sim with one policy (see the module docstring for the loop)."""

    def __init__(
        self,
        policy: Policy | BasePolicy,
        contract: Contract,
        *,
        horizon: int | None = None,
        adapt_chunk: ChunkAdapter | None = None,
        adapt_action: ActionAdapter | None = None,
        send_ahead: int = DEFAULT_SEND_AHEAD,
    ) -> None:
        if horizon is not None and horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if send_ahead < 0:
            raise ValueError(f"send_ahead must be >= 0, got {send_ahead}")
        self.policy = as_base_policy(policy)
        self.contract = contract
        self.settings = LoopSettings(
            policy=self.policy,
            width=contract.action.size,
            horizon=horizon if horizon is not None else self.policy.horizon,
            send_ahead=send_ahead,
            observation_steps=self.policy.observation_steps,
            adapt_chunk=adapt_chunk,
            adapt_action=adapt_action,
        )
        """How every run drives its slots; ``send_ahead`` is how many steps a served sim may be sent
        ahead of the observation (see the module docstring)."""
        self.last_run = RunStats()
        self._episodes: dict[tuple[str, int, int], int] = {}

    # -- public ----------------------------------------------------------------------------------------

    def run(
        self,
        sim: Sim,
        tasks: list[dict[str, Any]],
        *,
        max_steps: int,
        key: EpisodeKeyFactory | tuple[str, int, int],
        sinks: Sequence[EpisodeSink] = (),
        prompts: list[str] | None = None,
        grade: OutcomeGrader | None = None,
        stop_cause: StopCause | None = None,
    ) -> list[EpisodeOutcome]:
        """Run one episode in every slot of ``sim``; returns one outcome per slot.

        ``key`` is an :data:`EpisodeKeyFactory` or ``(job, task, instance)``; with the tuple, the
        episode number counts the runs this agent made under that triple. ``prompts`` (one per
        slot) override the prompts the sim offers at reset. ``grade`` turns each answered episode's
        outcome into the pipeline's verdict *before* the sinks hear of it, so traces, datasets and
        grades carry one success. ``stop_cause`` explains a sim or policy failure that the caller
        caused on purpose (an instance deadline that killed the sim): the slots then end with that
        reason and fault instead of the crash it provoked.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        num_slots = sim.num_envs
        if len(tasks) != num_slots:
            raise ValueError(f"run needs one task per slot: the sim has {num_slots} slots, {len(tasks)} tasks given")
        if prompts is not None and len(prompts) != num_slots:
            raise ValueError(f"prompts must have one entry per slot ({num_slots}), got {len(prompts)}")
        keys = self._keys(key, tasks)
        stats = self.last_run = RunStats()
        started = time.perf_counter()
        try:
            run = LockstepRun(self.settings, sim, keys, list(sinks), stats, grade=grade, stop_cause=stop_cause)
            return run.execute(tasks, max_steps, prompts)
        finally:
            stats.wall_s = time.perf_counter() - started

    # -- helpers ---------------------------------------------------------------------------------------

    def _keys(self, key: EpisodeKeyFactory | tuple[str, int, int], tasks: list[dict[str, Any]]) -> list[EpisodeKey]:
        if isinstance(key, tuple):
            triple = cast(tuple[str, int, int], key)
            job, task, instance = triple
            episode = self._episodes.get(triple, 0)
            self._episodes[triple] = episode + 1
            key = EpisodeKeys(job, task, instance, episode)
        return [key(slot, _seed(task)) for slot, task in enumerate(tasks)]


def _seed(task: dict[str, Any]) -> int | None:
    """A task's seed, as the sim takes it: any integer (``np.arange``'s too), never a bool."""
    seed = task.get("seed")
    if isinstance(seed, bool):
        return None
    return int(seed) if isinstance(seed, numbers.Integral) else None
