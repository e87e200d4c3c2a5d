"""The sans-I/O slot lifecycle, fed plain arrays: no late joiners, no post-done leaks, sticky success."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.errors import SlotStateError
from hud_pipelines.sim.slots import SlotBatch, SlotState

NO_SIGNAL = -1


def tick(
    batch: SlotBatch,
    reward: list[float],
    terminated: list[bool],
    truncated: list[bool] | None = None,
    success: list[int] | None = None,
) -> npt.NDArray[np.bool_]:
    n = len(batch)
    return batch.record_step(
        np.asarray(reward, dtype=np.float64),
        np.asarray(terminated, dtype=np.bool_),
        np.asarray(truncated or [False] * n, dtype=np.bool_),
        np.asarray(success or [NO_SIGNAL] * n, dtype=np.int8),
    )


def test_slots_start_idle_and_cannot_step_before_a_reset() -> None:
    batch = SlotBatch(3)
    assert batch.states == [SlotState.IDLE] * 3
    with pytest.raises(SlotStateError, match="no slot is running \\(slot states: idle\\); reset first"):
        batch.require_running()
    with pytest.raises(ValueError, match="num_slots must be >= 1"):
        SlotBatch(0)


def test_a_reset_starts_every_slot_together_and_admits_no_late_joiner() -> None:
    batch = SlotBatch(3)
    with pytest.raises(SlotStateError, match="must start all 3 slots together, got 2 tasks"):
        batch.begin([1, 2])
    batch.begin([1, 2, 3])
    assert batch.states == [SlotState.RUNNING] * 3
    assert [r.seed for r in batch.records] == [1, 2, 3]
    assert [r.episode for r in batch.records] == [0, 0, 0]
    tick(batch, [1, 1, 1], [False] * 3)
    with pytest.raises(SlotStateError, match="must start all 3 slots together, got 1 tasks"):
        batch.begin([9])  # joining one slot into a batch that already stepped is impossible
    assert all(r.steps == 1 for r in batch.records)


def test_only_running_slots_accumulate_and_finished_slots_are_frozen() -> None:
    batch = SlotBatch(3)
    batch.begin([0, 1, 2])
    counted = tick(batch, [1.0, 2.0, 3.0], [False, True, False], [False, False, True])
    assert counted.tolist() == [True, True, True]
    assert batch.states == [SlotState.RUNNING, SlotState.DONE, SlotState.DONE]
    # after done: hold actions and vector-env autoreset data (here a huge reward and flags) must not leak
    counted = tick(batch, [1.0, 1000.0, 1000.0], [True, False, False], [False, True, False], [NO_SIGNAL, 1, 1])
    assert counted.tolist() == [True, False, False]
    records = batch.records
    assert [r.total_reward for r in records] == [2.0, 2.0, 3.0]
    assert [r.steps for r in records] == [2, 1, 1]
    assert [(r.terminated, r.truncated) for r in records] == [(True, False), (True, False), (False, True)]
    assert [r.success for r in records] == [False, False, False]
    with pytest.raises(SlotStateError, match="no slot is running \\(slot states: done\\)"):
        batch.require_running()


def test_success_is_sticky_within_an_episode_and_reset_by_the_next() -> None:
    batch = SlotBatch(2)
    batch.begin([0, 1])
    tick(batch, [0, 0], [False, False], success=[1, 0])
    tick(batch, [0, 0], [False, False], success=[0, NO_SIGNAL])
    records = batch.records
    assert [r.success for r in records] == [True, False]
    assert [r.success_reported for r in records] == [True, True]
    assert [r.score for r in records] == [1.0, 0.0]
    batch.begin([0, 1])
    assert [r.success for r in batch.records] == [False, False]
    assert [r.episode for r in batch.records] == [1, 1]


def test_success_now_is_the_latest_steps_signal_and_freezes_when_the_episode_ends() -> None:
    batch = SlotBatch(3)
    batch.begin([0, 1, 2])
    tick(batch, [0, 0, 0], [False, False, False], success=[1, 1, NO_SIGNAL])
    assert batch.ends()["success_now"].tolist() == [True, True, False]
    tick(batch, [0, 0, 0], [True, False, False], success=[0, NO_SIGNAL, 1])
    assert batch.ends()["success_now"].tolist() == [False, False, True]  # a step with no signal is not a success
    assert batch.ends()["success"].tolist() == [True, True, True]  # sticky: success at any step
    tick(batch, [0, 0, 0], [True, True, True], success=[1, 1, 1])
    assert batch.ends()["success_now"].tolist() == [False, True, True]  # slot 0 ended: a hold step changes nothing
    assert [r.success_now for r in batch.records] == [False, True, True]
    assert [s["success_at_end"] for s in batch.result()["slots"]] == [False, True, True]
    batch.begin([0, 1, 2])
    assert batch.ends()["success_now"].tolist() == [False, False, False]


def test_score_is_the_return_when_the_env_reports_no_success() -> None:
    batch = SlotBatch(1)
    batch.begin([None])
    tick(batch, [2.5], [False])
    tick(batch, [-1.0], [True])
    result = batch.result()
    assert result["score"] == 1.5
    assert result["success"] is False
    assert result["slots"][0] == {
        "slot": 0,
        "episode": 0,
        "seed": None,
        "status": "done",
        "score": 1.5,
        "success": False,
        "success_at_end": False,
        "total_reward": 1.5,
        "steps": 2,
        "terminated": True,
        "truncated": False,
        "nonfinite_steps": 0,
        "error": None,
    }


def test_failures_are_errored_never_failed_and_only_from_running() -> None:
    batch = SlotBatch(3)
    batch.begin([0, 1, 2])
    tick(batch, [1, 1, 1], [False, False, True])
    batch.fail(0, "env.step raised ZeroDivisionError")
    with pytest.raises(SlotStateError, match="slot 0 is errored, only a running slot can fail"):
        batch.fail(0, "again")
    with pytest.raises(SlotStateError, match="slot 2 is done"):
        batch.fail(2, "too late")
    assert batch.fail_running("client disconnected") == [1]
    result = batch.result()
    assert [s["status"] for s in result["slots"]] == ["errored", "errored", "done"]
    assert [s["error"] for s in result["slots"]] == ["env.step raised ZeroDivisionError", "client disconnected", None]
    assert result["success"] is False


def test_a_tick_can_be_narrowed_to_the_slots_that_produced_data() -> None:
    batch = SlotBatch(2)
    batch.begin([0, 1])
    counted = batch.record_step(
        np.array([1.0, 1.0]),
        np.array([False, False]),
        np.array([False, False]),
        np.array([NO_SIGNAL, NO_SIGNAL], dtype=np.int8),
        stepped=np.array([True, False]),
    )
    assert counted.tolist() == [True, False]
    assert [r.steps for r in batch.records] == [1, 0]


def test_nonfinite_observations_are_counted_per_slot() -> None:
    batch = SlotBatch(2)
    batch.begin([0, 1])
    batch.flag_nonfinite(np.array([False, True]))
    batch.flag_nonfinite(np.array([False, True]))
    assert [r.nonfinite_steps for r in batch.records] == [0, 2]
