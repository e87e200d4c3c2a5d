"""The agent loop's rules, checked tick by tick on a scripted sim, then on real gymnasium sims."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import CountdownSim, RecordingSink

from envs.controllers import (
    CARTPOLE_SUCCESS_STEPS,
    INVERTED_PENDULUM_SUCCESS_RETURN,
    PENDULUM_SUCCESS_RETURN,
)
from hud_pipelines.agent.builtin import FunctionPolicy, scripted_policy
from hud_pipelines.agent.episodes import non_finite_action
from hud_pipelines.agent.policy import PolicyBatch
from hud_pipelines.agent.runner import EpisodeKeys, RobotAgent
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.process import SimProcess


class SlotEcho:
    """Returns chunks of ``length`` actions ``slot * 1000 + call * 10 + t`` and logs which slots it saw."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.calls: list[list[int]] = []
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
        slots = batch.observation["state"][:, 0].astype(int).tolist()
        call = len(self.calls)
        self.calls.append(slots)
        t = np.arange(self.length, dtype=np.float32)
        rows = [slot * 1000 + call * 10 + t for slot in slots]
        return np.stack(rows)[:, :, None].astype(np.float32)


def run(sim: CountdownSim, policy: Any, sink: RecordingSink | None = None, **agent_args: Any) -> Any:
    agent = RobotAgent(policy, sim.contract, **{k: v for k, v in agent_args.items() if k != "max_steps"})
    outcomes = agent.run(
        sim,
        [{"seed": i} for i in range(sim.num_envs)],
        max_steps=agent_args.get("max_steps", 100),
        key=EpisodeKeys("job"),
        sinks=[sink] if sink is not None else [],
    )
    return agent, outcomes


def test_refill_asks_only_for_spent_slots_and_adapts_each_chunk_against_its_slot() -> None:
    sim = CountdownSim([12, 12, 12])
    keep = {0: 1, 1: 2, 2: 3}  # slot s executes s + 1 actions per chunk
    seen: list[tuple[int, float]] = []

    def adapt_chunk(chunk: npt.NDArray[np.float32], observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        slot = int(observation["state"][0])
        seen.append((slot, float(observation["state"][1])))
        assert np.all(chunk // 1000 == slot), "a slot was handed another slot's chunk"
        return chunk[: keep[slot]] + 0.5

    policy = SlotEcho(length=4)
    agent, _ = run(sim, policy, adapt_chunk=adapt_chunk, max_steps=12)
    expected_rows = [[s for s in range(3) if tick % (s + 1) == 0] for tick in range(12)]
    assert policy.calls == expected_rows
    assert agent.last_run.infer.count == 12
    assert agent.last_run.infer.rows_each == [len(r) for r in expected_rows]
    # adapt_chunk ran once per refilled slot, against that slot's observation at that tick
    assert seen == [(s, float(tick)) for tick, rows in enumerate(expected_rows) for s in rows]
    applied = np.stack(sim.actions)[:, :, 0]
    assert np.all(applied % 1 == 0.5), "every applied action went through adapt_chunk"
    assert np.all(applied[:, 2] // 1000 == 2)


def test_one_forward_per_refill_tick_and_horizon_cuts_chunks() -> None:
    sim = CountdownSim([10, 10, 10, 10])
    policy = SlotEcho(length=8)
    agent, _ = run(sim, policy, horizon=3, max_steps=10)
    assert agent.last_run.infer.count == 4  # ticks 0, 3, 6, 9
    assert policy.calls == [[0, 1, 2, 3]] * 4
    applied = np.stack(sim.actions)[:, 0, 0]
    assert applied.tolist() == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30]


def test_finished_slots_record_nothing_and_receive_a_hold_row(sink: RecordingSink) -> None:
    sim = CountdownSim([2, 5, 9], succeed=(1,), reports=(1, 2))
    policy = SlotEcho(length=2)
    agent, outcomes = run(sim, policy, sink, max_steps=50)
    by_slot = sink.by_slot()
    for slot, length in enumerate([2, 5, 9]):
        trace = by_slot[slot]
        assert [f.index for f in sink.frames[trace]] == list(range(length))
        assert all(r.step < length for r in sink.inferences[trace])
        assert [r.step for r in sink.inferences[trace]] == list(range(0, length, 2))
        assert outcomes[slot].steps == length
    assert [o.status for o in outcomes] == [EpisodeStatus.FAILED, EpisodeStatus.SUCCEEDED, EpisodeStatus.FAILED]
    assert all(0 not in rows for rows in policy.calls[1:]), "slot 0 finished at tick 2 and was asked again"
    assert agent.last_run.ticks == 9
    assert agent.last_run.env_steps == 2 + 5 + 9
    # slot 0 stops changing its row once done: the sim sees its last action repeated
    applied = np.stack(sim.actions)[:, 0, 0]
    assert np.all(applied[2:] == applied[1])
    # slot 0's env gives no success signal (scored by its return), slot 2's does (scored by its failure)
    assert [o.score for o in outcomes] == [2.0, 1.0, 0.0]


def test_max_steps_ends_running_slots_as_truncated_failures(sink: RecordingSink) -> None:
    sim = CountdownSim([3, 100, 100])
    _, outcomes = run(sim, SlotEcho(length=5), sink, max_steps=10)
    assert outcomes[0].status is EpisodeStatus.FAILED
    assert outcomes[0].terminated
    assert not outcomes[0].truncated
    for outcome in outcomes[1:]:
        assert outcome.status is EpisodeStatus.FAILED
        assert outcome.truncated
        assert not outcome.terminated
        assert outcome.steps == 10
    assert len(sink.ended) == 3
    for trace, frames in sink.frames.items():  # the dataset's next.done: every episode's last frame ends it
        assert [frame.done for frame in frames] == [False] * (len(frames) - 1) + [True], trace
    cut = [frames[-1] for frames in sink.frames.values() if len(frames) == 10]
    assert len(cut) == 2
    assert all(frame.truncated and not frame.terminated for frame in cut), "cut off by max_steps, as TimeLimit says"


def test_a_sim_crash_errors_the_running_slots_and_keeps_finished_ones(sink: RecordingSink) -> None:
    sim = CountdownSim([2, 10, 10], succeed=(0,), crash_at=5)
    _, outcomes = run(sim, SlotEcho(length=1), sink, max_steps=50)
    assert outcomes[0].status is EpisodeStatus.SUCCEEDED
    for outcome in outcomes[1:]:
        assert outcome.status is EpisodeStatus.ERRORED
        assert outcome.error is not None
        assert "SimCrashedError" in outcome.error
        assert outcome.steps == 4
    assert set(sink.ended) == set(sink.begun)


def test_an_env_that_raised_in_a_reset_as_a_whole_is_said_in_its_words_as_at_a_step(sink: RecordingSink) -> None:
    """Before, "reset failed: sim error during reset: ..." and the sim's whole traceback: the words a step's fault,
    and a sharded sim's child that raised beside children that answered, give without them."""
    from hud_pipelines.errors import Fault, RemoteError

    class ResetRaises(CountdownSim):
        def reset(self, tasks: list[dict[str, Any]]) -> Any:
            said = "env.reset raised KeyError: 'difficulty'"
            raise RemoteError(said, phase="reset", remote_traceback="Traceback ...\nKeyError", cause="env")

    _, outcomes = run(ResetRaises([5, 5]), SlotEcho(length=1), sink, max_steps=10)
    assert [(o.error, o.fault) for o in outcomes] == [("env.reset raised KeyError: 'difficulty'", Fault.ENV)] * 2


def test_a_slot_error_in_the_observation_errors_only_that_slot(sink: RecordingSink) -> None:
    sim = CountdownSim([6, 6, 6], slot_errors={3: [1]})
    _, outcomes = run(sim, SlotEcho(length=1), sink, max_steps=50)
    assert outcomes[1].status is EpisodeStatus.ERRORED
    assert outcomes[1].error == "slot 1 broke"
    assert [outcomes[0].steps, outcomes[2].steps] == [6, 6]
    assert len(sink.frames[sink.by_slot()[1]]) == 2, "the errored step is not recorded as a frame"


def test_adapt_action_sees_each_slots_observation_every_step() -> None:
    sim = CountdownSim([3, 5])
    seen: list[tuple[int, int]] = []

    def adapt_action(action: npt.NDArray[np.float32], observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        slot, step = (int(v) for v in observation["state"])
        seen.append((slot, step))
        return action + 100 * slot + step

    run(sim, SlotEcho(length=10), adapt_action=adapt_action, max_steps=10)
    assert seen == [(s, t) for t in range(5) for s in (0, 1) if t < [3, 5][s]]
    applied = np.stack(sim.actions)[:, :, 0]
    assert applied[:, 1].tolist() == [1000 + 100 + t + t for t in range(5)]


def test_a_policy_failure_errors_the_running_slots() -> None:
    calls = 0

    def flaky(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("the model ran out of memory")
        return np.zeros((observation["state"].shape[0], 1), dtype=np.float32)

    sim = CountdownSim([1, 10])
    _, outcomes = run(sim, FunctionPolicy(flaky, sim.contract), max_steps=50)
    assert outcomes[0].status is EpisodeStatus.FAILED
    assert outcomes[1].status is EpisodeStatus.ERRORED
    assert outcomes[1].error is not None
    assert "the model ran out of memory" in outcomes[1].error


class RefusesSlot:
    """Raises whenever ``refused``'s row is in the forward (its message names the slot), else gives each slot
    two actions ``slot + step / 10``; keeps every forward's rows and their random streams."""

    def __init__(self, refused: int) -> None:
        self.refused = refused
        self.forwards: list[dict[int, tuple[int, ...]]] = []

    def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
        state = batch.observation["state"]
        self.forwards.append(dict(zip(state[:, 0].astype(int).tolist(), batch.streams or [], strict=True)))
        if self.refused in self.forwards[-1]:
            raise ValueError(f"cannot act for slot {self.refused}")
        return (state[:, 0] + state[:, 1] / 10)[:, None, None].repeat(2, axis=1).astype(np.float32)


def test_a_policy_that_raises_on_one_row_ends_that_slot_alone_and_the_others_act_as_they_would_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A forward that raised used to end every running slot (and a seed's verdict depended on ``num_envs``)."""
    sim = CountdownSim([5, 5, 5])
    policy = RefusesSlot(refused=1)
    with caplog.at_level("ERROR"):
        _, outcomes = run(sim, policy, max_steps=50)
    assert [o.status for o in outcomes] == [EpisodeStatus.FAILED, EpisodeStatus.ERRORED, EpisodeStatus.FAILED]
    assert outcomes[1].error is not None
    assert "policy failed: ValueError: cannot act for slot 1" in outcomes[1].error
    assert [o.steps for o in outcomes] == [5, 0, 5]
    applied = np.stack(sim.actions)[:, :, 0]
    alone = CountdownSim([5])
    run(alone, RefusesSlot(refused=1), max_steps=50)
    np.testing.assert_array_equal(applied[:, 0], np.stack(alone.actions)[:, 0, 0])
    # the failed forward of all three rows, then each row alone with the random stream it had there
    stacked, *apart = policy.forwards[:4]
    assert list(stacked) == [0, 1, 2]
    assert apart == [{slot: stacked[slot]} for slot in (0, 1, 2)]
    assert [r.getMessage() for r in caplog.records if "policy failed" in r.getMessage()] == [
        f"{outcomes[1].error}, for slots [1]"
    ]


def test_a_policy_that_calls_sys_exit_errors_its_slots_as_the_policys_fault() -> None:
    """``sys.exit()`` in a policy's code (a script's habit) went past the loop: the instance was recorded as
    ``interrupted``, as if the run had been stopped, and nothing named the policy."""

    def exits(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        raise SystemExit(3)

    sim = CountdownSim([4, 4])
    _, outcomes = run(sim, FunctionPolicy(exits, sim.contract), max_steps=5)
    assert [o.status for o in outcomes] == [EpisodeStatus.ERRORED] * 2
    assert all("policy failed: SystemExit: 3" in (o.error or "") for o in outcomes)

    class WorkerShutdown(SystemExit):  # as Celery stops its worker: raised in the main thread, mid-forward
        pass

    def stopped(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        raise WorkerShutdown(0)

    with pytest.raises(WorkerShutdown):
        run(CountdownSim([4]), FunctionPolicy(stopped, sim.contract), max_steps=5)


def test_a_chunk_that_adapt_chunk_refuses_ends_that_slot_alone() -> None:
    def refuse_slot_1(chunk: npt.NDArray[np.float32], observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        if observation["state"][0] == 1:
            raise ValueError("no target for this slot")
        return chunk

    sim = CountdownSim([3, 3])
    _, outcomes = run(sim, SlotEcho(length=2), adapt_chunk=refuse_slot_1, max_steps=50)
    assert [o.status for o in outcomes] == [EpisodeStatus.FAILED, EpisodeStatus.ERRORED]
    assert outcomes[1].error == "adapt_chunk raised ValueError: no target for this slot"


def test_a_non_finite_action_names_the_step_it_was_for_and_errors_only_its_slot() -> None:
    """A chunk of 4 whose third action is NaN was said to be "at step 0", the chunk's first, counted from 0."""

    def chunk(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        actions = np.zeros((observation["state"].shape[0], 4, 1), dtype=np.float32)
        actions[1:, 2] = np.nan  # slot 1's, while it runs
        return actions

    sim = CountdownSim([10, 10])
    _, outcomes = run(sim, FunctionPolicy(chunk, sim.contract), max_steps=50)
    assert outcomes[0].status is not EpisodeStatus.ERRORED
    assert outcomes[1].status is EpisodeStatus.ERRORED
    assert outcomes[1].error == "the policy returned a non-finite action for step 3: push = nan"


def test_a_non_finite_action_names_its_values_by_the_contracts_names() -> None:
    chunk = np.zeros((3, 7), dtype=np.float32)
    chunk[1, [0, 2, 3, 4, 6]] = [np.inf, np.nan, -np.inf, np.nan, np.nan]
    chunk[2, 5] = np.nan  # a later action's: the first bad one is named
    names = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
    assert non_finite_action(chunk, 10, names) == (
        "the policy returned a non-finite action for step 12: x = inf, z = nan, roll = -inf, pitch = nan"
        " and 1 more (5 of its 7 values)"
    )
    assert non_finite_action(chunk[2:], 0, None) == (
        "the policy returned a non-finite action for step 1: action_5 = nan (1 of its 7 values)"
    )
    assert non_finite_action(chunk[2:], 0, names[:3]).endswith(": action_5 = nan (1 of its 7 values)")


def test_a_wrongly_shaped_chunk_is_an_error_naming_the_shape() -> None:
    forwards: list[int] = []

    def wrong(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        forwards.append(len(observation["state"]))
        return np.zeros((2, 3, 5), dtype=np.float32)

    sim = CountdownSim([4, 4])
    _, outcomes = run(sim, FunctionPolicy(wrong, sim.contract), max_steps=5)
    assert all(o.status is EpisodeStatus.ERRORED for o in outcomes)
    assert outcomes[0].error is not None
    assert "[2, 3, 5]" in outcomes[0].error
    assert forwards == [2], "the answer to the whole forward: its rows are not run again one by one"


def test_a_policy_that_raises_on_its_batch_but_on_no_row_alone_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Run row by row its episodes go on, at a forward per row: said, or the slowdown (or a batching bug) would
    go unseen."""

    def small_batches_only(observation: dict[str, Any]) -> npt.NDArray[np.float32]:
        if len(observation["state"]) > 1:
            raise MemoryError("out of memory for this batch")
        return np.zeros((1, 1), dtype=np.float32)

    sim = CountdownSim([3, 3])
    with caplog.at_level("ERROR"):
        _, outcomes = run(sim, FunctionPolicy(small_batches_only, sim.contract), max_steps=50)
    assert [o.status for o in outcomes] == [EpisodeStatus.FAILED, EpisodeStatus.FAILED]
    said = [r.getMessage() for r in caplog.records if "on none of them alone" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith("policy failed on a forward of 2 rows, on none of them alone (each was run apart): ")
    assert "MemoryError: out of memory for this batch" in said[0]


def test_policies_with_observation_history_see_the_last_steps() -> None:
    class History(SlotEcho):
        observation_steps = 3

        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            state = batch.observation["state"]
            assert state.shape[1:] == (3, 2)
            self.calls.append(state[:, :, 1].astype(int).tolist())
            return np.zeros((state.shape[0], 2, 1), dtype=np.float32)

    policy = History(length=2)
    run(CountdownSim([6, 6]), policy, max_steps=6)
    assert policy.calls[0] == [[0, 0, 0], [0, 0, 0]]  # the reset observation repeated
    assert policy.calls[1] == [[0, 1, 2], [0, 1, 2]]
    assert policy.calls[2] == [[2, 3, 4], [2, 3, 4]]


def test_keys_count_episodes_per_job_task_instance(sink: RecordingSink) -> None:
    sim = CountdownSim([1, 1])
    agent = RobotAgent(SlotEcho(length=1), sim.contract)
    for _ in range(2):
        agent.run(sim, [{"seed": 7}, {"seed": 8}], max_steps=5, key=("job", 3, 2), sinks=[sink])
    keys = sorted((k.episode, k.slot, k.seed, k.task, k.instance) for k in sink.keys.values())
    assert keys == [(0, 0, 7, 3, 2), (0, 1, 8, 3, 2), (1, 0, 7, 3, 2), (1, 1, 8, 3, 2)]
    assert set(sink.begun.values()) == {"count 1"}


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    sim = CountdownSim([1, 1])
    agent = RobotAgent(SlotEcho(length=1), sim.contract)
    with pytest.raises(ValueError, match="one task per slot"):
        agent.run(sim, [{}], max_steps=5, key=("job", 0, 0))
    with pytest.raises(ValueError, match="max_steps"):
        agent.run(sim, [{}, {}], max_steps=0, key=("job", 0, 0))
    with pytest.raises(ValueError, match="horizon"):
        RobotAgent(SlotEcho(length=1), sim.contract, horizon=0)


class _OldSink:
    """A sink of the per-slot protocol (``add`` / ``inference``), without the tick methods."""

    def begin(self, key: Any, prompt: str) -> None: ...

    def add(self, key: Any, frame: Any) -> None: ...

    def end(self, key: Any, outcome: Any) -> None: ...

    def close(self) -> None: ...


def test_a_sink_without_the_tick_methods_is_refused_before_anything_runs() -> None:
    sim = CountdownSim([1, 1])
    agent = RobotAgent(SlotEcho(length=1), sim.contract)
    with pytest.raises(
        TypeError, match=r"_OldSink is not an EpisodeSink: it has no add_frames, add_inferences.*PerSlotSink"
    ):
        agent.run(sim, [{}, {}], max_steps=5, key=("job", 0, 0), sinks=[_OldSink()])
    assert sim.status == ["idle", "idle"], "no reset was sent"


class _FailsOnSecondTick(RecordingSink):
    def add_frames(self, batch: Any) -> None:
        if batch.index[0] == 1:
            raise OSError("disk full (test)")
        super().add_frames(batch)


def test_a_sink_that_fails_mid_run_leaves_the_episodes_that_ended_on_that_tick_answered() -> None:
    sim = CountdownSim([2, 5], succeed=(0,))
    agent = RobotAgent(SlotEcho(length=1), sim.contract)
    sink = _FailsOnSecondTick()
    with pytest.raises(OSError, match="disk full"):
        agent.run(sim, [{}, {}], max_steps=10, key=EpisodeKeys("job"), sinks=[sink])
    ended = {sink.keys[trace].slot: outcome for trace, outcome in sink.ended.items()}
    assert ended[0].status is EpisodeStatus.SUCCEEDED, "it ended on the tick the sink failed"
    assert ended[0].steps == 2
    assert ended[1].status is EpisodeStatus.ERRORED, "the one still running is cut short"


# ---------------------------------------------------------------------------------------------
# real sims, scripted experts


def test_pd_balances_cartpole_for_the_whole_episode_in_every_slot() -> None:
    with GymBridge("CartPole-v1", 3) as bridge:
        policy = scripted_policy("envs.controllers:cartpole_pd", bridge.contract, base_dir=Path())
        agent = RobotAgent(policy, bridge.contract)
        outcomes = agent.run(bridge, [{"seed": s} for s in range(3)], max_steps=1000, key=("cartpole", 0, 0))
    for outcome in outcomes:
        assert outcome.steps == CARTPOLE_SUCCESS_STEPS
        assert outcome.truncated
        assert not outcome.terminated
        assert outcome.score == CARTPOLE_SUCCESS_STEPS
    assert agent.last_run.infer.count == CARTPOLE_SUCCESS_STEPS


def test_swing_up_beats_the_pendulum_return_threshold() -> None:
    with GymBridge("Pendulum-v1", 4) as bridge:
        policy = scripted_policy(
            "envs.controllers:PendulumSwingUp", bridge.contract, args={"kp": 12.0}, base_dir=Path()
        )
        outcomes = RobotAgent(policy, bridge.contract).run(
            bridge, [{"seed": s} for s in range(4)], max_steps=500, key=("pendulum", 0, 0)
        )
    for outcome in outcomes:
        assert outcome.steps == 200
        assert outcome.total_reward > PENDULUM_SUCCESS_RETURN
        assert outcome.score == pytest.approx(outcome.total_reward)


def test_a_random_policy_does_not_beat_the_pendulum_threshold() -> None:
    from hud_pipelines.agent.builtin import RandomPolicy

    with GymBridge("Pendulum-v1", 4) as bridge:
        outcomes = RobotAgent(RandomPolicy(bridge.contract, seed=1), bridge.contract).run(
            bridge, [{"seed": s} for s in range(4)], max_steps=500, key=("pendulum", 0, 0)
        )
    assert all(o.total_reward < PENDULUM_SUCCESS_RETURN for o in outcomes)


def test_pd_keeps_the_inverted_pendulum_up() -> None:
    with GymBridge("InvertedPendulum-v5", 2) as bridge:
        policy = scripted_policy("envs.controllers:inverted_pendulum_pd", bridge.contract, base_dir=Path())
        outcomes = RobotAgent(policy, bridge.contract).run(
            bridge, [{"seed": s} for s in range(2)], max_steps=1000, key=("ip", 0, 0)
        )
    assert all(o.total_reward >= INVERTED_PENDULUM_SUCCESS_RETURN for o in outcomes)


def test_the_same_loop_drives_a_served_sim(sink: RecordingSink) -> None:
    with SimProcess.spawn("CartPole-v1", num_envs=2) as process, process.connect() as client:
        policy = scripted_policy("envs.controllers:cartpole_pd", client.contract, base_dir=Path())
        outcomes = RobotAgent(policy, client.contract).run(
            client, [{"seed": 0}, {"seed": 1}], max_steps=600, key=("served", 0, 0), sinks=[sink]
        )
    assert [o.steps for o in outcomes] == [CARTPOLE_SUCCESS_STEPS] * 2
    assert [o.score for o in outcomes] == [float(CARTPOLE_SUCCESS_STEPS)] * 2
    assert all(len(frames) == CARTPOLE_SUCCESS_STEPS for frames in sink.frames.values())


def test_an_env_that_reports_its_failure_scores_zero_however_long_it_ran() -> None:
    factory = f"{Path(__file__).with_name('agent_helpers.py')}:never_succeeding_cartpole"
    with SimProcess.spawn(factory, num_envs=2) as process, process.connect() as client:
        policy = scripted_policy("envs.controllers:cartpole_pd", client.contract, base_dir=Path())
        outcomes = RobotAgent(policy, client.contract).run(
            client, [{"seed": 0}, {"seed": 1}], max_steps=600, key=("graded", 0, 0)
        )
        graded_by_the_sim = [slot["score"] for slot in client.result().slots]
    assert [o.total_reward for o in outcomes] == [float(CARTPOLE_SUCCESS_STEPS)] * 2
    assert [o.status for o in outcomes] == [EpisodeStatus.FAILED] * 2
    assert [o.score for o in outcomes] == [0.0, 0.0] == graded_by_the_sim


def test_the_policy_is_reset_only_when_an_episode_starts(sink: RecordingSink) -> None:
    """Before, a reset that left no slot running still reset the policy, and what that reset raised was said
    of no slot."""

    class NoSlotStarts(CountdownSim):
        def reset(self, tasks: list[dict[str, Any]]) -> Any:
            observation = super().reset(tasks)
            self.status = ["errored"] * self.num_envs
            return dataclasses.replace(observation, status=list(self.status))

    policy = SlotEcho(length=1)
    _, outcomes = run(NoSlotStarts([3, 3]), policy, sink, max_steps=10)
    assert [o.status for o in outcomes] == [EpisodeStatus.ERRORED] * 2
    assert (policy.resets, policy.calls) == (0, [])
    run(CountdownSim([3, 3]), policy, max_steps=10)
    assert policy.resets == 1
