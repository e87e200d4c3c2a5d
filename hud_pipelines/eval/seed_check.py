"""Does the sim repeat an episode for the same seed and actions? Checked once per run, before any instance.

Every number an eval reports is only reproducible if ``reset(seed=s)`` always starts the same
episode and the same actions always step it the same way. An env that draws from an unseeded generator
(the global ``np.random``, ``random``, the clock) instead of ``self.np_random``, in its reset or in its
step, gives other episodes on every run, and nothing else in a run would tell. The contract step
therefore resets the first instance's slots twice with the same tasks, steps each start
:data:`CHECK_STEPS` times with the same fixed action (:func:`fixed_action`), and compares every
observation and reward bit for bit; a difference is a warning in the report and the run's summary (not an
error: the run's own numbers are still what its episodes did). Noise that only a policy's actions, or a
step past the first few, would show stays unseen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract
from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.sharded_sim import ShardedSim
from hud_pipelines.wire.messages import Observation


@dataclass(frozen=True)
class SeedCheck:
    """The outcome: the seeds both resets used and, per slot, the observation features that differed."""

    seeds: list[int | None]
    differing: dict[str, list[str]]
    """Slot (as text: a JSON key) -> features whose values differed between the two resets."""
    rollout_hash: str = ""
    """The configuration checked: a report of another one ignores the file (it would be stale)."""

    @property
    def repeats(self) -> bool:
        return not self.differing

    def warning(self) -> str | None:
        """The report's line for a sim that does not repeat its start (``None`` when it does)."""
        if self.repeats:
            return None
        slot, features = next(iter(self.differing.items()))
        seed = self.seeds[int(slot)]
        if not any(" step" in feature for feature in features):  # the starts differed (a step's readings say " step")
            return (
                f"the sim does not repeat an episode's start for the same seed: two resets with seed {seed} gave "
                f"different {', '.join(features)} ({len(self.differing)} of the first instance's {len(self.seeds)} "
                "seeds differed), so its episodes will differ from run to run: its reset may draw from an unseeded "
                "random generator (np.random, random) instead of self.np_random"
            )
        return (
            f"the sim does not repeat an episode for the same seed and actions: two resets with seed {seed}, each "
            f"stepped with the same action, gave different {', '.join(features)} ({len(self.differing)} of the "
            f"first instance's {len(self.seeds)} seeds differed), so its episodes will differ from run to run: its "
            "step may draw from an unseeded random generator (np.random, random) or the clock instead of "
            "self.np_random"
        )


CHECK_STEPS = 3
"""Steps taken from each start of the check, every one with the same fixed action."""
AFTER, REWARD = " after step ", "reward of step "
"""How a step's readings are named: ``<feature> after step <k>``, ``reward of step <k>``."""
Stages = list[dict[str, npt.NDArray[Any]]]
"""One slot's readings: its reset's observation, then each step's observation and reward."""


def check_seeded_reset(
    client: SimClient | ShardedSim, tasks: Sequence[Mapping[str, Any]], *, rollout_hash: str
) -> SeedCheck | None:
    """Reset the sim twice with ``tasks``, step each start the same way, and compare; ``None`` (no verdict) where
    no slot started both times (a failed reset raises; a failed step only ends the stepping)."""
    wanted = [dict(task) for task in tasks]
    action = fixed_action(client.contract, client.num_envs)
    first = _episode_start(client, wanted, action)
    second = _episode_start(client, wanted, action)
    pairs = enumerate(zip(first, second, strict=True))
    started = [(slot, before, after) for slot, (before, after) in pairs if before is not None and after is not None]
    if not started:  # a slot that errored at reset says nothing about its seed
        return None
    differing: dict[str, list[str]] = {}
    for slot, before, after in started:
        changed = _first_difference(before, after)
        if changed:
            differing[str(slot)] = changed
    return SeedCheck(seeds=[task.get("seed") for task in wanted], differing=differing, rollout_hash=rollout_hash)


def fixed_action(contract: Contract, num_slots: int) -> npt.NDArray[np.float32]:
    """One action for every slot and step of the check: the middle of the action's bounds where it has them (its
    lower bound for whole-number actions, which must be whole), else 0 within what it has."""
    feature = contract.action
    width = feature.size
    low = np.asarray(feature.low if feature.low is not None else [-np.inf] * width, dtype=np.float64)
    high = np.asarray(feature.high if feature.high is not None else [np.inf] * width, dtype=np.float64)
    whole = np.dtype(feature.dtype).kind in "biu"
    bounded = np.isfinite(low) & np.isfinite(high)
    middle = np.where(bounded, (low + high) / 2, 0.0)
    value = np.where(bounded & whole, low, np.clip(middle, low, high))
    return np.repeat(value.astype(np.float32)[None], num_slots, axis=0)


def _episode_start(
    client: SimClient | ShardedSim, tasks: list[dict[str, Any]], action: npt.NDArray[np.float32]
) -> list[Stages | None]:
    """Each slot's reset observation, then its observation and reward after each of :data:`CHECK_STEPS` steps of
    ``action`` while it runs; ``None`` for a slot that errored at reset."""
    observation = client.reset(tasks)
    slots = [None if reading is None else [reading] for reading in _readings(observation)]
    for step in range(1, CHECK_STEPS + 1):
        running = [slot for slot, status in enumerate(observation.status) if status == "running"]
        if not running:
            break
        try:
            observation = client.step(action)
        except HudPipelinesError:  # the instance that meets it says what broke: the check only compares
            break
        readings = _readings(observation)
        for slot in running:
            stages, reading = slots[slot], readings[slot]
            if stages is not None and reading is not None:
                named = {f"{name}{AFTER}{step}": value for name, value in reading.items()}
                stages.append(named | {f"{REWARD}{step}": np.array(observation.reward[slot])})
    return slots


def _first_difference(before: Stages, after: Stages) -> list[str]:
    """The readings of the first stage (the reset, then each step) at which the two runs of a slot differ."""
    for first, second in zip(before, after, strict=False):
        changed = [name for name in first if name not in second or not _same(first[name], second[name])]
        if changed:
            return changed
    if len(before) != len(after):  # one run of the slot ended, or errored, sooner
        return [f"episode lengths ({len(before) - 1} against {len(after) - 1} steps)"]  # " step": a step's reading
    return []


def write_seed_check(outputs: EvalOutputs, check: SeedCheck | None) -> None:
    """``seed_check.json`` of this run's contract step; removed when there is no verdict, so none is stale."""
    if check is None:
        outputs.seed_check.unlink(missing_ok=True)
        return
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.seed_check, json.dumps(asdict(check), indent=1))


def read_seed_check(outputs: EvalOutputs) -> SeedCheck | None:
    path = outputs.seed_check
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    differing = {k: list(v) for k, v in record["differing"].items()}
    return SeedCheck(seeds=list(record["seeds"]), differing=differing, rollout_hash=str(record.get("rollout_hash", "")))


def seed_warning(outputs: EvalOutputs, rollout_hash: str) -> str | None:
    """The warning of the latest check of this configuration (``rollout_hash``), if it found one.

    A run whose contract step did not run (a run of some assets, the units of a Celery deployment)
    keeps the latest check's file; it speaks for the configuration it checked only.
    """
    check = read_seed_check(outputs)
    return None if check is None or check.rollout_hash != rollout_hash else check.warning()


def _readings(observation: Observation) -> list[dict[str, npt.NDArray[Any]] | None]:
    """Each slot's observation (copied: a reply's arrays may be reused), ``None`` for a slot that errored."""
    errored = {error.slot for error in observation.errors}
    return [
        None if slot in errored else {name: np.array(values[slot]) for name, values in observation.observation.items()}
        for slot in range(observation.num_slots)
    ]


def _same(before: npt.NDArray[Any], after: npt.NDArray[Any]) -> bool:
    """Bit for bit: NaN equals NaN, ``-0.0`` differs from ``0.0``."""
    return before.shape == after.shape and before.tobytes() == after.tobytes()
