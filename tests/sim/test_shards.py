"""Sharded sims (``sim.shards``): K children behind one client give the frames of one sim of N slots.

Every comparison is against the same sim unsharded: the frames a sharded sim joins (every field, every
step, steps sent ahead included) and its grades are those of one sim of N slots; a child's failure is
the error one client raises, naming the child, and no child outlives it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.errors import ContractError, SimCrashedError, SimError, SimTimeoutError
from hud_pipelines.sim.pool import LiveSim, SimPool
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.sim.settings import SimSettings
from hud_pipelines.sim.sharded_sim import ShardedSim
from hud_pipelines.sim.shards import ShardedProcess, split_slots
from hud_pipelines.wire.messages import Observation, Result
from tests.conftest import FAULTY, wait_group_gone

TIMED = f"{Path(__file__).with_name('shard_sims.py')}:timed"
JAMMING = f"{Path(__file__).with_name('shard_sims.py')}:jamming"


def _frame(observation: Observation) -> dict[str, Any]:
    """Every field of a frame but its sequence number, in comparable form."""
    return {
        "observation": {k: v.tolist() for k, v in observation.observation.items()},
        "reward": observation.reward.tolist(),
        "terminated": observation.terminated.tolist(),
        "truncated": observation.truncated.tolist(),
        "success": observation.success.tolist(),
        "status": observation.status,
        "prompt": observation.prompt,
        "errors": [(e.slot, e.message, e.cause) for e in observation.errors],
        "nonfinite": observation.nonfinite,
    }


def _drive(
    settings: SimSettings, tasks: list[dict[str, Any]], actions: list[npt.NDArray[Any]], ahead: int
) -> tuple[list[dict[str, Any]], Result, list[int]]:
    """Reset, then every action with ``ahead`` steps sent before their turn; the frames, the grades, the groups."""
    with SimPool(settings) as pool, pool.sim() as live:
        sim = live.client
        frames = [sim.reset(tasks)]
        pending = collections.deque(sim.send_step(a) for a in actions[:ahead])
        for index in range(len(actions)):
            if index + ahead < len(actions):
                pending.append(sim.send_step(actions[index + ahead]))
            frames.append(sim.receive_step(pending.popleft()))
        result = sim.result()
        groups = _groups(live)
    return [_frame(f) for f in frames], result, groups


def _groups(live: LiveSim) -> list[int]:
    process = live.process
    if isinstance(process, ShardedProcess):
        return process.pgids
    return [process.pgid] if process.pgid is not None else []


def test_slots_are_split_as_evenly_as_possible_and_every_shard_has_one() -> None:
    assert split_slots(4, 2) == [range(0, 2), range(2, 4)]
    assert split_slots(5, 2) == [range(0, 3), range(3, 5)]
    assert split_slots(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split_slots(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    with pytest.raises(ValueError, match="2 slot\\(s\\) cannot be split over 3 shard\\(s\\)"):
        split_slots(2, 3)


def test_a_sharded_sim_gives_every_frame_and_grade_of_one_sim_of_all_the_slots() -> None:
    """Five CartPole slots over two children (3 + 2); the second child's slots fall first (pushed one way), so
    its rows are held while the first child steps on, and steps sent ahead reach it after its slots ended."""
    tasks = [{"seed": 20 + slot} for slot in range(5)]
    actions = [np.array([[t % 2], [(t + 1) % 2], [t % 2], [1], [1]], dtype=np.int64) for t in range(24)]
    single, single_result, _ = _drive(SimSettings(factory="CartPole-v1", num_envs=5), tasks, actions, ahead=2)
    sharded, sharded_result, groups = _drive(
        SimSettings(factory="CartPole-v1", num_envs=5, shards=2), tasks, actions, ahead=2
    )
    assert len(groups) == 2
    ended_early = [frame["status"][3:] == ["done", "done"] and "running" in frame["status"][:3] for frame in single]
    assert any(ended_early), "the second child's slots end while the first child's run"
    assert sharded == single
    assert sharded_result.slots == single_result.slots
    assert (sharded_result.score, sharded_result.success) == (single_result.score, single_result.success)
    for group in groups:
        wait_group_gone(group)


def test_a_child_whose_env_raises_in_every_slot_ends_those_slots_as_one_sim_would() -> None:
    """Slot 1's env raises at step 2: one sim ends that slot errored; sharded, it is all of its child's slots."""
    settings = SimSettings(factory=FAULTY, num_envs=2, build_args={"fault": "raise_step", "fault_seed": 11})
    tasks = [{"seed": 10}, {"seed": 11}]
    actions = [np.zeros((2, 1), dtype=np.float32) for _ in range(4)]
    single, _, _ = _drive(settings, tasks, actions, ahead=0)
    sharded, _, groups = _drive(dataclasses.replace(settings, shards=2), tasks, actions, ahead=0)
    assert single[2]["status"] == ["running", "errored"]
    assert [e[0] for e in single[2]["errors"]] == [1]
    assert sharded == single
    for group in groups:
        wait_group_gone(group)


@pytest.mark.parametrize("phase", ["reset", "step"])
def test_a_child_whose_every_slot_raises_gives_each_the_words_one_sim_gives_it(phase: str) -> None:
    """Seeds 10 and 11 jam, each in its own words: one sim of four slots ends them with those words while slots
    2-3 step on; sharded, they are the whole first child, and every frame is still one sim's."""
    settings = SimSettings(factory=JAMMING, num_envs=4, build_args={"below": 12, "phase": phase})
    tasks = [{"seed": seed} for seed in range(10, 14)]
    actions = [np.zeros((4, 1), dtype=np.float32) for _ in range(3)]
    single, _, _ = _drive(settings, tasks, actions, ahead=0)
    sharded, _, groups = _drive(dataclasses.replace(settings, shards=2), tasks, actions, ahead=0)
    said = {
        "reset": "env.reset raised RuntimeError: the gripper of seed {0} jammed at reset (seed {0})",
        "step": "RuntimeError: the gripper of seed {0} jammed at step 2 (seed {0}, step 2)",
    }[phase]
    errors = [(slot, message) for frame in single for slot, message, _ in frame["errors"]]
    assert errors == [(0, said.format(10)), (1, said.format(11))]
    assert single[-1]["status"] == ["errored", "errored", "running", "running"]
    assert sharded == single
    for group in groups:
        wait_group_gone(group)


def test_a_childs_error_names_the_episode_in_one_sims_words() -> None:
    """Slot 3's reward turns NaN: sharded, its child (slots 2-3) once said "(slot 1)" beside the grade row of slot 3;
    the message names the seed and step, which no split of the slots changes."""
    settings = SimSettings(factory=FAULTY, num_envs=4, build_args={"fault": "nan_reward_step", "fault_seed": 13})
    tasks = [{"seed": seed} for seed in range(10, 14)]
    actions = [np.zeros((4, 1), dtype=np.float32) for _ in range(3)]
    single, _, _ = _drive(settings, tasks, actions, ahead=0)
    sharded, _, groups = _drive(dataclasses.replace(settings, shards=2), tasks, actions, ahead=0)
    [(slot, message, _)] = [error for frame in single for error in frame["errors"]]
    assert slot == 3
    assert message == "reward nan is not finite (seed 13, step 2)"
    assert sharded == single
    for group in groups:
        wait_group_gone(group)


def test_a_childs_messages_renumber_the_slots_the_sim_names_and_leave_the_envs_own_words() -> None:
    from hud_pipelines.sim.shard_naming import instance_slots

    said = {
        "slot 1: seed must be an integer or null, got 'x'": "slot 3: seed must be an integer or null, got 'x'",
        "TaskArgumentError: slot 0: options must be a map": "TaskArgumentError: slot 2: options must be a map",
        "RuntimeError: gripper slot 0 jammed (seed 2, step 2)": "RuntimeError: gripper slot 0 jammed (seed 2, step 2)",
        "RuntimeError: slot 1 of the rack is empty": "RuntimeError: slot 1 of the rack is empty",
    }
    assert {message: instance_slots(message, 2) for message in said} == said
    first = "slot 1: seed must be an integer or null, got 'x'"
    assert instance_slots(first, 0) == first, "the first child's slots are the instance's"


@pytest.mark.parametrize(
    ("fault", "error"),
    [pytest.param("crash_step", SimCrashedError, id="crash"), pytest.param("hang_step", SimTimeoutError, id="hang")],
)
def test_a_child_that_crashes_or_hangs_fails_the_sim_naming_it_and_no_child_is_left(
    fault: str, error: type[SimError]
) -> None:
    settings = SimSettings(
        factory=FAULTY, num_envs=4, shards=2, step_timeout_s=2.0, build_args={"fault": fault, "fault_seed": 13}
    )
    with SimPool(settings) as pool, pool.sim() as live:
        assert isinstance(live.process, ShardedProcess)
        groups = live.process.pgids
        live.client.reset([{"seed": 10 + slot} for slot in range(4)])
        live.client.step(np.zeros((4, 1), dtype=np.float32))  # the fault fires at step 2
        with pytest.raises(error, match=re.escape("shard 1 of 2 (slots 2-3): ")) as failed:
            live.client.step(np.zeros((4, 1), dtype=np.float32))
        assert not live.process.alive()
        assert [p.alive() for p in live.process.processes] == [False, False], "the healthy child is stopped too"
        with pytest.raises(SimError, match="the sharded sim is unusable: shard 1 of 2") as later:
            live.client.step(np.zeros((4, 1), dtype=np.float32))
        assert str(later.value).endswith(str(failed.value)), "later requests say the failure in the same words"
    for group in groups:
        wait_group_gone(group)


def test_closing_children_that_ignore_sigterm_takes_one_grace_period_not_one_per_child() -> None:
    settings = SimSettings(factory=FAULTY, num_envs=3, shards=3, build_args={"fault": "hang_close"})
    pool = SimPool(settings)
    with pool.sim() as live:
        assert isinstance(live.process, ShardedProcess)
        groups = live.process.pgids
    started = time.monotonic()
    pool.close(grace_s=1.5)
    assert time.monotonic() - started < 3.0, "three children waited 1.5 s each would take 4.5 s"
    for group in groups:
        wait_group_gone(group)


def test_children_that_serve_different_contracts_are_refused_naming_the_shard(
    spawn: Callable[..., SimProcess],
) -> None:
    clients = [spawn(factory).connect() for factory in ("CartPole-v1", "Pendulum-v1")]
    with pytest.raises(ContractError, match=re.escape("shard 1 of 2 (slot 1) serves another contract than shard 0")):
        ShardedSim(clients)
    assert [c.usable for c in clients] == [False, False], "both connections are closed"


def test_the_children_of_a_sharded_sim_step_at_the_same_time(tmp_path: Path) -> None:
    """Each step of the timed env logs when it ran and in which process: the two children's steps overlap."""
    log = tmp_path / "steps.jsonl"
    settings = SimSettings(factory=TIMED, num_envs=2, shards=2, build_args={"log": str(log), "delay_s": 0.2})
    with SimPool(settings) as pool, pool.sim() as live:
        live.client.reset([{"seed": 0}, {"seed": 1}])
        for _ in range(3):
            live.client.step(np.zeros((2, 1), dtype=np.float32))
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    by_process: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for step in steps:
        by_process[step["pid"]].append((step["start"], step["end"]))
    assert len(by_process) == 2, "one process per shard"
    first, second = by_process.values()
    overlapping = [(a, b) for a in first for b in second if a[0] < b[1] and b[0] < a[1]]
    assert len(overlapping) >= 3, f"every step of one child overlaps one of the other's: {steps}"


def test_a_shards_error_keeps_its_type_and_cause_so_its_fault_is_the_childs() -> None:
    from hud_pipelines.errors import Fault, RemoteError, SimContractError, fault_of
    from hud_pipelines.sim.shard_naming import shard_error

    env_raised = shard_error(RemoteError("step raised", phase="step", slot=1, cause="env"), "shard 1", 4)
    assert isinstance(env_raised, RemoteError)
    assert (env_raised.slot, fault_of(env_raised)) == (5, Fault.ENV), "the env's own fault, in the instance's slot"
    misfit = shard_error(SimContractError("observation feature 'state' came as ..."), "shard 1", 4)
    assert fault_of(misfit) is Fault.CONTRACT
    assert str(misfit).startswith("shard 1: ")


def test_slots_that_ask_for_other_builds_are_refused_as_one_sim_refuses_them_with_the_instances_slot() -> None:
    """Before, each child compared only its own slice: slots 0-1 asking for one build and slots 2-3 for
    another started two builds in one instance, which one sim of four slots refuses."""
    settings = SimSettings(factory=FAULTY, num_envs=4)
    tasks: list[dict[str, Any]] = [{"seed": 0}, {"seed": 1}, {"seed": 2, "at_step": 3}, {"seed": 3, "at_step": 3}]
    said = "slot 2: asks for build arguments {'at_step': 3}, the first slot for {}"
    misspelled: list[dict[str, Any]] = [{"seed": 0}, {"seed": 1}, {"seed": 2, "at_stpe": 3}, {"seed": 3}]
    typo = "task argument 'at_stpe' is accepted neither by the factory faulty"
    for shards in (1, 2):
        with SimPool(dataclasses.replace(settings, shards=shards)) as pool, pool.sim() as live:
            with pytest.raises(SimError, match=re.escape(said)):
                live.client.reset(tasks)
            with pytest.raises(SimError, match=re.escape(typo) + r".*did you mean 'at_step'"):
                live.client.reset(misspelled)  # the key is refused first, as one sim refuses it
            assert [o.tolist() for o in live.client.reset([{"seed": s} for s in range(4)]).observation.values()]
