"""Built-in policies selected by kind: random, constant, scripted; the batch type and output checks."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import ResetCounter, countdown_contract

from hud_pipelines.agent.builtin import ConstantPolicy, FunctionPolicy, RandomPolicy, scripted_policy
from hud_pipelines.agent.factory import build_policy
from hud_pipelines.agent.policy import PolicyBatch, as_base_policy, as_chunks
from hud_pipelines.contract import Contract, Feature
from hud_pipelines.errors import PolicyError
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.spec.agent import (
    AgentConfig,
    ConstantPolicyConfig,
    RandomPolicyConfig,
    ScriptedPolicyConfig,
)


def pusht_like() -> Contract:
    return Contract(
        control_rate=10.0,
        features={
            "agent_pos": Feature(role="observation", dtype="float32", shape=(2,)),
            "action": Feature(role="action", dtype="float32", shape=(2,), low=[0.0, -1.0], high=[512.0, 1.0]),
        },
    )


def batch(rows: int) -> PolicyBatch:
    return PolicyBatch(observation={"agent_pos": np.zeros((rows, 2), dtype=np.float32)}, prompts=["p"] * rows)


def test_random_actions_stay_in_bounds_and_are_reproducible() -> None:
    contract = pusht_like()
    first = RandomPolicy(contract, seed=3, chunk_size=5).infer(batch(4))
    again = RandomPolicy(contract, seed=3, chunk_size=5).infer(batch(4))
    other = RandomPolicy(contract, seed=4, chunk_size=5).infer(batch(4))
    assert first.shape == (4, 5, 2)
    assert first.dtype == np.float32
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first[..., 0].min() >= 0
    assert first[..., 0].max() <= 512
    assert np.abs(first[..., 1]).max() <= 1
    assert first[..., 0].max() > 100, "draws span the range, not a corner of it"


def test_random_discrete_actions_are_valid_indices() -> None:
    with GymBridge("CartPole-v1") as bridge:
        actions = RandomPolicy(bridge.contract, seed=0, chunk_size=50).infer(batch(2))
    assert set(np.unique(actions).tolist()) == {0.0, 1.0}


def test_constant_policy_repeats_its_value_and_checks_its_width() -> None:
    actions = ConstantPolicy(pusht_like(), [256.0, 0.5]).infer(batch(3))
    assert actions.shape == (3, 1, 2)
    assert np.all(actions == [256.0, 0.5])
    assert np.all(ConstantPolicy(pusht_like()).infer(batch(1)) == 0)
    with pytest.raises(PolicyError, match="has 3 entries; the action has 2"):
        ConstantPolicy(pusht_like(), [1.0, 2.0, 3.0])


def test_scripted_targets_function_class_with_args_and_policy_object() -> None:
    with GymBridge("CartPole-v1") as bridge:
        contract = bridge.contract
    state = PolicyBatch(
        observation={"state": np.array([[0, 0, 0.1, 0], [0, 0, -0.1, 0]], dtype=np.float32)}, prompts=["", ""]
    )
    by_instance = scripted_policy("envs.controllers:cartpole_pd", contract)
    by_class = scripted_policy("envs.controllers:CartPolePD", contract, args={"kt": -10.0})
    assert by_instance.infer(state)[:, 0, 0].tolist() == [1.0, 0.0]
    assert by_class.infer(state)[:, 0, 0].tolist() == [0.0, 1.0], "args reached the constructor"
    direct = RandomPolicy(contract)
    assert scripted_policy(direct, contract) is direct


def test_scripted_target_from_a_file_relative_to_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "experts").mkdir()
    (tmp_path / "experts" / "mine.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def push(observation):
                return np.full((len(observation["state"]), 2, 1), 7.0)
            """
        )
    )
    policy = scripted_policy("experts/mine.py:push", countdown_contract(), base_dir=tmp_path)
    out = policy.infer(PolicyBatch(observation={"state": np.zeros((3, 2))}, prompts=["", "", ""]))
    assert out.shape == (3, 2, 1)
    assert np.all(out == 7.0)


def test_scripted_targets_that_cannot_work_are_named(tmp_path: Path) -> None:
    contract = countdown_contract()
    with pytest.raises(PolicyError, match="has no attribute 'cartpole_pdd'; did you mean cartpole_pd"):
        scripted_policy("envs.controllers:cartpole_pdd", contract)
    with pytest.raises(PolicyError, match="cannot import module 'nowhere_at_all'"):
        scripted_policy("nowhere_at_all:fn", contract)
    with pytest.raises(PolicyError, match="does not exist"):
        scripted_policy("missing.py:fn", contract, base_dir=tmp_path)
    with pytest.raises(PolicyError, match="must look like"):
        scripted_policy("no_colon", contract)
    with pytest.raises(PolicyError, match="cannot be called with args"):
        scripted_policy("envs.controllers:CartPolePD", contract, args={"gain": 1})
    with pytest.raises(PolicyError, match="is a int"):
        scripted_policy("envs.controllers:CARTPOLE_SUCCESS_STEPS", contract)


def test_a_module_next_to_the_yaml_is_found_without_installing_it(tmp_path: Path) -> None:
    package = tmp_path / "myexperts_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "law.py").write_text("def zero(observation):\n    return [[0.0]] * len(observation['state'])\n")
    try:
        policy = scripted_policy("myexperts_pkg.law:zero", countdown_contract(), base_dir=tmp_path / "pipelines")
        assert policy.infer(PolicyBatch(observation={"state": np.zeros((2, 2))}, prompts=["", ""])).shape == (2, 1, 1)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("myexperts_pkg")]:
            del sys.modules[name]


class SelectsActions:
    """A LeRobot policy's shape: ``select_action`` and ``reset``, no ``infer``."""

    def select_action(self, batch: object) -> object:
        return batch

    def reset(self) -> None:
        pass


def test_outputs_are_normalised_to_chunks_or_refused() -> None:
    assert as_chunks(np.zeros((3, 2)), 3, 2, source="p").shape == (3, 1, 2)
    assert as_chunks(np.zeros(3), 3, 1, source="p").shape == (3, 1, 1)
    assert as_chunks(np.zeros((3, 7, 2)), 3, 2, source="p").shape == (3, 7, 2)
    huge = as_chunks(np.array([[1e40, -1e40, 0.5], [np.inf, np.nan, -np.inf]]), 2, 3, source="p")  # no overflow
    top = float(np.finfo(np.float32).max)  # beyond float32 is out of bounds (clipped or refused), not non-finite
    np.testing.assert_array_equal(huge[:, 0], np.array([[top, -top, 0.5], [np.inf, np.nan, -np.inf]], np.float32))
    with pytest.raises(PolicyError, match=r"policy X returned actions of shape \[3, 4\]; expected \[B=3, T, A=2\]"):
        as_chunks(np.zeros((3, 4)), 3, 2, source="policy X")
    with pytest.raises(PolicyError):
        as_chunks(np.zeros((2, 5, 2)), 3, 2, source="p")
    for answer in ({"action": [0.0, 1.0]}, (a for a in range(3)), ["left", "right", "up"]):  # numpy's words, before
        with pytest.raises(PolicyError, match=r"policy X returned a \w+ that is no array of numbers .*\[B=3, T, A=2\]"):
            as_chunks(answer, 3, 2, source="policy X")
    with pytest.raises(PolicyError, match="scripted policy"):
        FunctionPolicy(lambda obs: np.zeros((1, 9)), pusht_like()).infer(batch(1))
    import torch

    with pytest.raises(PolicyError, match="SelectsActions has no infer"):
        as_base_policy(SelectsActions())  # pyright: ignore[reportArgumentType]
    weights = torch.ones((3, 2), requires_grad=True)  # a module's output, its graph attached: numpy refused it
    np.testing.assert_array_equal(as_chunks(weights * 2, 3, 2, source="p"), np.full((3, 1, 2), 2.0, np.float32))


def test_batches_stack_and_select_rows() -> None:
    a = PolicyBatch(observation={"x": np.arange(4).reshape(2, 2)}, prompts=["a0", "a1"])
    b = PolicyBatch(observation={"x": np.arange(4, 6).reshape(1, 2)}, prompts=["b0"])
    both = PolicyBatch.concat([a, b])
    assert both.size == 3
    assert both.prompts == ["a0", "a1", "b0"]
    picked = both.rows([2, 0])
    assert picked.observation["x"].tolist() == [[4, 5], [0, 1]]
    assert picked.observation["x"].flags.writeable
    with pytest.raises(PolicyError, match="2 rows for 1 prompts"):
        PolicyBatch(observation={"x": np.zeros((2, 1))}, prompts=["only one"])
    with pytest.raises(PolicyError, match="different features"):
        PolicyBatch.concat([a, PolicyBatch(observation={"y": np.zeros((1, 2))}, prompts=[""])])


def test_build_policy_dispatches_on_kind() -> None:
    contract = pusht_like()
    assert isinstance(build_policy(RandomPolicyConfig(seed=1), contract, base_dir=Path()), RandomPolicy)
    constant = build_policy(ConstantPolicyConfig(value=[1.0, 0.0]), contract, base_dir=Path())
    assert constant.infer(batch(1)).tolist() == [[[1.0, 0.0]]]
    scripted = build_policy(ScriptedPolicyConfig(target="envs.controllers:CartPolePD"), contract, base_dir=Path())
    assert isinstance(scripted, FunctionPolicy)
    agent = AgentConfig.model_validate({"policy": {"kind": "random", "chunk_size": 4}, "horizon": 2})
    assert isinstance(agent.policy, RandomPolicyConfig)
    assert agent.batching.max_wait_ms == 5.0
    assert FunctionPolicy(lambda obs: obs, contract).horizon is None


def test_the_loop_traces_and_wrap_do_not_import_torch_or_lerobot() -> None:
    """Modules a sim child or a scripted eval imports must stay free of torch (~5 s) and lerobot (~15 s)."""
    import subprocess

    code = (
        "import sys\n"
        "import hud_pipelines.agent, hud_pipelines.agent.runner, hud_pipelines.agent.batching\n"
        "import hud_pipelines.agent.builtin, hud_pipelines.agent.remote, hud_pipelines.recording.traces\n"
        "import hud_pipelines.recording.wrap, envs.controllers\n"
        "from hud_pipelines.agent import RobotAgent, BatchedModel, build_policy\n"
        "heavy = sorted(m for m in ('torch', 'lerobot', 'av') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_scripted_policys_reset_runs_before_the_runs_of_episodes_that_share_it_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    ResetCounter.resets.clear()
    spec = {
        "name": "counted",
        "sim": {"factory": "CartPole-v1", "num_envs": 2},
        "agent": {"policy": {"kind": "scripted", "target": "agent_helpers:ResetCounter"}},
        "group": 3,
        "max_steps": 5,
        "max_concurrent": 1,
        "dataset": {"enabled": False},
    }
    evaluate(load_pipeline_text(json.dumps(spec), source=tmp_path / "counted.yaml"), outputs_dir=tmp_path / "out")
    assert ResetCounter.resets == [3], "one policy for the eval, reset before each instance (they take turns)"
