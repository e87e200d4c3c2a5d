"""GymBridge in-process on real sims: the same trajectories as plain gymnasium, N = 1 and N > 1.

Every env kind runs through the bridge and through a plain gymnasium loop (single envs, or the
same vector env) with the same seeds and actions; the observations must be bit-identical and the
rewards and done flags identical. The served counterpart is ``test_served.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pytest

from envs.faulty import FaultyEnv
from envs.vectorized import PointMassVectorEnv, point_mass
from hud_pipelines.contract import action_feature
from hud_pipelines.errors import ActionError, ContractError, EnvFault, SlotStateError, TaskArgumentError
from hud_pipelines.sim.actions import ActionAdapter, BoundsMode, HoldMode
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.sim.envs import ProbeReset, ReplicatedEnvs, SlotEnvs, VectorEnvs
from hud_pipelines.sim.factory import resolve_factory
from hud_pipelines.sim.slots import SlotState
from hud_pipelines.sim.step_values import success_of, vector_success
from tests.conftest import (
    FAULTY,
    POINT_MASS,
    PROBE,
    Array,
    action_frames,
    assert_same_trajectory,
    driven,
    plain_single_envs,
    plain_vector_env,
)
from tests.seeding import FIRST, SEEDS, assert_honest_seeds
from tests.sim.probe_sims import NeedsOptions

NEEDS_OPTIONS = "tests.sim.probe_sims:needs_options"
NEEDS_OPTIONS_VECTOR = "tests.sim.probe_sims:needs_options_vector"

PUSHT = "gym_pusht/PushT-v0"
PUSHT_ARGS = {"obs_type": "pixels_agent_pos", "max_episode_steps": 12}


@dataclass(frozen=True)
class Case:
    """One env kind at one batch size, and how to build the plain gymnasium reference."""

    factory: str
    num_envs: int
    build_args: dict[str, Any] = field(default_factory=dict[str, Any])
    steps: int = 40
    reference: str = "single"
    """``single``: N envs from ``gym.make``; ``vector``: ``gym.make_vec`` (same mode); ``native``: the factory."""
    shared_seed: bool = False
    """Every slot asks for the same seed (a vector env that takes one seed for the batch)."""

    @property
    def id(self) -> str:
        return f"{self.factory.rsplit('/', 1)[-1]}-N{self.num_envs}"

    def seeds(self) -> list[int]:
        return [100 if self.shared_seed else 100 + slot for slot in range(self.num_envs)]

    def expected(self, frames: list[Array]) -> Any:
        seeds = self.seeds()
        args = dict(self.build_args)
        resolve_factory(self.factory)  # imports the namespace of a namespaced id (gym_pusht)
        match self.reference:
            case "single":
                return plain_single_envs([gym.make(self.factory, **args) for _ in seeds], seeds, frames)
            case "vector":
                mode = args.pop("vectorization_mode", None)
                env = gym.make_vec(self.factory, num_envs=self.num_envs, vectorization_mode=mode, **args)
                return plain_vector_env(env, seeds[0] if self.shared_seed else seeds, frames)
            case _:
                return plain_vector_env(point_mass(num_envs=self.num_envs, **args), seeds, frames)


CASES = [
    Case("CartPole-v1", 1),
    Case("CartPole-v1", 4),  # sync by default: each slot its own env and seed
    Case("CartPole-v1", 4, {"vectorization_mode": "vector_entry_point"}, reference="vector", shared_seed=True),
    Case("Pendulum-v1", 1, {"max_episode_steps": 25}),
    Case("Pendulum-v1", 3, {"max_episode_steps": 25}, reference="vector"),
    Case("InvertedPendulum-v5", 1),
    Case("InvertedPendulum-v5", 3, reference="vector"),
    Case(PUSHT, 1, PUSHT_ARGS, steps=14),
    Case(PUSHT, 2, PUSHT_ARGS, steps=14, reference="vector"),
    Case(POINT_MASS, 1, {"max_steps": 15}, reference="native"),
    Case(POINT_MASS, 4, {"max_steps": 15}, reference="native"),
]


def point_mass_env(bridge: GymBridge) -> PointMassVectorEnv:
    return cast(PointMassVectorEnv, cast(VectorEnvs, bridge.envs).env)


def run_bridge(case: Case, frames: list[Array]) -> Any:
    with GymBridge(case.factory, case.num_envs, build_args=case.build_args) as bridge:
        return driven(bridge.reset, bridge.step, [{"seed": s} for s in case.seeds()], frames)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bridge_trajectories_are_bit_identical_to_plain_gymnasium(case: Case) -> None:
    with GymBridge(case.factory, case.num_envs, build_args=case.build_args) as bridge:
        space = bridge.contract  # the contract's action feature decides the frame width
        assert space.action.shape[0] >= 1
        single_space = bridge.envs.single_action_space
    frames = action_frames(single_space, case.num_envs, case.steps)
    actual = run_bridge(case, frames)
    assert_same_trajectory(actual, case.expected(frames))
    assert max(step for _, step in actual) >= 3  # the run went past a few steps


def test_a_replicated_callable_factory_equals_n_plain_envs(tmp_path: Any) -> None:
    module = tmp_path / "pendulums.py"
    module.write_text(
        "import gymnasium as gym\n"
        "def make(g: float = 10.0):\n"
        "    return gym.make('Pendulum-v1', g=g, max_episode_steps=20)\n"
    )
    with GymBridge(f"{module}:make", 3) as bridge:
        assert not bridge.vectorized
        frames = action_frames(bridge.envs.single_action_space, 3, 25)
        actual = driven(bridge.reset, bridge.step, [{"seed": s} for s in (5, 6, 7)], frames)
    expected = plain_single_envs([gym.make("Pendulum-v1", max_episode_steps=20) for _ in range(3)], [5, 6, 7], frames)
    assert_same_trajectory(actual, expected)


def test_observation_frames_are_batched_and_typed() -> None:
    with GymBridge(PUSHT, 2, build_args=PUSHT_ARGS) as bridge:
        reply = bridge.reset([{"seed": 1}, {"seed": 2}], seq=1)
        assert reply.observation["pixels"].shape == (2, 96, 96, 3)
        assert reply.observation["pixels"].dtype == np.uint8
        assert reply.observation["agent_pos"].shape == (2, 2)
        assert set(bridge.contract.cameras) == {"pixels"}
        assert reply.status == ["running", "running"]
        assert reply.reward.dtype == np.float64
        assert reply.terminated.dtype == np.bool_
        stepped = bridge.step(np.full((2, 2), 256.0, np.float32), seq=2)
        assert stepped.seq == 2
        stepped.observation["pixels"][:] = 0  # the caller owns its copy
        assert bridge.step(np.full((2, 2), 256.0), seq=3).observation["pixels"].any()


# ---------------------------------------------------------------------------------------------
# seeds: a slot is credited with the seed it got


def test_a_registry_id_gives_every_slot_its_own_seed_by_default() -> None:
    with GymBridge("CartPole-v1", 4) as bridge:
        first = bridge.reset([{"seed": s} for s in FIRST]).observation["state"]
        second = bridge.reset([{"seed": s} for s in SEEDS]).observation["state"]
        credited = [slot["seed"] for slot in bridge.result()["slots"]]
    assert_honest_seeds(first, second, credited)


def test_a_one_seed_vector_env_refuses_distinct_seeds_and_takes_a_shared_one() -> None:
    args = {"vectorization_mode": "vector_entry_point"}
    with GymBridge("CartPole-v1", 3, build_args=args) as bridge:
        with pytest.raises(TaskArgumentError) as caught:
            bridge.reset([{"seed": 100}, {"seed": 999}, {"seed": 100}])
        assert bridge.slots.states == [SlotState.IDLE] * 3  # refused before anything started
        reply = bridge.reset([{"seed": 7}] * 3)
        credited = [slot["seed"] for slot in bridge.result()["slots"]]
        assert bridge.reset([{}] * 3).status == ["running"] * 3  # unseeded: nothing is credited
    message = str(caught.value)
    assert "CartPole-v1 (CartPoleVectorEnv) takes one seed for all 3 slots" in message
    assert "seeds [100, 999, 100]: slot(s) [1] would not get the seed they are credited with" in message
    assert "serve it without vectorization_mode (each slot its own env and seed)" in message
    expected, _ = gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point").reset(seed=7)
    np.testing.assert_array_equal(reply.observation["state"], expected)
    assert credited == [7, 7, 7]


SEEDED_VECTOR_ENVS = """
import gymnasium as gym, numpy as np
from gymnasium.vector.utils import batch_space

class _Vector(gym.vector.VectorEnv):
    def __init__(self, num_envs):
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.single_action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.seeds_received = []
    def reset(self, *, seed=None, options=None):
        self.seeds_received.append(seed)
        return np.zeros((self.num_envs, 1), np.float32), {}
    def step(self, actions):
        n = self.num_envs
        return np.zeros((n, 1), np.float32), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}

class _OneSeed(_Vector):
    per_slot_seeds = False

def lists(num_envs: int = 1):
    return _Vector(num_envs)

def one_seed(num_envs: int = 1):
    return _OneSeed(num_envs)
"""


def test_a_project_vector_factory_gets_the_per_slot_seed_list_unless_it_says_it_takes_one(tmp_path: Any) -> None:
    module = tmp_path / "seeded.py"
    module.write_text(SEEDED_VECTOR_ENVS)
    with GymBridge(f"{module}:lists", 3) as bridge:
        bridge.reset([{"seed": 4}, {"seed": 9}, {"seed": None}])
        assert cast(Any, bridge.envs).env.seeds_received[-1] == [4, 9, None]
    with GymBridge(f"{module}:one_seed", 2) as bridge:
        with pytest.raises(TaskArgumentError, match=r"one_seed \(_OneSeed\) takes one seed for all 2 slots"):
            bridge.reset([{"seed": 4}, {"seed": 9}])
        bridge.reset([{"seed": 4}, {"seed": 4}])
        assert cast(Any, bridge.envs).env.seeds_received[-1] == 4


# ---------------------------------------------------------------------------------------------
# connections: build arguments and records belong to one client


def test_build_arguments_of_one_connection_never_reach_the_next() -> None:
    with GymBridge("CartPole-v1", 1, build_args={"max_episode_steps": 50}) as bridge:
        bridge.begin_connection()
        bridge.reset([{"seed": 0, "max_episode_steps": 2}])
        assert [bool(bridge.step(np.array([[k % 2]])).truncated[0]) for k in range(2)] == [False, True]
        bridge.reset([{"seed": 0}])  # a reset that leaves it out gets the operator's value back
        assert bridge.build_args == {"max_episode_steps": 50}
        bridge.reset([{"seed": 0, "max_episode_steps": 2}])
        bridge.begin_connection()
        fresh = bridge.result()["slots"][0]
        bridge.reset([{"seed": 0}])
        assert bridge.build_args == {"max_episode_steps": 50}  # rebuilt back to the operator's
        assert not any(bridge.step(np.array([[k % 2]])).truncated[0] for k in range(3))
        assert bridge.result()["slots"][0]["episode"] == 0
    assert (fresh["status"], fresh["episode"], fresh["seed"], fresh["steps"]) == ("idle", -1, None, 0)


def test_a_client_may_repeat_but_never_change_the_vectorization_mode() -> None:
    with GymBridge("CartPole-v1", 2, build_args={"vectorization_mode": "sync"}) as bridge:
        with pytest.raises(TaskArgumentError) as caught:
            bridge.reset([{"vectorization_mode": "async"}] * 2)
        assert bridge.reset([{"vectorization_mode": "sync", "seed": 1}] * 2).status == ["running"] * 2
        assert isinstance(cast(VectorEnvs, bridge.envs).env, gym.vector.SyncVectorEnv)
    assert str(caught.value) == (
        "vectorization_mode='async' is refused: it is fixed when the sim starts (this sim serves CartPole-v1 with "
        "vectorization_mode='sync'); start the sim with --arg vectorization_mode=async to use it, or leave it out "
        "of the task"
    )
    with GymBridge("CartPole-v1", 2) as bridge:  # the operator chose none: one env per slot
        assert isinstance(bridge.envs, ReplicatedEnvs)
        with pytest.raises(TaskArgumentError, match=r"serves CartPole-v1 with one gym.make env per slot\); start"):
            bridge.reset([{"vectorization_mode": "sync"}] * 2)


# ---------------------------------------------------------------------------------------------
# finished slots: hold actions, frozen data, no autoreset leak


@pytest.mark.parametrize("hold", [HoldMode.LAST, HoldMode.ZERO])
def test_a_finished_slot_gets_the_hold_action_and_its_data_stays_frozen(hold: HoldMode) -> None:
    with GymBridge(POINT_MASS, 2, hold=hold) as bridge:
        bridge.reset([{"seed": 1, "options": {"max_steps": [2, 6]}}, {"seed": 2, "options": {"max_steps": [2, 6]}}])
        pushes = [np.array([[0.5, -0.5], [0.1, 0.1]], np.float32) * (k + 1) for k in range(5)]
        replies = [bridge.step(push) for push in pushes]
        env = point_mass_env(bridge)  # the vector env itself: what did it receive?
    assert [r.status for r in replies[:2]] == [["running", "running"], ["done", "running"]]
    assert replies[1].truncated.tolist() == [True, False]
    final = replies[1].observation["state"][0].copy()
    for later in replies[2:]:
        # the vector env autoreset slot 0 (new position, new goal); none of it reaches the slot
        np.testing.assert_array_equal(later.observation["state"][0], final)
        assert later.reward[0] == 0.0
        assert later.truncated[0]
        assert later.status[0] == "done"
    received = np.stack(env.received)
    expected_hold = received[1, 0] if hold is HoldMode.LAST else np.zeros(2, np.float32)
    for step in range(2, 5):
        np.testing.assert_array_equal(received[step, 0], expected_hold)
        np.testing.assert_array_equal(received[step, 1], np.clip(pushes[step][1], -1, 1))
    result = bridge.result()
    assert [s["steps"] for s in result["slots"]] == [2, 5]
    assert not np.array_equal(env.position[0], final[:2])  # the env did move on: the mask did the work


def test_a_replicated_finished_slot_is_not_stepped_again() -> None:
    with GymBridge(FAULTY, 2, build_args={}) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        envs = [cast(FaultyEnv, env) for env in cast(ReplicatedEnvs, bridge.envs).envs]
        for _ in range(10):
            bridge.step(np.zeros((2, 1)))
        assert [env.t for env in envs] == [10, 10]
        assert bridge.slots.states == [SlotState.DONE, SlotState.DONE]
        with pytest.raises(SlotStateError, match="no slot is running"):
            bridge.step(np.zeros((2, 1)))


# ---------------------------------------------------------------------------------------------
# actions


def test_wrong_action_shape_or_dtype_names_the_expected_spec() -> None:
    with GymBridge("Pendulum-v1", 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        for bad in (np.zeros((2, 3)), np.zeros((3, 1)), np.zeros(5), np.zeros((2, 1, 1))):
            with pytest.raises(ActionError, match=r"expected float32\[N=2, A=1\] \(names \['action_0'\]\)"):
                bridge.step(bad)
        with pytest.raises(ActionError, match=r"dtype <U1, expected float32\[N=2, A=1\]"):
            bridge.step(np.array([["a"], ["b"]]))
        with pytest.raises(ActionError, match="must be an array, got list"):
            bridge.step([[0.0], [0.0]])
        assert bridge.slots.states == [SlotState.RUNNING] * 2  # refused frames apply nothing
        assert [r.steps for r in bridge.slots.records] == [0, 0]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_action_row_errors_its_slot_only(bad: float) -> None:
    frames = action_frames(gym.spaces.Box(-1, 1, (2,), np.float32), 3, 4, seed=3)
    with GymBridge(POINT_MASS, 3) as bridge:
        clean = [bridge.reset([{"seed": s} for s in range(3)])] + [bridge.step(f) for f in frames]
    with GymBridge(POINT_MASS, 3) as bridge:
        replies = [bridge.reset([{"seed": s} for s in range(3)]), bridge.step(frames[0])]
        poisoned = frames[1].copy()
        poisoned[2, 1] = bad
        replies.append(bridge.step(poisoned))
        replies += [bridge.step(f) for f in frames[2:]]
        received = np.stack(point_mass_env(bridge).received)
        records = bridge.slots.records
    refused = replies[2]
    assert refused.status == ["running", "running", "errored"]
    assert [e.slot for e in refused.errors] == [2]
    message = refused.errors[0].message
    assert message.startswith(f"action [{frames[1][2, 0]}, {bad}] is not finite (seed 2, step 2); ")
    assert (
        "expected a finite float32[A=2] (names ['action_0', 'action_1']) within low [-1.0, -1.0], high [1.0, 1.0]"
        in (message)
    )
    assert refused.reward[2] == 0.0
    for later, unpoisoned in zip(replies[2:], clean[2:], strict=True):
        # the siblings step exactly as without the bad row; the refused slot's row stays frozen
        np.testing.assert_array_equal(later.observation["state"][:2], unpoisoned.observation["state"][:2])
        np.testing.assert_array_equal(later.observation["state"][2], replies[1].observation["state"][2])
    for step in range(1, 4):  # the refused slot is held on its last applied action, never given the bad row
        np.testing.assert_array_equal(received[step, 2], received[0, 2])
    assert [r.state for r in records] == [SlotState.RUNNING, SlotState.RUNNING, SlotState.ERRORED]
    assert [r.steps for r in records] == [4, 4, 1]
    assert records[2].error == message


def test_a_refused_row_of_a_replicated_slot_is_never_stepped_and_all_rows_refused_steps_nothing() -> None:
    with GymBridge(FAULTY, 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        envs = [cast(FaultyEnv, env) for env in cast(ReplicatedEnvs, bridge.envs).envs]
        reply = bridge.step(np.array([[0.5], [np.nan]]))
        assert reply.status == ["running", "errored"]
        bridge.step(np.zeros((2, 1)))
        assert [env.t for env in envs] == [2, 0]
        reply = bridge.step(np.array([[np.inf], [0.0]]))
        assert reply.status == ["errored", "errored"]
        assert [e.slot for e in reply.errors] == [0]
        assert [env.t for env in envs] == [2, 0]
        assert [r.steps for r in bridge.slots.records] == [2, 0]


def test_a_finished_slot_may_send_anything() -> None:
    with GymBridge(POINT_MASS, 2) as bridge:
        bridge.reset([{"seed": 0, "options": {"max_steps": [1, 5]}}] * 2)
        bridge.step(np.zeros((2, 2)))
        reply = bridge.step(np.array([[np.nan, np.nan], [0.5, 0.5]]))  # slot 0 is done: its row is ignored
        assert reply.status == ["done", "running"]


def test_continuous_bounds_clip_by_default_or_error_the_slot_when_asked() -> None:
    with GymBridge(POINT_MASS, 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        bridge.step(np.array([[3.0, -7.0], [0.5, 0.25]]))
        np.testing.assert_array_equal(point_mass_env(bridge).received[-1], [[1.0, -1.0], [0.5, 0.25]])
    with GymBridge(POINT_MASS, 2, bounds=BoundsMode.ERROR) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        reply = bridge.step(np.array([[0.5, 0.5], [0.0, 1.5]]))
        np.testing.assert_array_equal(point_mass_env(bridge).received[-1], [[0.5, 0.5], [0.0, 0.0]])
    assert reply.status == ["running", "errored"]
    assert [e.slot for e in reply.errors] == [1]
    assert reply.errors[0].message.startswith(
        "action [0.0, 1.5] is out of bounds (seed 1, step 1); expected a finite float32[A=2]"
    )
    assert "within low [-1.0, -1.0], high [1.0, 1.0]" in reply.errors[0].message


def test_an_unseeded_episodes_error_says_it_is_unseeded() -> None:
    """It read "(seed None, step 1)"."""
    with GymBridge(POINT_MASS, 2, bounds=BoundsMode.ERROR) as bridge:
        bridge.reset([{"seed": None}, {"seed": 1}])
        reply = bridge.step(np.array([[0.0, 1.5], [0.0, 1.5]]))
    assert [e.message.split(";")[0] for e in reply.errors] == [
        "action [0.0, 1.5] is out of bounds (unseeded, step 1)",
        "action [0.0, 1.5] is out of bounds (seed 1, step 1)",
    ]


def test_discrete_actions_are_cast_to_int_and_range_checked_per_slot() -> None:
    with GymBridge(PROBE, 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        reply = bridge.step(np.array([[2.0], [0.9]]))  # ProbeEnv refuses anything its space does not contain
        assert reply.reward.tolist() == [2.0, 1.0]
        reply = bridge.step(np.array([1, 0], dtype=np.int32))  # [N] is accepted for A == 1
        assert reply.reward.tolist() == [1.0, 0.0]
        reply = bridge.step(np.array([[3], [0]]))
        assert reply.status == ["errored", "running"]
        assert reply.reward.tolist() == [0.0, 0.0]
        assert [e.message for e in reply.errors] == [
            "action [3] is outside the discrete range (seed 0, step 3); expected a finite int64[A=1] "
            "(names ['action_0']) "
            "within low [0.0], high [2.0]"
        ]
        assert [r.steps for r in bridge.slots.records] == [2, 3]


def test_action_adapter_reshapes_to_the_space() -> None:
    space = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    adapter = ActionAdapter(action_feature(space), space, 2)
    rows, refused = adapter.validate(np.arange(8, dtype=np.float64).reshape(2, 4) / 10, np.array([True, True]), str)
    assert refused == {}
    batch = adapter.to_env(rows, batched=True)
    assert batch.shape == (2, 2, 2)
    assert batch.dtype == np.float32
    per_slot = adapter.to_env(rows, batched=False)
    assert [a.shape for a in per_slot] == [(2, 2), (2, 2)]
    multi = gym.spaces.MultiDiscrete([3, 3])
    adapter = ActionAdapter(action_feature(multi), multi, 1)
    rows, _ = adapter.validate(np.array([[2.2, 0.1]]), np.array([True]), str)
    assert adapter.to_env(rows, batched=True).tolist() == [[2, 0]]


# ---------------------------------------------------------------------------------------------
# success, score, prompts


@pytest.mark.parametrize("key", ["is_success", "success", "task_success"])
def test_success_is_probed_from_info_and_sticky(key: str) -> None:
    with GymBridge(PROBE, 1, build_args={"success_key": key, "success_at": 2, "episode_steps": 4}) as bridge:
        bridge.reset([{"seed": 0}])
        successes = [bool(bridge.step(np.array([[1]])).success[0]) for _ in range(4)]
        result = bridge.result()
    assert successes == [False, True, True, True]
    assert result["success"] is True
    assert result["score"] == 1.0
    assert result["slots"][0]["total_reward"] == 4.0


def test_without_a_success_signal_the_score_is_the_return() -> None:
    with GymBridge(PROBE, 2, build_args={"episode_steps": 3}) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        for _ in range(3):
            bridge.step(np.array([[2], [1]]))
        result = bridge.result()
    assert [s["score"] for s in result["slots"]] == [6.0, 3.0]
    assert result["score"] == 4.5
    assert result["success"] is False
    assert [s["status"] for s in result["slots"]] == ["done", "done"]
    assert all(s["truncated"] and not s["terminated"] for s in result["slots"])


def test_vector_success_reads_masks_and_final_info() -> None:
    info = {
        "success": np.array([True, False, True]),
        "_success": np.array([True, True, False]),
        "final_info": {"is_success": np.array([False, False, True]), "_is_success": np.array([False, False, True])},
        "_final_info": np.array([False, False, True]),
    }
    assert vector_success(info, 3).tolist() == [1, 0, 1]
    legacy = {"final_info": np.array([None, {"task_success": 1.0}, {}], dtype=object)}
    assert vector_success(legacy, 3).tolist() == [-1, 1, -1]
    assert success_of({"final_info": {"is_success": True}}) == 1
    assert success_of({"other": 1}) == -1


def test_prompts_come_from_the_env_or_from_the_task() -> None:
    with GymBridge(PROBE, 1, build_args={"prompt": "push the block"}) as bridge:
        assert bridge.reset([{"seed": 0}]).prompt == ["push the block"]
    with GymBridge(POINT_MASS, 2) as bridge:
        reply = bridge.reset([{"seed": 3, "options": {"max_steps": 9}}] * 2)
        assert reply.prompt == ['point_mass options={"max_steps": 9}'] * 2
        assert bridge.reset([{"seed": 3, "options": {}}] * 2).prompt == ["point_mass"] * 2, "no empty options"
    with GymBridge(PROBE, 1) as bridge:
        assert bridge.idle_hook() is not None


# ---------------------------------------------------------------------------------------------
# task arguments and rebuilds


def test_a_changed_build_argument_rebuilds_the_env() -> None:
    with GymBridge("CartPole-v1", 1) as bridge:
        first = bridge.envs
        bridge.reset([{"seed": 0, "max_episode_steps": 3}])
        rebuilt = bridge.envs
        assert rebuilt is not first
        assert bridge.build_args == {"max_episode_steps": 3}
        replies = [bridge.step(np.array([[step % 2]])) for step in range(3)]
        assert [r.truncated[0] for r in replies] == [False, False, True]
        bridge.reset([{"seed": 1, "max_episode_steps": 3}])  # the same value: no rebuild
        assert bridge.envs is rebuilt
        bridge.reset([{"seed": 1}])  # no build argument: back to the operator's build
        assert bridge.envs is not rebuilt
        assert bridge.build_args == {}


def first_env_resets(envs: SlotEnvs) -> list[tuple[int | None, dict[str, Any] | None]]:
    """The ``(seed, options)`` of every reset the first env of ``envs`` got (a vector env's first sub-env)."""
    first = envs.envs[0] if isinstance(envs, ReplicatedEnvs) else cast(VectorEnvs, envs).env.envs[0]
    assert isinstance(first, NeedsOptions)
    return first.resets


@pytest.mark.parametrize("factory", [NEEDS_OPTIONS, NEEDS_OPTIONS_VECTOR])
def test_an_env_whose_reset_needs_options_starts_from_the_probe_reset_it_is_given(factory: str) -> None:
    with GymBridge(factory, 2, probes=[ProbeReset(seed=7, options={"difficulty": 0.3})]) as bridge:
        built = bridge.envs
        assert first_env_resets(built) == [(7, {"difficulty": 0.3})]  # the probe, before any episode
        reply = bridge.reset([{"seed": slot, "options": {"difficulty": 0.5}} for slot in range(2)])
        assert reply.status == ["running", "running"]
        np.testing.assert_array_equal(reply.observation["state"], np.full((2, 2), 0.5, np.float32))

        # a reset that rebuilds the envs probes them with its own first slot's seed and options
        bridge.reset([{"seed": 4 + slot, "size": 2, "options": {"difficulty": 0.9}} for slot in range(2)])
        assert bridge.envs is not built
        assert first_env_resets(bridge.envs)[0] == (4, {"difficulty": 0.9})


def test_a_probe_reset_that_raises_says_it_was_the_probe_and_with_which_arguments() -> None:
    bridge = GymBridge(NEEDS_OPTIONS, 2, probes=[ProbeReset(seed=3, options={"level": 1})])
    with pytest.raises(EnvFault) as caught:
        bridge.start()
    assert str(caught.value).startswith(
        "the probe reset at start-up, env.reset(seed=3, options={'level': 1}), which samples one observation to "
        "derive the contract, raised KeyError: \"reset needs options['difficulty']\""
    )
    assert "--probe-options" in str(caught.value)
    assert "probe_sims.py" in caught.value.formatted  # the env's own traceback, for the line that raised
    with pytest.raises(EnvFault, match=r"env\.reset\(seed=None, options=None\)"):
        GymBridge(NEEDS_OPTIONS, 1).start()  # no probe given: the reset of old, without arguments
    tried = [ProbeReset(seed=3, options={"level": 1}), ProbeReset(seed=4, options={"difficulty": 0.5})]
    with GymBridge(NEEDS_OPTIONS, 2, probes=tried) as bridge:  # the first that works gives the sample, on envs anew
        assert first_env_resets(bridge.envs) == [(4, {"difficulty": 0.5})]
    with pytest.raises(EnvFault) as caught:
        GymBridge(NEEDS_OPTIONS, 2, probes=[tried[0], tried[0]]).start()
    assert "env.reset(seed=3, options={'level': 1})" in str(caught.value)
    assert str(caught.value).endswith("; the 1 other probe reset(s) given raised too")


@pytest.mark.filterwarnings("ignore:.*ERROR:UserWarning")  # gymnasium's own lines about its failed workers
def test_a_later_probe_reset_runs_on_envs_built_anew_as_a_failed_async_worker_is_gone() -> None:
    """gymnasium's AsyncVectorEnv shuts down a worker whose reset raised: a second probe on the same env failed."""
    tried = [ProbeReset(seed=3, options={"level": 1}), ProbeReset(seed=4, options={"difficulty": 0.5})]
    with GymBridge("tests.sim.probe_sims:needs_options_async", 2, probes=tried) as bridge:
        assert bridge.contract.observation_features["state"].shape == (2,)
        reply = bridge.reset([{"seed": slot, "options": {"difficulty": 0.5}} for slot in range(2)])
        assert reply.status == ["running", "running"]


def test_unknown_or_inconsistent_task_arguments_are_refused() -> None:
    with GymBridge(FAULTY, 2) as bridge:
        with pytest.raises(TaskArgumentError, match=r"'delay' is accepted neither by the factory faulty\(fault: str"):
            bridge.reset([{"delay": 1}, {}])
        with pytest.raises(
            TaskArgumentError, match=re.escape("slot 1: asks for build arguments {'at_step': 3}, the first slot for {}")
        ):
            bridge.reset([{}, {"at_step": 3}])
        with pytest.raises(TaskArgumentError, match="one task per slot: 2 slots, 1 tasks"):
            bridge.reset([{}])
        with pytest.raises(TaskArgumentError, match="slot 0: seed must be an integer or null, got 'x'"):
            bridge.reset([{"seed": "x"}, {}])
        with pytest.raises(TaskArgumentError, match="slot 1: options must be a map or null, got 3"):
            bridge.reset([{}, {"options": 3}])
    with pytest.raises(TaskArgumentError, match="'nope' is accepted neither"):
        GymBridge(FAULTY, 1, build_args={"nope": 1})
    with GymBridge(POINT_MASS, 2) as bridge, pytest.raises(TaskArgumentError, match="one options dict for all slots"):
        bridge.reset([{"options": {"max_steps": 2}}, {"options": {"max_steps": 3}}])


def test_a_rebuild_that_changes_a_shape_is_refused_and_the_old_build_comes_back(tmp_path: Any) -> None:
    module = tmp_path / "sized.py"
    module.write_text(
        "import gymnasium as gym, numpy as np\n"
        "def make(width: int = 3):\n"
        "    return gym.wrappers.TimeLimit(_Env(width), 5)\n"
        "class _Env(gym.Env):\n"
        "    def __init__(self, width):\n"
        "        self.observation_space = gym.spaces.Box(-1, 1, (width,), np.float32)\n"
        "        self.action_space = gym.spaces.Discrete(2)\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(self.observation_space.shape, np.float32), {}\n"
        "    def step(self, action):\n"
        "        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}\n"
    )
    with GymBridge(f"{module}:make", 1) as bridge:
        bridge.reset([{"seed": 0}])
        with pytest.raises(
            ContractError,
            match=r"'state' is observation float32\[3\] in the contract file but observation float32\[4\]",
        ):
            bridge.reset([{"width": 4}])
        assert bridge.slots.states == [SlotState.ERRORED]
        reply = bridge.reset([{"seed": 1}])  # the last good build serves again
        assert reply.observation["state"].shape == (1, 3)


# ---------------------------------------------------------------------------------------------
# env faults in-process


def test_an_exception_in_one_slot_fails_that_slot_only() -> None:
    with GymBridge(FAULTY, 3, build_args={"fault": "raise_step", "at_step": 2, "fault_seed": 11}) as bridge:
        bridge.reset([{"seed": 10}, {"seed": 11}, {"seed": 12}])
        assert bridge.step(np.zeros((3, 1))).errors == []
        reply = bridge.step(np.zeros((3, 1)))
        assert reply.status == ["running", "errored", "running"]
        assert [e.slot for e in reply.errors] == [1]
        assert (
            reply.errors[0].message
            == "ZeroDivisionError: FaultyEnv step 2 failed on purpose (seed 11) (seed 11, step 2)"
        )
        assert 'File "' in (reply.errors[0].traceback or "")
        assert "in step" in (reply.errors[0].traceback or "")
        assert reply.reward.tolist() == [1.0, 0.0, 1.0]
        reply = bridge.step(np.zeros((3, 1)))
        assert reply.errors == []
        assert reply.status == ["running", "errored", "running"]
        slots = bridge.result()["slots"]
    assert [s["steps"] for s in slots] == [3, 1, 3]
    assert "ZeroDivisionError" in slots[1]["error"]


def test_the_env_of_a_lone_slot_raising_ends_its_episode_errored_with_the_traceback() -> None:
    with GymBridge(FAULTY, 1, build_args={"fault": "raise_step", "at_step": 1}) as bridge:
        bridge.reset([{"seed": 0}])
        reply = bridge.step(np.zeros((1, 1)))
        assert reply.status == ["errored"]
        [error] = reply.errors
        assert (error.slot, error.cause) == (0, "env")
        assert error.message == "ZeroDivisionError: FaultyEnv step 1 failed on purpose (seed 0) (seed 0, step 1)"
        assert "Traceback" in (error.traceback or "")
        assert bridge.slots.states == [SlotState.ERRORED]


def test_every_slot_raising_at_once_ends_each_episode_in_its_own_words() -> None:
    """Not one fault named after the first slot: each slot's error is the one it gets in any split of the slots
    (``shards``), where its sim may hold it alone or beside slots that step on."""
    with GymBridge(FAULTY, 3, build_args={"fault": "raise_step", "at_step": 1}) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}, {"seed": 2}])
        reply = bridge.step(np.zeros((3, 1)))
    assert reply.status == ["errored"] * 3
    assert [(e.slot, e.message) for e in reply.errors] == [
        (seed, f"ZeroDivisionError: FaultyEnv step 1 failed on purpose (seed {seed}) (seed {seed}, step 1)")
        for seed in range(3)
    ]


def test_a_reset_exception_errors_its_slot_only_and_the_next_reset_recovers() -> None:
    with GymBridge(FAULTY, 2, build_args={"fault": "raise_reset", "fault_seed": 1}) as bridge:
        reply = bridge.reset([{"seed": 0}, {"seed": 1}])
        assert reply.status == ["running", "errored"]
        assert [(e.slot, e.cause) for e in reply.errors] == [(1, "env")]
        assert (
            reply.errors[0].message
            == "env.reset raised ValueError: FaultyEnv reset failed on purpose (seed 1) (seed 1)"
        )
        assert bridge.reset([{"seed": 0}, {"seed": 2}]).status == ["running", "running"]


def test_a_reset_that_fails_in_every_slot_errors_each_slot_in_its_own_words() -> None:
    with GymBridge(FAULTY, 2, build_args={"fault": "raise_reset"}) as bridge:
        reply = bridge.reset([{"seed": 0}, {"seed": 1}])
        assert reply.status == ["errored", "errored"]
        assert [e.message for e in reply.errors] == [
            f"env.reset raised ValueError: FaultyEnv reset failed on purpose (seed {seed}) (seed {seed})"
            for seed in range(2)
        ]
        assert bridge.slots.states == [SlotState.ERRORED, SlotState.ERRORED]


def test_an_env_that_raised_is_built_anew_before_its_slots_next_episode_and_no_other_is() -> None:
    """An env whose reset or step raised may be broken for good: its slot's next episode starts on a fresh one, as
    it would in any split of the slots; the envs beside it are kept. Before, the envs were built anew only when
    every slot's reset raised, probed with the first slot's seed: a probe that raised errored healthy seeds too."""
    with GymBridge(FAULTY, 2, build_args={"fault": "raise_reset", "fault_seed": 1}) as bridge:
        assert bridge.reset([{"seed": 0}, {"seed": 1}]).status == ["running", "errored"]
        first = cast(ReplicatedEnvs, bridge.envs).envs.copy()
        assert bridge.reset([{"seed": 1}, {"seed": 0}]).status == ["errored", "running"]
        second = cast(ReplicatedEnvs, bridge.envs).envs.copy()
        assert (second[0] is first[0], second[1] is first[1]) == (True, False), "slot 1's env was built anew"
        bridge.reset([{"seed": 2}, {"seed": 3}])
        third = cast(ReplicatedEnvs, bridge.envs).envs
        assert (third[0] is second[0], third[1] is second[1]) == (False, True)
    with GymBridge(FAULTY, 1, build_args={"fault": "raise_step", "at_step": 1, "fault_seed": 4}) as bridge:
        bridge.reset([{"seed": 4}])
        assert bridge.step(np.zeros((1, 1))).status == ["errored"]
        stepped = cast(ReplicatedEnvs, bridge.envs).envs[0]
        bridge.reset([{"seed": 5}])
        assert cast(ReplicatedEnvs, bridge.envs).envs[0] is not stepped


UNBUILDABLE_ENVS = """
import os, gymnasium as gym, numpy as np

class _Env(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    def reset(self, *, seed=None, options=None):
        if seed == 1:
            raise RuntimeError("the gripper jammed")
        return np.zeros(1, np.float32), {}
    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

def make(down: str):
    if os.path.exists(down):
        raise OSError("the license server is down")
    return _Env()
"""


def test_an_env_that_cannot_be_built_anew_errors_its_slots_next_episode_in_those_words(tmp_path: Any) -> None:
    """Seed 1's reset raised; the license server goes down before the slot's env is built anew: that episode read
    "env.reset raised OSError: ...", though no reset ran. The slot is built anew again at its next reset."""
    module, down = tmp_path / "unbuildable_envs.py", tmp_path / "down"
    module.write_text(UNBUILDABLE_ENVS)
    with GymBridge(f"{module}:make", 2, build_args={"down": str(down)}) as bridge:
        assert bridge.reset([{"seed": 0}, {"seed": 1}]).status == ["running", "errored"]
        down.touch()
        reply = bridge.reset([{"seed": 3}, {"seed": 2}])
        assert reply.status == ["running", "errored"]
        assert [e.message for e in reply.errors] == [
            "building the env anew raised OSError: the license server is down (seed 2)"
        ]
        down.unlink()
        assert bridge.reset([{"seed": 3}, {"seed": 2}]).status == ["running", "running"]


def test_a_reset_in_which_every_slot_raised_does_not_spoil_the_next_resets_healthy_seeds() -> None:
    """Seeds below 13 jam at reset. Both slots' resets raised; then seed 12 raises again beside seed 13, which runs:
    the envs were built anew and probed with seed 12 first, and that probe errored seed 13 with seed 12's words."""
    jamming = "tests.sim.shard_sims:jamming"
    with GymBridge(jamming, 2, build_args={"below": 13, "phase": "reset"}) as bridge:
        assert bridge.reset([{"seed": 10}, {"seed": 11}]).status == ["errored", "errored"]
        reply = bridge.reset([{"seed": 12}, {"seed": 13}])
    assert reply.status == ["errored", "running"]
    assert [e.message for e in reply.errors] == [
        "env.reset raised RuntimeError: the gripper of seed 12 jammed at reset (seed 12)"
    ]


def test_a_registry_ids_env_whose_first_reset_raised_steps_its_next_episode() -> None:
    """gymnasium's env checker keeps nothing of a first reset that raised, and its first step then raised
    ``TypeError: cannot unpack non-iterable NoneType``: only for slots other than the one the start-up probe reset,
    so a seed's episode depended on the slot it ran in."""
    gym.register(id="tests_bridge/Jamming-v0", entry_point="tests.sim.shard_sims:JammingEnv", kwargs={"phase": "reset"})
    try:
        with GymBridge("tests_bridge/Jamming-v0", 2, build_args={"below": 6}) as bridge:
            assert bridge.reset([{"seed": 7}, {"seed": 5}]).status == ["running", "errored"]
            bridge.reset([{"seed": 7}, {"seed": 8}])
            reply = bridge.step(np.zeros((2, 1), dtype=np.float32))
    finally:
        gym.registry.pop("tests_bridge/Jamming-v0")
    assert reply.status == ["running", "running"], [e.message for e in reply.errors]


def test_an_observation_that_breaks_the_contract_fails_the_slot() -> None:
    with GymBridge(FAULTY, 2, build_args={"fault": "wrong_shape_step", "at_step": 1, "fault_seed": 0}) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        reply = bridge.step(np.zeros((2, 1)))
    assert reply.status == ["errored", "running"]
    assert "observation 'state' is float32[5], the contract says float32[3]" in reply.errors[0].message


def test_a_non_finite_observation_ends_its_slot_as_errored_naming_the_feature_and_step() -> None:
    with GymBridge(FAULTY, 3, build_args={"fault": "nan_step", "at_step": 2, "fault_seed": 1}) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}, {"seed": 2}])
        envs = [cast(FaultyEnv, env) for env in cast(ReplicatedEnvs, bridge.envs).envs]
        assert bridge.step(np.zeros((3, 1))).errors == []
        reply = bridge.step(np.zeros((3, 1)))
        assert reply.status == ["running", "errored", "running"]
        assert reply.nonfinite == [1]
        assert [(e.slot, e.message) for e in reply.errors] == [
            (1, "observation 'state' is not finite (seed 1, step 2)")
        ]
        assert reply.reward.tolist() == [1.0, 0.0, 1.0]
        later = bridge.step(np.zeros((3, 1)))
        assert later.status == ["running", "errored", "running"]
        assert later.errors == []
        assert [env.t for env in envs] == [3, 2, 3]  # never stepped again
        slots = bridge.result()["slots"]
    assert [s["status"] for s in slots] == ["running", "errored", "running"]
    assert [s["steps"] for s in slots] == [3, 1, 3]
    assert [s["total_reward"] for s in slots] == [3.0, 1.0, 3.0]
    assert [s["nonfinite_steps"] for s in slots] == [0, 1, 0]
    assert slots[1]["error"] == "observation 'state' is not finite (seed 1, step 2)"


NAN_ENVS = """
import gymnasium as gym, numpy as np

class _Env(gym.Env):
    def __init__(self, bad_reward_at, bad_reset):
        self.bad_reward_at, self.bad_reset = bad_reward_at, bad_reset
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    def reset(self, *, seed=None, options=None):
        self.t, self.seed_value = 0, seed
        value = np.inf if seed is not None and seed == self.bad_reset else 0.0
        return np.array([0.0, value], np.float32), {}
    def step(self, action):
        self.t += 1
        reward = float("nan") if self.seed_value == 1 and self.t == self.bad_reward_at else 1.0
        return np.array([self.t, 0.0], np.float32), reward, False, False, {}

def make(bad_reward_at: int = 3, bad_reset: int = -1):
    return _Env(bad_reward_at, bad_reset)
"""


def test_a_non_finite_reward_or_reset_observation_ends_the_slot_as_errored(tmp_path: Any) -> None:
    module = tmp_path / "nan_envs.py"
    module.write_text(NAN_ENVS)
    with GymBridge(f"{module}:make", 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        replies = [bridge.step(np.zeros((2, 1))) for _ in range(4)]
        slots = bridge.result()["slots"]
        assert [r.status[1] for r in replies] == ["running", "running", "errored", "errored"]
        assert [e.message for e in replies[2].errors] == ["reward nan is not finite (seed 1, step 3)"]
        assert replies[2].nonfinite == []
        assert [s["total_reward"] for s in slots] == [4.0, 2.0]  # the NaN never reaches the return
        assert [s["steps"] for s in slots] == [4, 2]
        reply = bridge.reset([{"seed": 0, "bad_reset": 0}, {"seed": 1, "bad_reset": 0}])
    assert reply.status == ["errored", "running"]
    assert [e.message for e in reply.errors] == ["observation 'state' is not finite at reset (seed 0)"]
    assert reply.nonfinite == [0]


ODD_SIGNAL_ENVS = """
import gymnasium as gym, numpy as np

SIGNALS = {0: {"is_success": True}, 1: {"is_success": float("nan")}, 2: {"is_success": "False"},
           3: {"is_success": None}, 4: {"success": np.float32(0.0)}}

class _Env(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    def reset(self, *, seed=None, options=None):
        self.seed_value = seed
        return np.zeros(1, np.float32), {}
    def step(self, action):
        reward = None if self.seed_value == 5 else 1.0
        return np.zeros(1, np.float32), reward, True, False, dict(SIGNALS.get(self.seed_value, {}))

def make():
    return _Env()
"""


def test_a_success_signal_that_is_nan_or_text_or_a_reward_that_is_no_number_errors_its_slot(tmp_path: Any) -> None:
    """Before, ``bool(nan)`` and ``bool("False")`` counted as successes, and a ``None`` reward erred with
    float()'s own words, naming no reward."""
    module = tmp_path / "odd_signals.py"
    module.write_text(ODD_SIGNAL_ENVS)
    with GymBridge(f"{module}:make", 6) as bridge:
        bridge.reset([{"seed": seed} for seed in range(6)])
        reply = bridge.step(np.zeros((6, 1)))
        slots = bridge.result()["slots"]
    assert reply.status == ["done", "errored", "errored", "done", "done", "errored"]
    errors = {e.slot: e.message for e in reply.errors}
    assert "env info['is_success']=nan (float): a success signal must be a bool or a finite number" in errors[1]
    assert "env info['is_success']='False' (str)" in errors[2]
    assert "env.step returned reward=None (NoneType): it must be one number" in errors[5]
    assert [s["success"] for s in slots if s["status"] == "done"] == [True, False, False]
    assert [s["score"] for s in slots if s["status"] == "done"] == [1.0, 1.0, 0.0], "no signal (None): the return"


class _Signalling(gym.Env[np.ndarray, np.ndarray]):
    """Reports ``success`` as given (a numpy bool, None) at every step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, success: object) -> None:
        self.success = success

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(1, np.float32), 0.0, False, False, {"success": self.success}


def test_a_vector_envs_success_signal_is_checked_on_the_slots_its_mask_names() -> None:
    nan_elsewhere = {"is_success": np.array([1.0, np.nan]), "_is_success": np.array([True, False])}
    assert vector_success(nan_elsewhere, 2).tolist() == [1, -1]
    vector = gym.vector.SyncVectorEnv([lambda: _Signalling(np.True_), lambda: _Signalling(None)])
    vector.reset(seed=0)
    *_, info = vector.step(np.zeros((2, 1), dtype=np.float32))
    assert np.asarray(info["success"]).dtype == object, "gymnasium keeps np.bool_ and None in an object array"
    assert vector_success(info, 2).tolist() == [1, -1], "np.bool_ is a signal, None is none"
    with pytest.raises(TypeError, match=r"info\['is_success'\]=array\(\[nan,  1\.\]\) \(ndarray\)"):
        vector_success({"is_success": np.array([np.nan, 1.0])}, 2)


def test_a_bridge_must_start_before_use() -> None:
    bridge = GymBridge("CartPole-v1")
    with pytest.raises(RuntimeError, match="call start\\(\\) first"):
        _ = bridge.contract
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        GymBridge("CartPole-v1", 0)


@pytest.mark.parametrize(
    ("factory", "robot"),
    [("CartPole-v1", "CartPole-v1"), ("envs.faulty:faulty", "FaultyEnv"), ("envs.vectorized:point_mass", "PointMass")],
)
def test_a_contract_names_its_robot_by_the_env_never_by_the_factory_function(factory: str, robot: str) -> None:
    with GymBridge(factory, num_envs=2) as bridge:
        assert bridge.start().robot_type.startswith(robot)


class UnstableEnv(gym.Env[np.ndarray, np.ndarray]):
    """Raises a simulator's two-line warning at its second step, or at reset for seed 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, where: str = "step") -> None:
        self.where, self.t = where, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        if self.where == "shape" and seed == 1:
            return np.zeros(5, np.float32), {}
        if self.where == "reset" and seed == 1:
            raise RuntimeError("MuJoCo Warning: Nan, Inf or huge value in QACC at DOF 3.\nThe simulation is unstable.")
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, Any, bool, dict]:
        self.t += 1
        if self.where == "flags":
            return np.zeros(2, np.float32), 0.0, [0, np.float32(0.0), "no"][self.t % 3], False, {}
        if self.t == 2:
            raise RuntimeError("MuJoCo Warning: Nan, Inf or huge value in QACC at DOF 3.\nThe simulation is unstable.")
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_an_exception_of_several_lines_is_said_whole_with_its_type_the_cause_is_often_on_the_first() -> None:
    said = "RuntimeError: MuJoCo Warning: Nan, Inf or huge value in QACC at DOF 3. The simulation is unstable."
    with GymBridge("tests.sim.test_bridge:UnstableEnv", 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        bridge.step(np.zeros((2, 1)))
        reply = bridge.step(np.zeros((2, 1)))
        assert [e.message for e in reply.errors] == [f"{said} (seed {seed}, step 2)" for seed in range(2)]
    with GymBridge("tests.sim.test_bridge:UnstableEnv", 2, build_args={"where": "reset"}) as bridge:
        reply = bridge.reset([{"seed": 0}, {"seed": 1}])
        assert [e.message for e in reply.errors] == [f"env.reset raised {said} (seed 1)"]


def test_an_observation_the_contract_refuses_at_reset_errors_its_slot_only() -> None:
    with GymBridge("tests.sim.test_bridge:UnstableEnv", 2, build_args={"where": "shape"}) as bridge:
        reply = bridge.reset([{"seed": 0}, {"seed": 1}])
        assert reply.status == ["running", "errored"], "seed 0's episode is not lost with seed 1's"
        (error,) = reply.errors
        assert error.slot == 1
        assert "observation 'state' is float32[5], the contract says float32[2]" in error.message


def test_a_terminated_flag_that_is_no_bool_is_the_envs_error_not_an_end() -> None:
    with GymBridge("tests.sim.test_bridge:UnstableEnv", 1, build_args={"where": "flags"}) as bridge:
        bridge.reset([{"seed": 0}])
        assert bridge.step(np.zeros((1, 1))).status == ["running"], "a float done of 0 or 1 (as Brax gives): a bool"
        [error] = bridge.step(np.zeros((1, 1))).errors
        assert "terminated='no' (str): it must be a bool" in error.message
        assert bridge.slots.states == [SlotState.ERRORED]


OLD_API_ENVS = """
import gymnasium as gym
import numpy as np


class OldReset(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        return np.array([0.5, 0.25], np.float32)  # gym's old API: the observation alone

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class OldStep(OldReset):
    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, {}  # gym's old API: one done flag
"""


def test_an_env_of_gyms_old_api_is_named_for_what_it_returned_not_misread(tmp_path: Any) -> None:
    """A reset returning the observation alone was unpacked as (observation, info): a 2-vector became an
    observation of its first value, and the run went on; a 4-value step failed on the unpacking, as the env's."""
    module = tmp_path / "old_api.py"
    module.write_text(OLD_API_ENVS)
    with pytest.raises(EnvFault) as caught:
        GymBridge(f"{module}:OldReset", 1).start()
    assert (
        "raised TypeError: env.reset must return (observation, info), as gymnasium's API says; it returned an array "
        "float32[2]"
    ) in str(caught.value)
    with GymBridge(f"{module}:OldStep", 2) as bridge:
        bridge.reset([{"seed": 0}, {"seed": 1}])
        errors = bridge.step(np.zeros((2, 1))).errors
    said = (
        "TypeError: env.step must return (observation, reward, terminated, truncated, info), as gymnasium's API "
        "says; it returned a tuple of 4: (an array float32[2], float, bool, dict)"
    )
    assert [said in e.message for e in errors] == [True, True]


def test_sys_exit_in_a_rebuild_or_in_closing_the_old_env_is_the_envs_fault_and_the_sim_serves_on(tmp_path: Any) -> None:
    """A pygame-style ``sys.exit()`` in a factory's rebuild or in an env's ``close`` went up through the sim's main
    thread and ended the whole sim: every slot of every later instance read as a crash."""
    module = tmp_path / "exiting_build_sims.py"
    module.write_text(
        "import sys\n"
        "import gymnasium as gym, numpy as np\n"
        "def make(level: int = 0):\n"
        "    if level < 0:\n"
        "        sys.exit('no such level')\n"
        "    return gym.wrappers.TimeLimit(_Env(), 5)\n"
        "class _Env(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)\n"
        "    action_space = gym.spaces.Discrete(2)\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(2, np.float32), {}\n"
        "    def step(self, action):\n"
        "        return np.zeros(2, np.float32), 0.0, False, False, {}\n"
        "    def close(self):\n"
        "        sys.exit(0)  # a teardown that quits the interpreter\n"
    )
    with GymBridge(f"{module}:make", 1) as bridge:
        bridge.reset([{"seed": 0}])
        with pytest.raises(EnvFault, match=r"building the env with \{'level': -1\} raised SystemExit: no such level"):
            bridge.reset([{"level": -1}])  # the old env's close exits too: logged, and the build goes on
        assert bridge.slots.states == [SlotState.ERRORED]
        reply = bridge.reset([{"seed": 1, "level": 2}])
        assert reply.status == ["running"], "the sim serves on"


class _OptionsPaced(gym.Env[np.ndarray, np.int64]):
    """A registry env whose reset needs its task's options (``pace``), whose episodes last as long as its seed
    says, and whose observations are float64 under a float32 space (gymnasium only warns of it)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._pace = float((options or {})["pace"])  # an autoreset without the task's options raises here
        self._left = 2 + int(self.np_random.integers(0, 4))
        return np.array([self._pace, self._left], dtype=np.float64), {}

    def step(self, action: Any) -> Any:
        self._left -= 1
        return np.array([self._pace, self._left], dtype=np.float64), 1.0, self._left <= 0, False, {}


def test_a_registry_id_with_several_slots_runs_each_slot_as_one_env_alone_would(tmp_path: Any) -> None:
    """Several slots of a registry id were gymnasium's sync vector env: it autoreset a finished slot without its
    task's options (which raised, and errored every other slot), and cast float64 observations to float32 where
    one slot alone, or a shard, kept float64: the same seeds gave other episodes under another ``num_envs``."""
    gym.register(id="HudOptionsPaced-v0", entry_point=_OptionsPaced, disable_env_checker=True)
    try:
        tasks = [{"seed": seed, "options": {"pace": 0.5}} for seed in (3, 4, 5)]
        probe = [ProbeReset(seed=3, options={"pace": 0.5})]
        alone: list[tuple[float, int]] = []
        for task in tasks:
            with GymBridge("HudOptionsPaced-v0", 1, contract_path=tmp_path / "alone.json", probes=probe) as bridge:
                bridge.reset([task])
                steps = 0
                while bridge.slots.states[0] is SlotState.RUNNING:
                    bridge.step(np.zeros((1, 1)))
                    steps += 1
                alone.append((float(bridge.result()["slots"][0]["total_reward"]), steps))
        with GymBridge("HudOptionsPaced-v0", 3, contract_path=tmp_path / "together.json", probes=probe) as bridge:
            assert bridge.contract.features["state"].dtype == "float64", "as one env alone derives it"
            bridge.reset(tasks)
            while SlotState.RUNNING in bridge.slots.states:
                reply = bridge.step(np.zeros((3, 1)))
                assert not reply.errors, reply.errors
            together = [(float(slot["total_reward"]), int(slot["steps"])) for slot in bridge.result()["slots"]]
        assert together == alone
        assert len({steps for _, steps in alone}) > 1, "the slots finish at different ticks"
    finally:
        gym.registry.pop("HudOptionsPaced-v0", None)
