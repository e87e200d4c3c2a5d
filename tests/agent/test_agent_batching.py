"""BatchedModel: concurrent callers share one forward; no window is waited when all are present.

"Does not wait" is proven without timing assertions: the window is 10 s and the test's own timeout
is far below what even one wasted window would cost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.agent.batching import BatchedModel
from hud_pipelines.agent.builtin import scripted_policy
from hud_pipelines.agent.policy import PolicyBatch
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.errors import PolicyError
from hud_pipelines.recording.events import EpisodeOutcome, EpisodeStatus
from hud_pipelines.sim.bridge import GymBridge

LONG_WINDOW_S = 10.0


class Doubler:
    """Returns ``2 * x`` for every row (one action, chunk of 1) and logs the rows of each forward."""

    def __init__(self) -> None:
        self.forwards: list[int] = []
        self.lock = threading.Lock()

    def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
        with self.lock:
            self.forwards.append(batch.size)
        x = batch.observation["x"]
        if np.any(x < 0):
            raise RuntimeError("negative input")
        return (2 * x).reshape(batch.size, 1, 1).astype(np.float32)


def rows(values: list[float]) -> PolicyBatch:
    return PolicyBatch(observation={"x": np.asarray(values, dtype=np.float32)[:, None]}, prompts=[""] * len(values))


def call_concurrently(model: BatchedModel, batches: list[PolicyBatch]) -> list[Any]:
    """Call ``infer`` from one thread per batch, all released together; returns results or exceptions."""
    results: list[Any] = [None] * len(batches)
    barrier = threading.Barrier(len(batches))

    def worker(index: int) -> None:
        barrier.wait()
        try:
            results[index] = model.infer(batches[index])
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.timeout(5)
def test_concurrent_callers_share_one_forward_and_get_their_own_rows() -> None:
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=4)
    batches = [rows([10 * k + 1, 10 * k + 2]) for k in range(4)]
    results = call_concurrently(model, batches)
    assert inner.forwards == [8]
    for k, result in enumerate(results):
        assert result[:, 0, 0].tolist() == [2 * (10 * k + 1), 2 * (10 * k + 2)]
    assert model.stats.timer_flushes == 0


@pytest.mark.timeout(10)
def test_lockstep_callers_never_wait_for_the_window() -> None:
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=3)
    rounds = 30
    barrier = threading.Barrier(3)

    def loop(k: int) -> None:
        for r in range(rounds):
            out = model.infer(rows([k + r]))
            assert out[0, 0, 0] == 2 * (k + r)
            barrier.wait()  # lockstep: nobody starts round r + 1 before all finished round r

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert inner.forwards == [3] * rounds
    assert model.stats.timer_flushes == 0


@pytest.mark.timeout(10)
def test_a_caller_that_leaves_is_not_waited_for() -> None:
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=2)
    done_early = threading.Event()

    def short() -> None:
        model.infer(rows([1.0]))
        model.leave()
        done_early.set()

    def long() -> None:
        model.infer(rows([2.0]))
        done_early.wait()
        for r in range(5):
            model.infer(rows([float(r)]))

    threads = [threading.Thread(target=short), threading.Thread(target=long)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert inner.forwards == [2, 1, 1, 1, 1, 1]
    assert model.expected_callers == 1
    assert model.stats.timer_flushes == 0


@pytest.mark.timeout(5)
def test_batch_size_flushes_before_the_window() -> None:
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, batch_size=4, expected_callers=10)
    results = call_concurrently(model, [rows([1.0, 2.0]), rows([3.0, 4.0])])
    assert inner.forwards == [4]
    assert [r[:, 0, 0].tolist() for r in results] == [[2.0, 4.0], [6.0, 8.0]]


@pytest.mark.timeout(5)
def test_the_window_flushes_when_a_caller_does_not_come() -> None:
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=0.05, expected_callers=2)
    assert model.infer(rows([3.0]))[0, 0, 0] == 6.0
    assert model.stats.timer_flushes == 1


@pytest.mark.timeout(5)
def test_an_exception_fails_only_the_caller_whose_rows_raised() -> None:
    """The forward stacking the rows that raise is run again per caller: the caller stacked with them gets its
    rows (it failed with them before), and a forward of other callers is not touched."""
    inner = Doubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, batch_size=2, expected_callers=4)
    results = call_concurrently(model, [rows([1.0]), rows([-1.0]), rows([3.0]), rows([4.0])])
    assert sorted(inner.forwards) == [1, 1, 2, 2], "two stacked forwards, then the one that raised, per caller"
    assert isinstance(results[1], RuntimeError)
    assert "negative input" in str(results[1])
    assert [float(r[0, 0, 0]) for i, r in enumerate(results) if i != 1] == [2.0, 6.0, 8.0]
    model.expected_callers = 1
    assert model.infer(rows([5.0]))[0, 0, 0] == 10.0, "the model keeps serving after a failed batch"


@pytest.mark.timeout(20)
def test_each_caller_of_a_stacked_forward_that_raised_is_forwarded_on_its_own_with_its_own_deadline() -> None:
    """The callers' rows were run again inside the stacked forward's worker call: all three had to finish within
    one forward_timeout_s (every caller failed as timed out), and the retries ran on after the worker was
    replaced, overlapping the next forwards."""

    class Slow(Doubler):
        active = peak = 0

        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            try:
                time.sleep(0.3)
                return super().infer(batch)
            finally:
                with self.lock:
                    self.active -= 1

    inner = Slow()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=3, forward_timeout_s=0.5)
    results = call_concurrently(model, [rows([1.0]), rows([-1.0]), rows([3.0])])
    assert isinstance(results[1], RuntimeError)
    assert [float(results[i][0, 0, 0]) for i in (0, 2)] == [2.0, 6.0]
    assert inner.forwards == [3, 1, 1, 1], "the stacked forward, then each caller's alone"
    assert inner.peak == 1, "forwards never overlap"


def test_a_deadline_in_a_stacked_forward_fails_every_caller_in_it_without_running_it_again() -> None:
    """What is not the rows' doing (a remote policy's lost server, a deadline) would fail each caller again."""
    from hud_pipelines.errors import PolicyLinkError

    class ServerGone:
        forwards = 0

        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            self.forwards += 1
            raise PolicyLinkError("the policy server went away")

    inner = ServerGone()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=2)
    results = call_concurrently(model, [rows([1.0]), rows([2.0])])
    assert [type(r) for r in results] == [PolicyLinkError, PolicyLinkError]
    assert inner.forwards == 1


def test_a_policy_returning_the_wrong_row_count_fails_its_callers() -> None:
    class Short:
        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            return np.zeros((batch.size - 1, 1, 1), dtype=np.float32)

    with pytest.raises(PolicyError, match="stacked rows"):
        BatchedModel(Short()).infer(rows([1.0, 2.0]))


def test_a_policy_answering_with_no_array_of_numbers_is_told_the_shape_it_owes() -> None:
    """The batched path took numpy's words alone ("could not convert string to float"), naming neither."""

    class Words:
        def infer(self, batch: PolicyBatch) -> Any:
            return [["left"] for _ in range(batch.size)]

    with pytest.raises(PolicyError, match=r"the batched policy returned a list that is no array of numbers .*"):
        BatchedModel(Words()).infer(rows([1.0, 2.0]))
    with pytest.raises(PolicyError, match=r"; expected \[2, T, A\] for 2 rows$"):
        BatchedModel(Words()).infer(rows([1.0, 2.0]))


def test_an_answer_one_callers_row_made_ragged_fails_that_caller_alone() -> None:
    """Refused as a shape error, it failed every caller stacked with the row that broke it."""

    class RowWise:
        def infer(self, batch: PolicyBatch) -> Any:
            values = batch.observation["x"][:, 0].tolist()
            return [[2 * v] if v >= 0 else [v, v] for v in values]  # a negative row's answer is two wide

    model = BatchedModel(RowWise(), max_wait_s=LONG_WINDOW_S, expected_callers=2)
    fine, ragged = call_concurrently(model, [rows([1.0]), rows([-1.0])])
    assert fine.tolist() == [[2.0]], "its own rows, run on their own"
    assert ragged.tolist() == [[-1.0, -1.0]], "the bad row's caller gets its own answer, for its shape check"


@pytest.mark.timeout(60)
def test_k_sims_share_one_forward_per_tick_through_robot_agents() -> None:
    """Three Pendulum sims of two slots each, one agent thread per sim: one 6-row forward per tick."""
    k, num_envs, steps = 3, 2, 200
    bridges = [GymBridge("Pendulum-v1", num_envs) for _ in range(k)]
    for bridge in bridges:
        bridge.start()
    contract = bridges[0].contract
    counting = Doubler()
    swing_up = scripted_policy("envs.controllers:pendulum_swing_up", contract, base_dir=Path())

    class Counted:
        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            with counting.lock:
                counting.forwards.append(batch.size)
            return swing_up.infer(batch)

    model = BatchedModel(Counted(), max_wait_s=LONG_WINDOW_S, expected_callers=k)
    outcomes: list[list[EpisodeOutcome]] = [[] for _ in range(k)]
    agents = [RobotAgent(model, contract) for _ in range(k)]

    def drive(index: int) -> None:
        try:
            tasks = [{"seed": 100 * index + s} for s in range(num_envs)]
            outcomes[index] = agents[index].run(bridges[index], tasks, max_steps=500, key=("shared", 0, index))
        finally:
            model.leave()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(k)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for bridge in bridges:
            bridge.close()
    assert counting.forwards == [k * num_envs] * steps
    assert model.stats.timer_flushes == 0
    assert all(agent.last_run.infer.count == steps for agent in agents)
    assert all(o.status is EpisodeStatus.FAILED and o.steps == steps for run in outcomes for o in run)


def test_batching_settings_come_from_the_agent_config() -> None:
    from hud_pipelines.spec.agent import BatchingConfig

    model = BatchedModel.from_config(Doubler(), BatchingConfig(max_wait_ms=20.0, batch_size=6), expected_callers=3)
    assert (model.max_wait_s, model.batch_size, model.expected_callers) == (0.02, 6, 3)


class LockstepDoubler(Doubler):
    """A ``Doubler`` that logs, per forward, how many idle sims ``lockstep`` announced (0: not entered)."""

    def __init__(self) -> None:
        super().__init__()
        self.idle: list[int] = []
        self.current = 0

    @contextlib.contextmanager
    def lockstep(self, idle_sims: int) -> Generator[None]:
        self.current = idle_sims
        try:
            yield
        finally:
            self.current = 0

    def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
        self.idle.append(self.current)
        return super().infer(batch)


@pytest.mark.timeout(5)
def test_only_a_forward_every_caller_waits_on_is_a_lockstep_forward() -> None:
    inner = LockstepDoubler()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=3)
    call_concurrently(model, [rows([1.0]), rows([2.0]), rows([3.0])])
    capped = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, batch_size=2, expected_callers=10)
    call_concurrently(capped, [rows([1.0, 2.0])])  # flushed by batch_size while callers are away
    windowed = BatchedModel(inner, max_wait_s=0.01, expected_callers=2)
    windowed.infer(rows([1.0]))  # flushed by the window
    assert inner.forwards == [3, 2, 1]
    assert inner.idle == [3, 0, 0]
    assert [m.stats.lockstep_forwards for m in (model, capped, windowed)] == [1, 0, 0]


@pytest.mark.timeout(5)
def test_episode_ids_travel_with_their_rows_through_stacking() -> None:
    class Echo:
        def __init__(self) -> None:
            self.seen: list[list[str] | None] = []

        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            self.seen.append(batch.episodes)
            return np.zeros((batch.size, 1, 1), dtype=np.float32)

    inner = Echo()
    model = BatchedModel(inner, max_wait_s=LONG_WINDOW_S, expected_callers=2)
    named = [
        PolicyBatch(observation={"x": np.zeros((2, 1))}, prompts=["", ""], episodes=["a/1", "b/1"]),
        PolicyBatch(observation={"x": np.zeros((1, 1))}, prompts=[""], episodes=["c/2"]),
    ]
    call_concurrently(model, named)
    assert inner.seen[0] is not None
    assert sorted(inner.seen[0]) == ["a/1", "b/1", "c/2"]
    stacked = PolicyBatch.concat(named)
    assert stacked.episodes == ["a/1", "b/1", "c/2"]
    assert stacked.rows([2, 0]).episodes == ["c/2", "a/1"]
    assert PolicyBatch.concat([named[0], rows([1.0])]).episodes is None, "ids only when every part has them"
    with pytest.raises(PolicyError, match="1 episode ids for 2 rows"):
        PolicyBatch(observation={"x": np.zeros((2, 1))}, prompts=["", ""], episodes=["a/1"])


def test_a_forward_past_its_deadline_fails_its_callers_only_and_later_forwards_still_run() -> None:
    import threading

    from hud_pipelines.errors import PolicyTimeoutError

    release = threading.Event()

    class Stuck:
        def infer(self, batch: PolicyBatch) -> np.ndarray:
            if batch.prompts == ["stuck"]:
                release.wait(60)
            return np.zeros((batch.size, 1, 1), dtype=np.float32)

    model = BatchedModel(Stuck(), expected_callers=2, forward_timeout_s=0.5, across_callers=False)
    observation = {"state": np.zeros((1, 1), dtype=np.float32)}
    try:
        with pytest.raises(PolicyTimeoutError, match=r"forward_timeout_s=0\.5"):
            model.infer(PolicyBatch(observation=observation, prompts=["stuck"]))
        answered = model.infer(PolicyBatch(observation=observation, prompts=["fine"]))  # not queued behind it
        assert answered.shape == (1, 1, 1)
    finally:
        release.set()


def test_every_caller_of_a_shared_forward_that_hangs_gets_the_timeout_or_the_abort() -> None:
    """Two callers in one forward: each is given up on by its own deadline, or by the run's abort, with the
    error that says so (a caller looked for among the others compared their arrays and failed with a
    ValueError, so its episodes errored as the policy's fault)."""
    from concurrent.futures import ThreadPoolExecutor

    from hud_pipelines.errors import PolicyTimeoutError, RunAborted

    release = threading.Event()

    class Stuck:
        def infer(self, batch: PolicyBatch) -> np.ndarray:
            release.wait(60)
            return np.zeros((batch.size, 1, 1), dtype=np.float32)

    def callers(model: BatchedModel, then: Callable[[], None] = lambda: None) -> list[BaseException | None]:
        with ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(model.infer, rows([float(i), float(i + 1)])) for i in range(2)]
            then()
            return [call.exception(timeout=30) for call in calls]

    try:
        timed = BatchedModel(Stuck(), expected_callers=2, forward_timeout_s=0.5, max_wait_s=LONG_WINDOW_S)
        assert [type(e) for e in callers(timed)] == [PolicyTimeoutError, PolicyTimeoutError]
        aborted = BatchedModel(Stuck(), expected_callers=2, max_wait_s=LONG_WINDOW_S)
        errors = callers(aborted, lambda: (time.sleep(0.5), aborted.abort("the run was interrupted")))
        assert [type(e) for e in errors] == [RunAborted, RunAborted]
    finally:
        release.set()


def forward_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hud-policy-forward")]


def test_a_closed_model_lets_its_forward_thread_and_its_policy_go() -> None:
    import gc
    import weakref

    before = set(forward_threads())
    policy = Doubler()
    gone = weakref.ref(policy)
    with BatchedModel(policy, max_wait_s=LONG_WINDOW_S) as model:
        assert model.infer(rows([1.0, 2.0])).tolist() == [[[2.0]], [[4.0]]]
        started = [t for t in forward_threads() if t not in before]
        assert len(started) == 1
    started[0].join(timeout=5)
    assert not started[0].is_alive(), "the forward thread outlived its model"
    del model, policy
    gc.collect()
    assert gone() is None, "something still holds the policy of a closed model"


def test_a_model_used_again_after_close_starts_a_new_forward_thread() -> None:
    model = BatchedModel(Doubler(), max_wait_s=LONG_WINDOW_S)
    model.infer(rows([1.0]))
    model.close()
    model.close()  # twice is harmless
    assert model.infer(rows([3.0])).tolist() == [[[6.0]]]
    model.close()


@pytest.mark.timeout(30)
def test_a_model_closed_while_a_forward_is_stuck_still_serves_later_calls() -> None:
    from hud_pipelines.errors import PolicyTimeoutError

    release = threading.Event()
    entered = threading.Event()

    class StuckOnce:
        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            if batch.prompts == ["stuck"]:
                entered.set()
                release.wait(60)
            return np.ones((batch.size, 1, 1), dtype=np.float32)

    model = BatchedModel(StuckOnce(), forward_timeout_s=0.5, across_callers=False)
    observation = {"state": np.zeros((1, 1), dtype=np.float32)}
    failures: list[BaseException] = []

    def call_the_stuck_forward() -> None:
        try:
            model.infer(PolicyBatch(observation=observation, prompts=["stuck"]))
        except PolicyTimeoutError as exc:
            failures.append(exc)

    caller = threading.Thread(target=call_the_stuck_forward)
    caller.start()
    try:
        assert entered.wait(10)
        model.close()  # its stop must end only the worker it was queued for
        caller.join(10)
        assert len(failures) == 1, "the stuck forward's caller got its timeout"
        for _ in range(3):  # the fresh worker serves every later call
            assert model.infer(PolicyBatch(observation=observation, prompts=["fine"])).tolist() == [[[1.0]]]
    finally:
        release.set()
        model.close()


class _Counting:
    """A stateful policy: counts the resets it gets."""

    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
        return np.zeros((batch.size, 1, 1), dtype=np.float32)


def test_the_inner_policy_is_reset_before_each_run_of_episodes_no_other_caller_is_in() -> None:
    inner = _Counting()
    shared = BatchedModel(inner, expected_callers=2)
    shared.reset()
    assert inner.resets == 1, "before the first run of episodes"
    shared.reset()
    assert inner.resets == 1, "another caller's episodes may be under way: their state is not cleared"
    shared.leave()
    shared.reset()
    assert inner.resets == 2, "one caller left: before each of its runs"
    alone = _Counting()
    model = BatchedModel(alone)
    for _ in range(3):
        model.reset()
    assert alone.resets == 3


def test_a_late_forward_is_abandoned_through_a_users_policy_abandon_member() -> None:
    """A user's policy object with ``abandon()`` hears of the forward given up on, as the built-in kinds do."""
    from hud_pipelines.errors import PolicyTimeoutError

    class Cancellable:
        def __init__(self) -> None:
            self.cut = threading.Event()

        def infer(self, batch: PolicyBatch) -> npt.NDArray[np.float32]:
            if not self.cut.wait(timeout=30):  # waits on a server that never answers, until told to stop
                raise AssertionError("never abandoned")
            return np.zeros((len(batch.prompts), 1, 1), np.float32)

        def abandon(self) -> None:
            self.cut.set()

    policy = Cancellable()
    with BatchedModel(policy, forward_timeout_s=0.3, max_wait_s=0.0) as model:
        batch = PolicyBatch(observation={"state": np.zeros((1, 2), np.float32)}, prompts=[""])
        with pytest.raises(PolicyTimeoutError):
            model.infer(batch)
    assert policy.cut.is_set()
