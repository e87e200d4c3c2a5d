"""SimPool: sims are reused between instances and closed together, gracefully, at the end."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any

import pytest

from hud_pipelines.errors import SimStartError
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.sim.settings import SimSettings
from tests.conftest import wait_group_gone


def test_closing_the_pool_stops_every_sim_gracefully_and_leaves_no_process() -> None:
    pool = SimPool(SimSettings(factory="CartPole-v1", num_envs=2))
    with contextlib.ExitStack() as held:
        lives = [held.enter_context(pool.sim()) for _ in range(3)]  # held at once: three children
    with pool.sim() as reused:
        assert reused in lives, "an idle sim is reused, not a fourth one spawned"
    assert pool.spawned == 3
    processes = [live.process for live in lives]
    pool.close(grace_s=10.0)
    assert [p.returncode for p in processes] == [0, 0, 0], "each child ended on its own after SIGTERM"
    for process in processes:
        assert process.pgid is not None
        wait_group_gone(process.pgid)


def test_closing_sims_that_ignore_sigterm_takes_one_grace_period_not_one_per_sim() -> None:
    pool = SimPool(SimSettings(factory="envs.faulty:faulty", build_args={"fault": "hang_close"}))
    with contextlib.ExitStack() as held:
        lives = [held.enter_context(pool.sim()) for _ in range(3)]
    started = time.monotonic()
    pool.close(grace_s=1.5)
    assert time.monotonic() - started < 3.0, "three sims waited 1.5 s each would take 4.5 s"
    for live in lives:
        assert live.process.returncode == -signal.SIGKILL, "each was killed once the grace period was over"
        assert live.process.pgid is not None
        wait_group_gone(live.process.pgid)


def test_a_sim_in_use_when_the_pool_closes_is_stopped_and_released_cleanly() -> None:
    pool = SimPool(SimSettings(factory="CartPole-v1"))
    with pool.sim() as live:
        live.client.reset({"seed": 0})
        pool.close(grace_s=10.0)
        assert not live.process.alive()
    assert live.process.returncode == 0
    pool.close()  # safe twice


def test_a_sim_that_did_not_start_is_not_started_again_for_the_next_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each instance would wait out the start-up deadline again for the same factory and arguments."""
    spawned: list[str] = []
    spawn = SimProcess.spawn

    def counted(factory: str, **options: Any) -> SimProcess:
        spawned.append(factory)
        return spawn(factory, **options)

    monkeypatch.setattr(SimProcess, "spawn", counted)
    pool = SimPool(SimSettings(factory="envs.faulty:faulty", build_args={"fault": "raise_build"}))
    with pytest.raises(SimStartError, match="FaultyEnv refused to build") as first, pool.sim():
        pass
    with pytest.raises(SimStartError) as again, pool.sim():
        pass
    assert spawned == ["envs.faulty:faulty"], "one child was started, not one per instance"
    headline = str(again.value).splitlines()[0]
    assert headline == str(first.value).splitlines()[0] + " (not started again: an earlier start in this run failed so)"
    assert str(again.value).splitlines()[1:] == str(first.value).splitlines()[1:], "the child's stderr tail as it was"
    assert again.value.child_error == first.value.child_error
    pool.close()


def test_a_sim_killed_by_a_signal_while_starting_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An out-of-memory kill while several sims start may not happen twice: the next instance tries again."""
    calls: list[int] = []

    def killed(factory: str, **options: Any) -> SimProcess:
        calls.append(1)
        raise SimStartError("the sim exited with code -9 before it was ready", signalled=True)

    monkeypatch.setattr(SimProcess, "spawn", killed)
    pool = SimPool(SimSettings(factory="CartPole-v1"))
    for _ in range(2):
        with pytest.raises(SimStartError, match="code -9"), pool.sim():
            pass
    assert len(calls) == 2
    pool.close()


def test_what_runs_on_the_contracts_sim_may_fail_without_losing_the_contract_and_that_sim_is_not_reused() -> None:
    pool = SimPool(SimSettings(factory="envs.faulty:faulty", num_envs=2, build_args={"fault": "raise_reset"}))
    seen: list[Any] = []

    def reset_every_slot(client: Any) -> None:
        seen.append(client)
        client.reset([{"seed": 0}, {"seed": 1}])  # every seeded reset of this sim raises: no slot runs
        client.step([[0.0], [0.0]])  # refused

    try:
        contract = pool.contract(then=reset_every_slot)
        assert len(seen) == 1
        assert contract.action.shape == (1,)
        assert pool.contract(then=reset_every_slot) is contract
        assert len(seen) == 1, "only the call that reads the contract runs it"
        with pool.sim() as live:
            assert live.client is not seen[0], "the sim whose check failed was stopped, not reused"
        assert pool.spawned == 2
    finally:
        pool.close()


def test_a_pipelines_sim_whose_reset_needs_options_starts_probed_with_its_first_tasks() -> None:
    """The child's start-up reset (it samples the contract's observation) gets the first tasks' seeds and options
    in turn: a first task whose options break reset errors its own episodes, and every task's sims start (they
    all failed to start, so that the results depended on the order of the tasks)."""
    from pathlib import Path

    from hud_pipelines.eval.runner import sim_settings
    from hud_pipelines.spec.models import PipelineSpec

    spec = PipelineSpec.model_validate(
        {
            "name": "needs_options",
            "sim": {"factory": f"{Path(__file__).with_name('probe_sims.py')}:needs_options", "num_envs": 2},
            "agent": {"policy": {"kind": "random"}},
            "tasks": [
                {"name": "broken", "seed": 1, "options": {"level": 2}},
                {"seed": 3, "options": {"difficulty": 0.25}},
            ],
        }
    )
    with SimPool(sim_settings(spec)) as pool:
        assert pool.contract().observation_features["state"].shape == (2,)
        with pool.sim() as live:
            reply = live.client.reset(spec.slot_tasks(1, 0))
            assert reply.observation["state"].tolist() == [[0.25, 0.25], [0.25, 0.25]]
            broken = live.client.reset(spec.slot_tasks(0, 0))  # the task whose options break reset errors its own
            assert broken.status == ["errored", "errored"]
            assert [("needs options['difficulty']" in e.message, e.cause) for e in broken.errors] == [(True, "env")] * 2


def test_a_sim_process_dropped_without_close_is_killed_and_reaped() -> None:
    """Its child saw its stdin close and exited, but nobody waited for it: a zombie until the parent ended."""
    import gc
    from pathlib import Path

    sim = SimProcess.spawn("CartPole-v1")
    pid, pgid = sim.pid, sim.pgid
    assert pid is not None
    assert pgid is not None
    del sim
    gc.collect()
    assert not Path(f"/proc/{pid}").exists(), "killed and reaped: not even a zombie is left"
    wait_group_gone(pgid)
