"""The ``agent:`` section follows the spec's rules: numbers refuse booleans, credentials are secrets."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hud_pipelines.spec import PipelineSpec, SpecError, load_pipeline_text
from hud_pipelines.spec.agent import DEFAULT_FORWARD_TIMEOUT_S, AgentConfig, RandomPolicyConfig, RemotePolicyConfig

REMOTE = {"kind": "remote", "url": "ws://policy:8000"}


def spec(agent: dict[str, Any]) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "strict", "sim": {"factory": "CartPole-v1"}, "agent": agent})


RANDOM = {"kind": "random"}


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param({"policy": RANDOM, "horizon": True}, id="horizon"),
        pytest.param({"policy": RANDOM, "send_ahead": False}, id="send_ahead"),
        pytest.param({"policy": RANDOM, "forward_timeout_s": True}, id="forward_timeout_s"),
        pytest.param({"policy": RANDOM, "torch_threads": True}, id="torch_threads"),
        pytest.param({"policy": RANDOM, "lockstep_threads": True}, id="lockstep_threads"),
        pytest.param({"policy": RANDOM, "batching": {"max_wait_ms": True}}, id="batching.max_wait_ms"),
        pytest.param({"policy": RANDOM, "batching": {"batch_size": True}}, id="batching.batch_size"),
        pytest.param({"policy": {**RANDOM, "seed": True}}, id="random.seed"),
        pytest.param({"policy": {**RANDOM, "chunk_size": True}}, id="random.chunk_size"),
        pytest.param({"policy": {"kind": "constant", "value": [True]}}, id="constant.value"),
        pytest.param({"policy": {**REMOTE, "timeout_s": True}}, id="remote.timeout_s"),
    ],
)
def test_every_agent_number_refuses_a_boolean(agent: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="expected a number, got a boolean"):
        spec(agent)


def test_agent_numbers_still_take_numbers_and_numeric_strings_from_interpolation() -> None:
    agent = spec({"policy": {**RANDOM, "seed": "7"}, "horizon": "2", "send_ahead": 0}).agent
    assert (agent.horizon, agent.send_ahead, agent.policy) == (2, 0, RandomPolicyConfig(seed=7))
    assert spec({"policy": RANDOM, "lockstep_threads": 3}).agent.lockstep_threads == 3
    assert spec({"policy": RANDOM, "lockstep_threads": "auto"}).agent.lockstep_threads == "auto"
    assert AgentConfig.model_validate({"policy": RANDOM}).forward_timeout_s == DEFAULT_FORWARD_TIMEOUT_S


def test_a_boolean_in_the_agent_section_is_located_in_the_file() -> None:
    text = (
        "name: strict\n"
        "sim: {factory: CartPole-v1}\n"
        "agent:\n"
        "  policy: {kind: random}\n"
        "  horizon: true\n"
        "  lockstep_threads: false\n"
    )
    with pytest.raises(SpecError) as caught:
        load_pipeline_text(text, source="strict.yaml")
    rendered = [p.render().splitlines()[0] for p in caught.value.problems]
    assert rendered == [
        "strict.yaml:5:12: agent.horizon: expected a number, got true",
        # one problem for a value that fits none of the options, not one per option
        "strict.yaml:6:21: agent.lockstep_threads: expected a number or one of: auto, got false",
    ]


def test_a_remote_api_key_is_a_secret() -> None:
    loaded = spec({"policy": {**REMOTE, "api_key": "hunter2"}})
    policy = loaded.agent.policy
    assert isinstance(policy, RemotePolicyConfig)
    assert policy.api_key is not None
    assert policy.api_key.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(loaded)
    assert "hunter2" not in str(loaded)
    assert "hunter2" not in loaded.model_dump_json()


def test_how_far_steps_are_sent_ahead_keeps_earlier_results_and_the_default_hash_is_the_one_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``send_ahead`` pipelines steps to a served sim and makes the same episodes: tuning it marked every result
    stale. A pipeline at the default keeps the hash it had while the setting counted."""
    from hud_pipelines.spec import hashing

    default = spec({"policy": REMOTE})
    assert default.rollout_hash == spec({"policy": REMOTE, "send_ahead": 0}).rollout_hash
    assert default.rollout_hash == spec({"policy": REMOTE, "send_ahead": 32}).rollout_hash
    assert default.rollout_hash != spec({"policy": REMOTE, "horizon": 2}).rollout_hash
    monkeypatch.setattr(hashing, "SCHEDULING", {})  # as it was hashed while the setting counted
    assert spec({"policy": REMOTE}).rollout_hash == default.rollout_hash
    assert spec({"policy": REMOTE, "send_ahead": 0}).rollout_hash != default.rollout_hash


def test_rotating_a_credential_keeps_earlier_results() -> None:
    keyed = spec({"policy": {**REMOTE, "api_key": "old"}})
    assert keyed.rollout_hash == spec({"policy": {**REMOTE, "api_key": "new"}}).rollout_hash
    assert keyed.rollout_hash == spec({"policy": REMOTE}).rollout_hash  # a key added later too
    assert keyed.rollout_hash != spec({"policy": {**REMOTE, "url": "ws://other:8000"}}).rollout_hash
    attached = {"url": "ws://sim:8765", "num_envs": 2}

    def served(token: str) -> str:
        data = {"name": "served", "sim": {**attached, "token": token}, "agent": {"policy": {"kind": "random"}}}
        return PipelineSpec.model_validate(data).rollout_hash

    assert served("a") == served("b")


@pytest.mark.parametrize("kind", ["torch", "lerobot"])
def test_a_misspelled_torch_device_is_refused_at_its_line_not_in_every_instance(kind: str) -> None:
    """``device: cdua`` passed validate and failed every instance of the run with torch's own error."""
    policy = "{kind: torch, target: 'm.py:Net'" if kind == "torch" else "{kind: lerobot, type: act"
    text = f"name: strict\nsim: {{factory: CartPole-v1}}\nagent:\n  policy: {policy}, device: cdua}}\n"
    with pytest.raises(SpecError) as caught:
        load_pipeline_text(text, source="strict.yaml")
    [rendered] = [p.render().splitlines()[0] for p in caught.value.problems]
    assert rendered.startswith("strict.yaml:4:")
    assert "agent.policy.device: unknown torch device 'cdua': 'auto', or one of cpu, cuda," in rendered
    assert rendered.endswith("(did you mean 'cuda'?)")
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        load_pipeline_text(text.replace("cdua", device), source="strict.yaml")
