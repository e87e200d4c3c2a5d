"""Does the sim repeat an episode's start for the same seed? Checked once per run, before any instance.

Every number an eval reports is only reproducible if ``reset(seed=s)`` always starts the same
episode. An env that draws its start from an unseeded generator (the global ``np.random``, ``random``,
the clock) instead of ``self.np_random`` gives other episodes on every run, and nothing else in a run
would tell. The contract step therefore resets the first instance's slots twice with the same tasks
and compares every observation bit for bit; a difference is a warning in the report and the run's
summary (not an error: the run's own numbers are still what its episodes did). A sim that repeats
its start may still step differently (unseeded noise in ``step``): this check sees only the reset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

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
        return (
            f"the sim does not repeat an episode's start for the same seed: two resets with seed {seed} gave "
            f"different {', '.join(features)} ({len(self.differing)} of the first instance's {len(self.seeds)} "
            "seeds differed), so its episodes will differ from run to run: its reset may draw from an unseeded "
            "random generator (np.random, random) instead of self.np_random"
        )


def check_seeded_reset(
    client: SimClient | ShardedSim, tasks: Sequence[Mapping[str, Any]], *, rollout_hash: str
) -> SeedCheck | None:
    """Reset the sim twice with ``tasks`` and compare; ``None`` (no verdict) where no slot started both times (a
    failed reset raises)."""
    wanted = [dict(task) for task in tasks]
    first = _readings(client.reset(wanted))
    second = _readings(client.reset(wanted))
    pairs = enumerate(zip(first, second, strict=True))
    started = [(slot, before, after) for slot, (before, after) in pairs if before is not None and after is not None]
    if not started:  # a slot that errored at reset says nothing about its seed
        return None
    differing: dict[str, list[str]] = {}
    for slot, before, after in started:
        changed = [name for name in before if not _same(before[name], after[name])]
        if changed:
            differing[str(slot)] = changed
    return SeedCheck(seeds=[task.get("seed") for task in wanted], differing=differing, rollout_hash=rollout_hash)


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
