"""The torch kind: a module by import path, a checkpoint that changes its behaviour, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from envs.controllers import CARTPOLE_SUCCESS_STEPS
from envs.policies import CartPoleTorchPD, LinearChunkPolicy
from hud_pipelines.agent.batching import BatchedModel
from hud_pipelines.agent.factory import build_policy
from hud_pipelines.agent.policy import PolicyBatch
from hud_pipelines.agent.runner import RobotAgent
from hud_pipelines.agent.torch_policy import TorchModulePolicy
from hud_pipelines.agent.torch_runtime import (
    LockstepThreads,
    available_cpus,
    configure_threads,
    lockstep_thread_count,
    resolve_device,
    to_tensor,
)
from hud_pipelines.errors import PolicyError
from hud_pipelines.sim.bridge import GymBridge
from hud_pipelines.spec.agent import AgentConfig, TorchPolicyConfig


def test_a_checkpointed_module_balances_cartpole(tmp_path: Path) -> None:
    module = CartPoleTorchPD()
    with torch.no_grad():
        module.gains.copy_(torch.tensor([0.1, 0.5, 10.0, 2.0]))
    torch.save(module.state_dict(), tmp_path / "pd.pt")
    config = TorchPolicyConfig(target="envs.policies:CartPoleTorchPD", checkpoint="pd.pt", device="cpu")
    with GymBridge("CartPole-v1", 2) as bridge:
        policy = build_policy(config, bridge.contract, base_dir=tmp_path)
        outcomes = RobotAgent(policy, bridge.contract).run(
            bridge, [{"seed": 0}, {"seed": 1}], max_steps=600, key=("torch", 0, 0)
        )
        untrained = build_policy(config.model_copy(update={"checkpoint": None}), bridge.contract, base_dir=tmp_path)
        short = RobotAgent(untrained, bridge.contract).run(
            bridge, [{"seed": 0}, {"seed": 1}], max_steps=600, key=("torch", 0, 1)
        )
    assert [o.steps for o in outcomes] == [CARTPOLE_SUCCESS_STEPS] * 2
    assert all(o.steps < 100 for o in short), "zero gains (no checkpoint) cannot balance the pole"
    assert torch.get_num_threads() == 1


def test_chunked_module_output_and_read_only_inputs(tmp_path: Path) -> None:
    module = LinearChunkPolicy(state_dim=2, action_dim=1, chunk_size=4)
    torch.save(module.state_dict(), tmp_path / "linear.pt")
    with GymBridge("Pendulum-v1") as bridge:
        contract = bridge.contract
    config = TorchPolicyConfig(
        target="envs.policies:LinearChunkPolicy",
        args={"state_dim": 3, "action_dim": 1, "chunk_size": 4},
        device="auto",
    )
    policy = build_policy(config, contract, base_dir=tmp_path)
    assert isinstance(policy, TorchModulePolicy)
    state = np.ones((5, 3), dtype=np.float32)
    state.flags.writeable = False
    out = policy.infer(PolicyBatch(observation={"state": state}, prompts=[""] * 5))
    assert out.shape == (5, 4, 1)
    assert out.dtype == np.float32
    with pytest.raises(PolicyError, match="does not fit LinearChunkPolicy") as refused:
        build_policy(config.model_copy(update={"checkpoint": "linear.pt"}), contract, base_dir=tmp_path)
    said = str(refused.value)
    assert "\n" not in said, "one line: a summary's line that keeps the first would say nothing of which tensor"
    assert "; size mismatch for " in said, said


def test_torch_errors_name_the_culprit(tmp_path: Path) -> None:
    with GymBridge("Pendulum-v1") as bridge:
        contract = bridge.contract
    with pytest.raises(PolicyError, match=r"is not a torch\.nn\.Module class"):
        build_policy(TorchPolicyConfig(target="envs.controllers:CartPolePD"), contract, base_dir=tmp_path)
    with pytest.raises(PolicyError, match="cannot be built with args"):
        build_policy(TorchPolicyConfig(target="envs.policies:LinearChunkPolicy"), contract, base_dir=tmp_path)
    missing = TorchPolicyConfig(target="envs.policies:CartPoleTorchPD", checkpoint="nope.pt")
    with pytest.raises(PolicyError, match=r"nope.pt does not exist"):
        build_policy(missing, contract, base_dir=tmp_path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = TorchPolicyConfig(target="envs.policies:CartPoleTorchPD", checkpoint="junk.pt")
    with pytest.raises(PolicyError, match="cannot be read as a state_dict") as unreadable:
        build_policy(junk, contract, base_dir=tmp_path)
    assert "\n" not in str(unreadable.value), "torch's cause in a line, not its page of advice"
    (tmp_path / "random.pt").write_bytes(bytes(range(256)) * 8)  # a pickle stream torch refuses midway
    with pytest.raises(
        PolicyError, match=r"state_dict: random\.pt is not a file torch\.save writes \(neither a zip archive nor a"
    ) as refused:
        build_policy(junk.model_copy(update={"checkpoint": "random.pt"}), contract, base_dir=tmp_path)
    assert "\n" not in str(refused.value)
    assert "Please file an issue" not in str(refused.value)
    torch.save(CartPoleTorchPD().state_dict(), tmp_path / "saved.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "saved.pt").read_bytes()[:100])
    with pytest.raises(PolicyError, match=r"state_dict: cut\.pt is truncated \(its zip archive has no end record\)$"):
        build_policy(junk.model_copy(update={"checkpoint": "cut.pt"}), contract, base_dir=tmp_path)
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x02garbage")  # a pickle's opcode, then nothing torch reads
    with pytest.raises(PolicyError, match=r"state_dict: it is not a file torch\.save writes \(no zip archive, nor a"):
        build_policy(junk.model_copy(update={"checkpoint": "pickle.pt"}), contract, base_dir=tmp_path)
    whole = CartPoleTorchPD()
    torch.save(whole, tmp_path / "whole.pt")  # the module itself, pickled: not a state_dict
    with pytest.raises(
        PolicyError,
        match=r"Unsupported global.*by default\. It holds pickled objects.*save module\.state_dict\(\) instead$",
    ):
        build_policy(junk.model_copy(update={"checkpoint": "whole.pt"}), contract, base_dir=tmp_path)
    torch.save(whole, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)  # no zip, yet torch's own
    with pytest.raises(PolicyError, match="Unsupported global") as legacy:
        build_policy(junk.model_copy(update={"checkpoint": "legacy.pt"}), contract, base_dir=tmp_path)
    assert "not a file torch.save writes" not in str(legacy.value), "the pickled module is the cause, not the format"
    with pytest.raises(PolicyError, match="not available"):
        resolve_device("cuda:7") if not torch.cuda.is_available() else resolve_device("nonsense")
    with pytest.raises(PolicyError, match="torch_threads"):
        configure_threads(0)


def test_to_tensor_copies_read_only_and_strided_arrays() -> None:
    frozen = np.arange(6, dtype=np.float32).reshape(2, 3)
    frozen.flags.writeable = False
    tensor = to_tensor(frozen, torch.device("cpu"))
    tensor += 1  # would fail or corrupt the frame if it shared a read-only buffer
    assert frozen.tolist() == [[0, 1, 2], [3, 4, 5]]
    strided = np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2]
    assert to_tensor(strided, torch.device("cpu"), dtype=torch.float32).tolist() == [[0, 2], [4, 6], [8, 10]]


class ThreadProbe(torch.nn.Module):
    """Returns zeros and remembers torch's intra-op thread count during each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, observation: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return torch.zeros(observation["state"].shape[0], 1)


def probe_policy(lockstep_threads: LockstepThreads) -> tuple[TorchModulePolicy, ThreadProbe]:
    probe = ThreadProbe()
    with GymBridge("Pendulum-v1") as bridge:
        policy = TorchModulePolicy(probe, bridge.contract, device=torch.device("cpu"))
    policy.lockstep_threads = lockstep_threads
    return policy, probe


def state_rows(count: int) -> PolicyBatch:
    return PolicyBatch(observation={"state": np.zeros((count, 3), dtype=np.float32)}, prompts=[""] * count)


def test_a_forward_every_sim_waits_on_runs_on_the_idle_sims_cores() -> None:
    configure_threads(1)
    policy, probe = probe_policy("auto")
    model = BatchedModel(policy, max_wait_s=10.0, expected_callers=1)
    model.infer(state_rows(2))  # the only caller waits: its sim is idle
    policy.infer(state_rows(2))  # a direct call is not a lockstep forward
    assert probe.seen == [min(available_cpus(), 2), 1]
    assert model.stats.lockstep_forwards == 1
    assert torch.get_num_threads() == 1, "the steady thread count is restored after the forward"


def test_a_window_flush_keeps_the_steady_thread_count() -> None:
    configure_threads(1)
    policy, probe = probe_policy(4)
    model = BatchedModel(policy, max_wait_s=0.01, expected_callers=2)  # the second caller never comes
    model.infer(state_rows(1))
    assert probe.seen == [1]
    assert (model.stats.timer_flushes, model.stats.lockstep_forwards) == (1, 0)


def test_lockstep_thread_counts() -> None:
    configure_threads(1)
    assert lockstep_thread_count("auto", 3) == min(available_cpus(), 4)
    assert lockstep_thread_count(3, 1) == 3
    assert lockstep_thread_count(None, 3) is None
    assert lockstep_thread_count("auto", 0) is None
    with pytest.raises(PolicyError, match="lockstep_threads"):
        lockstep_thread_count(0, 1)
    policy, probe = probe_policy(None)
    with policy.lockstep(3):
        policy.infer(state_rows(1))
    policy.lockstep_threads = 3
    with policy.lockstep(1):
        policy.infer(state_rows(1))
    assert probe.seen == [1, 3]
    assert torch.get_num_threads() == 1


def test_lockstep_threads_come_from_the_agent_config(tmp_path: Path) -> None:
    with GymBridge("Pendulum-v1") as bridge:
        contract = bridge.contract
    config = TorchPolicyConfig(target="envs.policies:LinearChunkPolicy", args={"state_dim": 3, "action_dim": 1})
    assert AgentConfig(policy=config).lockstep_threads == "auto"
    policy = build_policy(config, contract, base_dir=tmp_path, lockstep_threads=2)
    assert isinstance(policy, TorchModulePolicy)
    assert policy.lockstep_threads == 2
    with pytest.raises(ValueError, match="lockstep_threads"):
        AgentConfig(policy=config, lockstep_threads=0)


@pytest.mark.slow
def test_a_sweep_over_module_files_finds_the_checkpoint_that_balances_the_pole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline_text
    from tests.dagster.support import REPO

    folder = tmp_path / "ckpts"
    folder.mkdir()
    for stem, gains in (("pd_step100", [0.0, 0.0, 0.0, 0.0]), ("pd_step200", [0.1, 0.5, 10.0, 2.0])):
        module = CartPoleTorchPD()
        with torch.no_grad():
            module.gains.copy_(torch.tensor(gains))
        torch.save(module.state_dict(), folder / f"{stem}.pt")
    spec = {
        "name": "pd_sweep",
        "sim": {"factory": "CartPole-v1", "num_envs": 2},
        "agent": {"policy": {"kind": "torch", "target": "envs.policies:CartPoleTorchPD", "checkpoints": "ckpts"}},
        "max_steps": 200,
        "graders": [{"kind": "return", "threshold": 150}],
    }
    monkeypatch.chdir(REPO)
    sweep = load_pipeline_text(json.dumps(spec), source=tmp_path / "pd_sweep.yaml")
    evaluation = evaluate(sweep, outputs_dir=tmp_path / "out", settle_s=0)
    by_label = {
        label: [r.success for r in evaluation.rows if r.checkpoint == label] for label in ("pd_step100", "pd_step200")
    }
    assert by_label == {"pd_step100": [False, False], "pd_step200": [True, True]}
    table = json.loads((tmp_path / "out" / "pd_sweep" / "comparison.json").read_text())
    overall = [row for row in table["rows"] if row["task"] == "all"]
    assert [(row["checkpoint"], row["step"], row["success_rate"]) for row in overall] == [
        ("pd_step100", 100, 0.0),
        ("pd_step200", 200, 1.0),
    ]


def test_validate_names_a_checkpoint_of_a_torch_sweep_that_is_no_torch_save_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every episode of that checkpoint would error at setup: validate's deep check says which file, before."""
    import json

    from hud_pipelines.cli.main import main
    from tests.dagster.support import REPO

    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save(CartPoleTorchPD().state_dict(), folder / "pd_step100.pt")
    (folder / "pd_step200.pt").write_text("garbage\n")
    policy = {"kind": "torch", "target": "envs.policies:CartPoleTorchPD", "checkpoints": "ckpts"}
    path = tmp_path / "pd_sweep.yaml"
    path.write_text(json.dumps({"name": "pd_sweep", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": policy}}))
    monkeypatch.chdir(REPO)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "agent.policy.checkpoints: checkpoint " in out, out
    assert f"{folder / 'pd_step200.pt'}: " in out
    assert "pd_step100" not in out
