"""Pipelined steps: a served sim gets the next tick's step before the agent reads this tick's reply.

The proof is equality: the pipelined loop on a served sim must produce exactly the frames,
inferences and outcomes of the unpipelined loop, on the same served sim and on the same env in
process, while the run's counters show how many steps actually went ahead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from agent_helpers import RecordingSink

from envs.faulty import EPISODE_STEPS
from hud_pipelines.agent.builtin import RandomPolicy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.recording.events import EpisodeOutcome, EpisodeStatus
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.process import SimProcess
from tests.conftest import FAULTY, REPO, wait_group_gone

CAMERA = f"{REPO / 'envs' / 'camera_pendulum.py'}:camera_pendulum"


def rollout(
    sim: Any, *, chunk: int, send_ahead: int, seeds: list[int], max_steps: int
) -> tuple[list[EpisodeOutcome], RecordingSink, RobotAgent]:
    sink = RecordingSink()
    agent = RobotAgent(RandomPolicy(sim.contract, seed=7, chunk_size=chunk), sim.contract, send_ahead=send_ahead)
    outcomes = agent.run(sim, [{"seed": s} for s in seeds], max_steps=max_steps, key=("pipe", 0, 0), sinks=[sink])
    return outcomes, sink, agent


def records(sink: RecordingSink) -> list[tuple[Any, ...]]:
    """Every frame and inference per slot, in order, without timing."""
    by_slot = sink.by_slot()
    out: list[tuple[Any, ...]] = []
    for slot in sorted(by_slot):
        trace = by_slot[slot]
        for frame in sink.frames[trace]:
            observation = {k: (np.shape(v), np.asarray(v).tobytes()) for k, v in frame.observation.items()}
            out.append((slot, frame.index, observation, frame.action.tolist(), frame.reward, frame.terminated))
        out.extend((slot, "chunk", i.step, i.chunk.tolist()) for i in sink.inferences[trace])
        out.append((slot, "end", sink.ended[trace]))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("depth", [1, 4])
def test_pipelined_cartpole_equals_the_unpipelined_loop_and_the_in_process_sim(depth: int) -> None:
    """Slots end on different ticks, so grades are read and hold rows sent while steps are ahead."""
    seeds = [3, 4, 5, 6]
    with GymBridge("CartPole-v1", len(seeds)) as bridge:
        expected, expected_sink, _ = rollout(bridge, chunk=5, send_ahead=depth, seeds=seeds, max_steps=500)
    with SimProcess.spawn("CartPole-v1", num_envs=len(seeds)) as process, process.connect() as client:
        pipelined, pipelined_sink, ahead = rollout(client, chunk=5, send_ahead=depth, seeds=seeds, max_steps=500)
        plain, plain_sink, lockstep = rollout(client, chunk=5, send_ahead=0, seeds=seeds, max_steps=500)
        assert client.usable
        assert client.in_flight == 0
    assert len({o.steps for o in expected}) > 1, "the slots should end on different ticks"
    assert pipelined == plain == expected
    assert records(pipelined_sink) == records(plain_sink) == records(expected_sink)
    assert ahead.last_run.sent_ahead > 0
    assert lockstep.last_run.sent_ahead == 0
    assert ahead.last_run.ticks == lockstep.last_run.ticks == max(o.steps for o in expected)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_every_queued_action_is_sent_ahead_and_steps_past_the_end_are_dropped(depth: int) -> None:
    """Pendulum ends every slot at tick 200; of each chunk of 3, two steps can go before their tick."""
    chunk, length = 3, 200
    with SimProcess.spawn("Pendulum-v1", num_envs=2) as process, process.connect() as client:
        first, _, agent = rollout(client, chunk=chunk, send_ahead=depth, seeds=[0, 1], max_steps=1000)
        stats = agent.last_run
        # the last chunk (ticks 198-200) sends tick 200's step, which never comes: refused, then dropped
        assert (length - 1) % chunk != chunk - 1
        assert client.in_flight == 0
        second, _, _ = rollout(client, chunk=chunk, send_ahead=depth, seeds=[0, 1], max_steps=1000)
        assert client.usable
    assert stats.ticks == length
    assert stats.sent_ahead == sum(1 for tick in range(length) if tick % chunk != chunk - 1)
    assert stats.infer.count == -(-length // chunk)
    assert [o.steps for o in first] == [length, length]
    assert first == second, "the dropped step left nothing behind for the next run"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [2, 9])
def test_max_steps_is_never_exceeded_by_a_step_sent_ahead(depth: int) -> None:
    with SimProcess.spawn("Pendulum-v1", num_envs=1) as process, process.connect() as client:
        outcomes, sink, agent = rollout(client, chunk=10, send_ahead=depth, seeds=[0], max_steps=25)
        result = client.result()
    assert agent.last_run.ticks == 25
    assert result.slots[0]["steps"] == 25, "the sim stepped exactly max_steps times"
    assert [o.steps for o in outcomes] == [25]
    assert len(next(iter(sink.frames.values()))) == 25


@pytest.mark.timeout(60)
def test_a_slot_that_raises_mid_pipeline_errors_alone_as_it_would_without_pipelining() -> None:
    """Steps already sent behind the failing one still run for the other slots; the failed slot holds."""
    build = {"fault": "raise_step", "at_step": 4, "fault_seed": 21}
    seeds = [20, 21, 22]
    with SimProcess.spawn(FAULTY, num_envs=3, build_args=build) as process, process.connect() as client:
        pipelined, pipelined_sink, agent = rollout(client, chunk=10, send_ahead=8, seeds=seeds, max_steps=50)
        waiting, waiting_sink, _ = rollout(client, chunk=10, send_ahead=0, seeds=seeds, max_steps=50)
        assert client.usable
        assert client.in_flight == 0
    assert agent.last_run.sent_ahead > 0
    assert [o.status for o in pipelined] == [EpisodeStatus.FAILED, EpisodeStatus.ERRORED, EpisodeStatus.FAILED]
    assert pipelined[1].error is not None
    assert "ZeroDivisionError" in pipelined[1].error
    assert [o.steps for o in pipelined] == [EPISODE_STEPS, 3, EPISODE_STEPS], "completed steps: not the one that raised"
    assert pipelined == waiting
    assert records(pipelined_sink) == records(waiting_sink)


@pytest.mark.timeout(60)
def test_a_sim_killed_with_steps_in_flight_errors_every_running_slot() -> None:
    build = {"fault": "crash_step", "at_step": 4}
    with SimProcess.spawn(FAULTY, num_envs=2, build_args=build) as process, process.connect() as client:
        outcomes, sink, agent = rollout(client, chunk=10, send_ahead=8, seeds=[0, 1], max_steps=50)
        assert not client.usable
        assert process.pgid is not None
        pgid = process.pgid
    wait_group_gone(pgid)
    assert agent.last_run.sent_ahead > 0
    assert [o.status for o in outcomes] == [EpisodeStatus.ERRORED, EpisodeStatus.ERRORED]
    assert all(o.error is not None and "SimCrashedError" in o.error for o in outcomes)
    assert [len(frames) for frames in sink.frames.values()] == [3, 3], "the steps before the crash are kept"


@pytest.mark.timeout(120)
def test_a_deep_pipeline_of_camera_frames_neither_stalls_nor_reorders() -> None:
    """16 steps in flight whose replies carry 16 x 96x96x3 frames each (~440 KB): buffers, not deadlock."""
    seeds = list(range(16))
    with SimProcess.spawn(CAMERA, num_envs=16) as process, process.connect() as client:
        outcomes, sink, agent = rollout(client, chunk=20, send_ahead=16, seeds=seeds, max_steps=60)
        assert client.in_flight == 0
        waiting, waiting_sink, _ = rollout(client, chunk=20, send_ahead=0, seeds=seeds, max_steps=60)
    assert agent.last_run.sent_ahead > 0
    assert agent.last_run.ticks == 60
    assert all(o.steps == 60 for o in outcomes)
    assert outcomes == waiting
    assert records(sink) == records(waiting_sink), "the same frames, camera included, in the same ticks"
