"""``wrap(env)`` on a user-owned loop writes the same traces as the managed agent loop."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from agent_helpers import RecordingSink

from envs.controllers import pendulum_swing_up
from envs.faulty import probe
from envs.held_goal import make as held_goal
from envs.vectorized import point_mass
from hud_pipelines.agent.builtin import FunctionPolicy
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.contract import load_contract
from hud_pipelines.dataset.part import read_episode_records
from hud_pipelines.errors import ContractError, Fault, HudPipelinesError
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.recording.trace_reader import read_traces
from hud_pipelines.recording.traces import StepType, TraceRecorder
from hud_pipelines.recording.wrap import RecordVectorEpisodes, wrap
from hud_pipelines.sim.bridge import GymBridge

SEEDS = [5, 6]
REPO = Path(__file__).resolve().parents[2]


def comparable(root: Path, job: str) -> list[list[dict[str, Any]]]:
    """Every trace of a job without timing fields and without inference steps (a user loop has none)."""
    return [
        [line for line in trace.without_timing() if line["type"] != StepType.INFERENCE]
        for trace in read_traces(root / job)
    ]


def managed(root: Path, num_envs: int, seeds_per_run: list[list[int]]) -> None:
    with GymBridge("Pendulum-v1", num_envs) as bridge:
        agent = RobotAgent(FunctionPolicy(pendulum_swing_up, bridge.contract), bridge.contract)
        with TraceRecorder(root, bridge.contract) as recorder:
            for seeds in seeds_per_run:
                agent.run(bridge, [{"seed": s} for s in seeds], max_steps=1000, key=("same", 0, 0), sinks=[recorder])


def swing_up_episodes(env: Any) -> None:
    """A user-owned loop: one swing-up episode per seed, then close."""
    for seed in SEEDS:
        observation, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = pendulum_swing_up({"state": observation[None]})[0]
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    env.close()


def test_wrapped_single_env_traces_equal_the_managed_loop(tmp_path: Path) -> None:
    managed(tmp_path / "managed", 1, [[s] for s in SEEDS])

    env = wrap(gym.make("Pendulum-v1"), job="same", trace_dir=tmp_path / "wrapped")
    swing_up_episodes(env)

    wrapped, reference = comparable(tmp_path / "wrapped", "same"), comparable(tmp_path / "managed", "same")
    assert len(reference) == len(SEEDS)
    assert [t[0]["seed"] for t in reference] == SEEDS
    assert wrapped == reference
    assert sorted(p.name for p in (tmp_path / "wrapped" / "same").iterdir()) == sorted(
        p.name for p in (tmp_path / "managed" / "same").iterdir()
    ), "the same deterministic trace ids"


def test_wrapped_vector_env_traces_equal_the_managed_loop(tmp_path: Path) -> None:
    seeds = [11, 12, 13]
    managed(tmp_path / "managed", 3, [seeds])

    env = wrap(gym.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync"), job="same", trace_dir=tmp_path / "w")
    assert isinstance(env, RecordVectorEpisodes)
    observation, _ = env.reset(seed=seeds)
    for _ in range(200):
        observation, *_ = env.step(pendulum_swing_up({"state": observation}))
    env.close()

    assert comparable(tmp_path / "w", "same") == comparable(tmp_path / "managed", "same")


def test_a_wrapped_env_gets_the_contract_the_bridge_derives_for_it() -> None:
    """One derivation: the robot type (a vector env's class, a registry id) and the rate agree with the sim's."""
    for factory, make in [
        ("envs.vectorized:point_mass", lambda: point_mass(3)),
        ("Pendulum-v1", lambda: gym.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync")),
        ("Pendulum-v1", lambda: gym.make("Pendulum-v1")),
    ]:
        env = wrap(make())
        env.reset(seed=[0, 1, 2] if isinstance(env, RecordVectorEpisodes) else 0)
        with GymBridge(factory, 3) as bridge:
            assert env.contract == bridge.contract, factory
        env.close()


def test_vector_autoreset_starts_new_episodes_without_recording_the_reset_step(tmp_path: Path) -> None:
    sink = RecordingSink()
    env = wrap(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"), job="auto", sinks=[sink])
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(120):
        env.step(rng.integers(0, 2, size=3))
    env.close()
    assert sink.closed == 1
    for trace_id, key in sink.keys.items():
        frames = sink.frames[trace_id]
        outcome = sink.ended[trace_id]
        assert [f.index for f in frames] == list(range(len(frames)))
        assert outcome.steps == len(frames)
        assert outcome.total_reward == len(frames), "CartPole pays 1 per step; the autoreset step pays nothing"
        if key.episode == 0:
            assert key.seed == key.slot
        else:
            assert key.seed is None
    episodes = sorted((k.slot, k.episode) for k in sink.keys.values())
    assert len(episodes) > 3 * 3, "random CartPole episodes end within ~40 steps"
    finished = [o for o in sink.ended.values() if o.terminated]
    cut = [o for o in sink.ended.values() if not o.terminated]
    assert len(cut) == 3, "one open episode per slot is cut short by close()"
    assert all(o.truncated and o.extra["reason"] for o in cut)
    assert all(o.status is EpisodeStatus.FAILED for o in finished)


def two_cartpoles(autoreset: gym.vector.AutoresetMode) -> Any:
    """A vector env of two CartPoles that restart their episodes as ``autoreset`` says."""
    return gym.make_vec(
        "CartPole-v1", num_envs=2, vectorization_mode="sync", vector_kwargs={"autoreset_mode": autoreset}
    )


def test_same_step_autoreset_and_contract_file(tmp_path: Path) -> None:
    sink = RecordingSink()
    env = wrap(
        two_cartpoles(gym.vector.AutoresetMode.SAME_STEP),
        job="same-step",
        sinks=[sink],
        contract_path=tmp_path / "contract.json",
    )
    env.reset(seed=[1, 2])
    for _ in range(60):
        env.step(np.ones(2, dtype=np.int64))  # always push right: episodes end fast
    env.close()
    assert load_contract(tmp_path / "contract.json") == env.contract
    for trace_id, frames in sink.frames.items():
        outcome = sink.ended[trace_id]
        assert outcome.steps == len(frames)
        assert outcome.total_reward == len(frames)
    assert sorted({k.episode for k in sink.keys.values()})[-1] >= 2


def test_a_masked_reset_restarts_only_the_masked_sub_envs_episodes() -> None:
    """Without autoreset a vector env restarts its finished sub-envs by ``reset(options={"reset_mask": done})``:
    the others' episodes go on (gymnasium pops the mask from the options, so it is read before the reset)."""
    sink = RecordingSink()
    env = wrap(two_cartpoles(gym.vector.AutoresetMode.DISABLED), sinks=[sink])
    env.reset(seed=[1, 2])
    lengths: list[list[int]] = [[0], [0]]  # each slot's episodes' steps, as this loop counts them
    for _ in range(40):
        _, _, terminated, truncated, _ = env.step(np.ones(2, dtype=np.int64))  # always push right: short episodes
        done = np.logical_or(terminated, truncated)
        for slot in range(2):
            lengths[slot][-1] += 1
            if done[slot]:
                lengths[slot].append(0)
        if done.any():
            env.reset(options={"reset_mask": done})
    env.close()
    recorded = [[0] * len(lengths[slot]) for slot in range(2)]
    for trace_id, key in sink.keys.items():
        recorded[key.slot][key.episode] = sink.ended[trace_id].steps
    assert recorded == lengths
    assert lengths[0] != lengths[1], "the sub-envs' episodes end at different steps"
    cut = [o for o in sink.ended.values() if not o.terminated]
    assert len(cut) == 2, "only the episode each slot has open at close() is cut short"


def test_reset_before_the_end_cuts_the_episode_short() -> None:
    sink = RecordingSink()
    env = wrap(gym.make("CartPole-v1"), sinks=[sink], prompt="balance")
    env.reset(seed=0)
    env.step(0)
    env.reset(seed=1)
    env.step(1)
    env.close()
    outcomes = sorted(sink.ended.values(), key=lambda o: o.steps)
    assert [o.steps for o in outcomes] == [1, 1]
    assert all(o.truncated and not o.terminated for o in outcomes)
    assert set(sink.begun.values()) == {"balance"}


def test_an_episode_after_close_is_refused_not_silently_dropped(tmp_path: Path) -> None:
    env = wrap(gym.make("CartPole-v1"), dataset=tmp_path / "dataset")
    env.reset(seed=0)
    env.step(0)
    env.close()
    with pytest.raises(HudPipelinesError, match=r"this wrap\(\) was closed: .* wrap the env again"):
        env.reset(seed=1)
    assert [record["seed"] for record in read_episode_records(tmp_path / "dataset")] == [0]


def test_a_wrapped_episode_knows_its_success_at_any_step_and_at_the_end() -> None:
    sink = RecordingSink()
    env = wrap(held_goal(length=4), sinks=[sink])
    for seed in (0, 1):  # an even seed holds its goal to the end, an odd one leaves it
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
            done = terminated or truncated
    env.close()
    outcomes = [sink.ended[trace] for trace in sorted(sink.ended)]
    assert [(o.success, o.success_at_end) for o in outcomes] == [(True, True), (True, False)]


def test_wrapped_camera_env_traces_state_by_name_and_the_camera_as_video(tmp_path: Path) -> None:
    import gym_pusht  # noqa: F401  (registers the gym_pusht namespace)

    env = wrap(gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos"), job="cam", trace_dir=tmp_path, video=True)
    env.reset(seed=0)
    for _ in range(10):
        env.step(np.array([256.0, 256.0]))
    env.close()
    (trace,) = read_traces(tmp_path / "cam")
    assert trace.header["state_names"] == {"agent_pos": ["agent_pos_0", "agent_pos_1"]}
    observation = trace.of_type(StepType.OBSERVATION)[0]
    assert set(observation["state"]) == {"agent_pos"}
    assert [v.name for v in trace.videos] == [f"{trace.trace_id}.pixels.mp4"]
    assert trace.grade is not None
    assert trace.grade["steps"] == 10


def test_wrap_writes_the_same_lerobot_dataset_an_eval_writes(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    target = tmp_path / "wrapped"
    env = wrap(
        gym.make("Pendulum-v1", max_episode_steps=20), job="mine", dataset=target, dataset_repo_id="local/wrapped"
    )
    swing_up_episodes(env)
    dataset = LeRobotDataset("local/wrapped", root=target)
    assert dataset.num_episodes == len(SEEDS)
    assert dataset.num_frames == 20 * len(SEEDS)
    assert set(dataset.meta.features) >= {"observation.state", "action", "next.reward", "next.done"}
    assert dataset.meta.robot_type == "Pendulum-v1"  # the env id


def test_a_wrap_dataset_stores_discrete_actions_and_one_success_per_episode(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    target = tmp_path / "probe"
    env = wrap(probe(success_key="is_success", success_at=3, episode_steps=6), job="probe", dataset=target)
    for seed, actions in ((0, [2, 1, 0, 2, 1, 0]), (1, [1, 1])):  # the second episode is cut short by close()
        env.reset(seed=seed)
        for action in actions:
            env.step(np.int64(action))
    env.close()

    dataset = LeRobotDataset("local/probe", root=target)
    assert dataset.meta.robot_type == "ProbeEnv"  # no env id: the env class
    assert dataset.meta.features["action"]["dtype"] == "int64"
    table = dataset.hf_dataset.with_format("numpy")[:]
    assert np.asarray(table["action"]).reshape(-1).tolist() == [2, 1, 0, 2, 1, 0, 1, 1]
    records = read_episode_records(target)
    assert [r["success"] for r in records] == [True, False]
    success = np.asarray(table["next.success"]).reshape(-1)
    episodes = np.asarray(table["episode_index"])
    assert success[episodes == 0].tolist() == [False, False, True, True, True, True]  # sticky once reported
    for record in records:
        assert bool(success[episodes == record["episode_index"]].any()) == record["success"]
    done = np.asarray(table["next.done"]).reshape(-1)
    assert done.tolist() == [False] * 5 + [True] + [False, True], "each episode ends on its last frame, a cut one too"


EXITS_WITHOUT_CLOSE = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import gymnasium as gym

    from hud_pipelines.recording.wrap import wrap

    writes = {sys.argv[2]: Path(sys.argv[1])}  # dataset=... or trace_dir=...
    env = wrap(gym.make("CartPole-v1"), job="unclosed", **writes)
    for seed in (0, 1):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(seed)
            done = terminated or truncated
    env.reset(seed=2)
    for _ in range(3):
        env.step(0)
    print("EXITING", flush=True)  # without env.close()
    """
)


def _exit_without_close(target: Path, writes: str) -> None:
    """Run :data:`EXITS_WITHOUT_CLOSE` writing ``writes`` (``dataset`` or ``trace_dir``) to ``target``."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", EXITS_WITHOUT_CLOSE, str(target), writes],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EXITING" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_an_unclosed_wrap_dataset_is_published_at_exit(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    target = tmp_path / "unclosed"
    _exit_without_close(target, "dataset")
    dataset = LeRobotDataset("local/unclosed", root=target)
    records = read_episode_records(target)
    assert dataset.num_episodes == len(records) == 3  # two finished, one cut short at exit
    assert [r["steps"] for r in records][-1] == 3
    assert dataset.num_frames == sum(int(str(r["frames"])) for r in records)
    assert not list(tmp_path.glob(".unclosed.staging-*"))


def test_the_traces_of_an_unclosed_wrap_end_with_their_grades_at_exit(tmp_path: Path) -> None:
    """Before, only a wrapper writing a dataset was closed at exit: the episode still open had no grade line."""
    _exit_without_close(tmp_path, "trace_dir")
    traces = read_traces(tmp_path / "unclosed")
    assert len(traces) == 3
    assert [t.grade is not None for t in traces] == [True, True, True]
    *finished, cut = [t.grade for t in traces if t.grade is not None]
    assert [g["terminated"] for g in finished] == [True, True]
    assert (cut["steps"], cut["truncated"], cut["success"]) == (3, True, False), "cut short at exit, as close() ends it"


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_wrapper_dropped_unclosed_is_let_go_unless_it_writes_a_dataset(tmp_path: Path) -> None:
    """Its exit hook held every trace-writing wrapper to the end: 200 dropped wrappers kept 200 trace files open.
    Let go, its open trace file is closed as any dropped file is (Python warns of it: the warnings ignored here)."""
    import gc
    import weakref

    env = wrap(gym.make("CartPole-v1"), trace_dir=tmp_path / "traces")
    env.reset(seed=0)
    env.step(0)
    episodes = weakref.ref(env.episodes)
    del env
    gc.collect()
    assert episodes() is None, "nothing holds a dropped wrapper of traces"
    kept = wrap(gym.make("CartPole-v1"), dataset=tmp_path / "data")
    episodes = weakref.ref(kept.episodes)
    del kept
    gc.collect()
    held = episodes()
    assert held is not None, "a dataset's wrapper is kept to be published at exit"
    held.close()


class _BreaksOnSeedOne(gym.Env[np.ndarray, np.ndarray]):
    """Four-step episodes; on seed 1 the second step raises (``fault="raise"``) or returns three values for two."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, fault: str) -> None:
        self.fault, self.seed, self.steps = fault, None, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.seed, self.steps = seed, 0
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        observation = np.zeros(2, np.float32)
        if self.seed == 1 and self.steps == 2:
            if self.fault == "raise":
                raise RuntimeError("the arm left its workspace")
            observation = np.zeros(3, np.float32)
        return observation, 1.0, self.steps == 4, False, {}


def test_an_episode_whose_env_raised_is_errored_and_kept_out_of_the_dataset_never_a_failure(tmp_path: Path) -> None:
    """Before, it ended as a failure cut short by the next reset(), and the dataset and its statistics held it."""
    sink = RecordingSink()
    env = wrap(_BreaksOnSeedOne("raise"), sinks=[sink], dataset=tmp_path / "dataset")
    for seed in (0, 1, 2):
        env.reset(seed=seed)
        try:
            for _ in range(4):
                env.step(np.zeros(1, np.float32))
        except RuntimeError:
            assert seed == 1
    env.close()
    outcomes = [sink.ended[trace] for trace in sink.ended]
    by_seed = {sink.keys[trace].seed: outcome for trace, outcome in sink.ended.items()}
    assert len(outcomes) == 3
    errored = by_seed[1]
    assert (errored.status, errored.fault, errored.steps) == (EpisodeStatus.ERRORED, Fault.ENV, 1)
    assert errored.error == "RuntimeError: the arm left its workspace"
    assert {by_seed[0].status, by_seed[2].status} == {EpisodeStatus.FAILED}
    assert [record["seed"] for record in read_episode_records(tmp_path / "dataset")] == [0, 2]


def test_an_observation_that_leaves_the_contract_mid_episode_is_said_and_errors_its_episode() -> None:
    sink = RecordingSink()
    env = wrap(_BreaksOnSeedOne("shape"), sinks=[sink])
    env.reset(seed=1)
    env.step(np.zeros(1, np.float32))
    with pytest.raises(ContractError, match=r"observation 'state' is float32\[3\], the contract says float32\[2\]"):
        env.step(np.zeros(1, np.float32))
    (outcome,) = sink.ended.values()
    assert (outcome.status, outcome.fault, outcome.steps) == (EpisodeStatus.ERRORED, Fault.CONTRACT, 1)
    env.close()


@pytest.mark.parametrize("fault", ["nan_step", "nan_reward_step"])
def test_a_non_finite_value_errors_a_wrapped_episode_as_the_agent_loop_does(tmp_path: Path, fault: str) -> None:
    """wrap() graded an episode whose observation or reward turned NaN as a failure (its score NaN), where the agent
    loop errors it (``nonfinite``), and the dataset left it out as errored: its trace and dataset disagreed."""
    from envs.faulty import FaultyEnv

    args = {"fault": fault, "at_step": 3}
    with GymBridge(f"{REPO}/envs/faulty.py:FaultyEnv", 1, build_args=args) as bridge:
        agent = RobotAgent(FunctionPolicy(lambda _: np.zeros((1, 1), np.float32), bridge.contract), bridge.contract)
        [expected] = agent.run(bridge, [{"seed": 0}], max_steps=20, key=("nan", 0, 0))
    env = wrap(FaultyEnv(**args), job="nan", trace_dir=tmp_path)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
        done = terminated or truncated
    env.close()
    [trace] = read_traces(tmp_path / "nan")
    assert expected.status is EpisodeStatus.ERRORED
    assert expected.fault is Fault.NONFINITE
    grade = trace.grade
    assert grade is not None
    assert (grade["status"], grade["steps"], grade["error"]) == ("errored", expected.steps, expected.error)


def test_a_vector_sub_env_whose_episode_errored_on_a_non_finite_value_records_its_next_episode(tmp_path: Path) -> None:
    """The errored episode waits for its sub-env's own end; the autoreset after it starts the next episode (before,
    that slot recorded nothing more)."""
    from envs.faulty import FaultyEnv

    def sub_env(fault_seed: int) -> Any:
        return lambda: FaultyEnv(fault="nan_step", at_step=3, fault_seed=fault_seed)

    env = wrap(gym.vector.SyncVectorEnv([sub_env(0), sub_env(-1)]), job="vec", trace_dir=tmp_path)
    env.reset(seed=[0, 1])
    for _ in range(25):
        env.step(np.zeros((2, 1), np.float32))
    env.close()
    by_slot: dict[int, list[str]] = {}
    for trace in sorted(read_traces(tmp_path / "vec"), key=lambda t: (t.header["slot"], t.header["episode"])):
        by_slot.setdefault(trace.header["slot"], []).append((trace.grade or {})["status"])
    assert by_slot[0][0] == "errored", by_slot
    assert by_slot[0][1] != "errored", "the next episode is its own"
    assert len(by_slot[0]) == len(by_slot[1]) == 3, by_slot


def test_a_numpy_integer_seed_is_the_episodes_seed_in_its_key_and_trace(tmp_path: Path) -> None:
    """``{"seed": s} for s in np.arange(3, 5)``: the sim was seeded 3 and 4, but the keys, traces and dataset records
    said ``seed: null``, so ``compare`` paired nothing and the policy's stream was the unseeded one."""
    with GymBridge("CartPole-v1", 2) as bridge:
        agent = RobotAgent(FunctionPolicy(lambda _: np.zeros((2, 1), np.int64), bridge.contract), bridge.contract)
        with TraceRecorder(tmp_path, bridge.contract) as recorder:
            agent.run(bridge, [{"seed": s} for s in np.arange(3, 5)], max_steps=5, key=("np", 0, 0), sinks=[recorder])
    assert sorted(trace.header["seed"] for trace in read_traces(tmp_path / "np")) == [3, 4]


def test_a_vector_env_built_by_hand_names_its_episodes_task_by_its_sub_envs(tmp_path: Path) -> None:
    """``wrap(SyncVectorEnv([...]))`` recorded every episode's task as "SyncVectorEnv" where the agent loop and
    ``gym.make_vec`` say "CartPole-v1"."""
    env = wrap(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2), job="byhand", trace_dir=tmp_path)
    env.reset(seed=[0, 1])
    env.step(np.zeros(2, np.int64))
    env.close()
    assert {trace.header["prompt"] for trace in read_traces(tmp_path / "byhand")} == {"CartPole-v1"}
