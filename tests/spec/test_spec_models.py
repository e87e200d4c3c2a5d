"""The pipeline models: defaults, cross-field rules, and the helpers the runner relies on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hud_pipelines.sim.actions import BoundsMode, HoldMode
from hud_pipelines.spec import (
    CallableGrader,
    MaxErrorRateCheck,
    MinSuccessRateCheck,
    Partition,
    PipelineSpec,
    ReturnGrader,
    SuccessGrader,
)
from hud_pipelines.spec.agent import LeRobotPolicyConfig, ScriptedPolicyConfig, TorchPolicyConfig
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import SOURCE_CONTEXT
from hud_pipelines.spec.problems import SpecError


def spec(source: Path | None = None, **overrides: Any) -> PipelineSpec:
    data: dict[str, Any] = {
        "name": "cartpole",
        "sim": {"factory": "CartPole-v1"},
        "agent": {"policy": {"kind": "random"}},
        **overrides,
    }
    context = {SOURCE_CONTEXT: source} if source is not None else None
    return PipelineSpec.model_validate(data, context=context)


def test_defaults_give_one_task_one_instance_one_slot_graded_by_success() -> None:
    s = spec()
    assert [t.name for t in s.tasks] == ["task0"]
    assert s.tasks[0].seed == 0
    assert s.group == 1
    assert s.sim.num_envs == 1
    assert s.max_concurrent == 1
    assert s.graders == [SuccessGrader(name="success")]
    assert s.checks == []
    assert s.sim.hold is HoldMode.LAST
    assert s.sim.bounds is BoundsMode.CLIP
    assert not s.dataset_enabled
    assert s.partitions() == [Partition(0, 0)]
    assert s.partition_keys() == ["task0-i0"]


def test_partitions_are_task_major_with_stable_keys() -> None:
    s = spec(tasks=[{}, {"name": "hard", "seed": 50}], group=3)
    assert s.partitions() == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert s.partition_keys() == ["task0-i0", "task0-i1", "task0-i2", "hard-i0", "hard-i1", "hard-i2"]
    for partition, key in zip(s.partitions(), s.partition_keys(), strict=True):
        assert s.partition_for_key(key) == partition
        assert s.partition_key(*partition) == key
    with pytest.raises(KeyError, match="no partition 'hard-i3'; known: task0-i0"):
        s.partition_for_key("hard-i3")
    with pytest.raises(IndexError, match=r"instances 0\.\.2"):
        s.partition_key(1, 3)


def test_seeds_compose_group_and_num_envs_into_distinct_seeds() -> None:
    s = spec(sim={"factory": "CartPole-v1", "num_envs": 4}, tasks=[{"seed": 10}, {"seed": 1000}], group=3)
    assert s.seeds_for(0, 0) == [10, 11, 12, 13]
    assert s.seeds_for(0, 2) == [18, 19, 20, 21]
    assert s.seeds_for(1, 1) == [1004, 1005, 1006, 1007]
    first_task = [seed for instance in range(3) for seed in s.seeds_for(0, instance)]
    assert len(set(first_task)) == s.slots_per_task == 12
    assert s.scheduled_slots == 24


def test_slot_tasks_carry_seed_options_and_the_full_build_arguments() -> None:
    s = spec(
        sim={"factory": "CartPole-v1", "num_envs": 2, "args": {"max_episode_steps": 100, "render_mode": None}},
        tasks=[{"seed": 5, "options": {"low": -0.1}, "args": {"max_episode_steps": 20}, "prompt": "balance"}, {}],
    )
    assert s.build_args(0) == {"max_episode_steps": 20, "render_mode": None}
    assert s.slot_tasks(0, 0) == [
        {"max_episode_steps": 20, "render_mode": None, "seed": 5, "options": {"low": -0.1}},
        {"max_episode_steps": 20, "render_mode": None, "seed": 6, "options": {"low": -0.1}},
    ]
    # the second task restores the sim-level build arguments a previous task overrode
    assert s.slot_tasks(1, 0)[0] == {"max_episode_steps": 100, "render_mode": None, "seed": 0, "options": {}}
    assert all("prompt" not in task for task in s.slot_tasks(0, 0))


def test_models_are_frozen_and_refuse_unknown_keys() -> None:
    s = spec()
    with pytest.raises(ValidationError, match="frozen"):
        s.group = 2  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        spec(sim={"factory": "CartPole-v1", "num_env": 2})


def test_numbers_refuse_booleans_but_accept_numeric_strings_from_interpolation() -> None:
    with pytest.raises(ValidationError, match="expected a number, got a boolean"):
        spec(group=True)
    assert spec(group="3").group == 3


@pytest.mark.parametrize(
    ("sim", "message"),
    [
        ({}, "exactly one of 'factory'"),
        ({"factory": "CartPole-v1", "url": "ws://h:1", "token": "t"}, "exclude each other"),
        ({"url": "ws://h:1"}, "needs its 'token'"),
        ({"factory": "CartPole-v1", "token": "t"}, "'token' belongs to a sim attached by 'url'"),
        ({"url": "ws://h:1", "token": "t", "hold": "zero"}, "'hold' configures a spawned sim"),
        ({"url": "http://h:1", "token": "t"}, "pattern"),
    ],
)
def test_sim_source_rules(sim: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(sim=sim)


def test_attached_sim_keeps_its_token_secret() -> None:
    s = spec(sim={"url": "ws://10.0.0.5:8765", "token": "hunter2", "num_envs": 3})
    assert not s.sim.spawned
    assert s.factory is None
    assert s.sim.token is not None
    assert s.sim.token.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(s)
    assert "hunter2" not in s.model_dump_json()


def test_grader_and_check_names_default_to_their_kind_and_must_be_unique() -> None:
    s = spec(
        graders=[{"kind": "return", "threshold": 195}, {"kind": "return", "name": "raw_return"}],
        checks=[{"kind": "min_success_rate", "value": 0.8}, {"kind": "max_error_rate", "value": 0, "blocking": False}],
    )
    assert s.graders == [ReturnGrader(name="return", threshold=195.0), ReturnGrader(name="raw_return")]
    assert s.checks == [
        MinSuccessRateCheck(name="min_success_rate", value=0.8),
        MaxErrorRateCheck(name="max_error_rate", value=0.0, blocking=False),
    ]
    with pytest.raises(ValidationError, match="check name 'max_error_rate' is already used by checks\\[0\\]"):
        spec(checks=[{"kind": "max_error_rate", "value": 0}, {"kind": "max_error_rate", "value": 0.1}])


def test_task_names_are_filled_by_position_and_must_be_unique() -> None:
    with pytest.raises(ValidationError, match="task name 'task1' is already used by tasks\\[0\\]"):
        spec(tasks=[{"name": "task1"}, {}])  # the second task's default name collides
    assert [t.name for t in spec(tasks=[{"name": "easy"}, {}]).tasks] == ["easy", "task1"]


def test_names_that_no_file_can_hold_and_seeds_the_wire_cannot_carry_are_refused_at_load() -> None:
    """Before, ``validate`` passed them and the run failed: "File name too long", or a seed of 2**64 and more
    "cannot encode a value of type int on the wire" after the sim had started."""
    with pytest.raises(ValidationError, match="at most 64 characters"):
        spec(name="p" * 65)
    with pytest.raises(ValidationError, match="at most 64 characters"):
        spec(tasks=[{"name": "t" * 65}])
    with pytest.raises(ValidationError, match="less than or equal to 9223372036854775807"):
        spec(tasks=[{"seed": 2**63}])
    assert spec(name="p" * 64, tasks=[{"name": "t" * 64, "seed": 2**63 - 1}]).tasks[0].seed == 2**63 - 1


def test_relative_paths_resolve_against_the_yaml_file(tmp_path: Path) -> None:
    source = tmp_path / "pipelines" / "cartpole.yaml"
    s = spec(
        source=source,
        sim={"factory": "../envs/cartpole.py:make", "contract": "contracts/cartpole.json"},
        agent={"policy": {"kind": "scripted", "target": "controllers.py:pd", "args": {"kp": 1.0}}},
        graders=[
            {"kind": "callable", "target": "graders.py:grade"},
            {"kind": "callable", "name": "by_module", "target": "pkg.mod:fn"},
        ],
    )
    pipelines = (tmp_path / "pipelines").resolve()
    assert s.source == source.resolve()
    assert s.base_dir == pipelines
    assert s.factory == f"{(tmp_path / 'envs' / 'cartpole.py').resolve()}:make"
    assert s.contract_path == pipelines / "contracts" / "cartpole.json"
    policy = s.resolved_agent().policy
    assert isinstance(policy, ScriptedPolicyConfig)
    assert policy.target == f"{pipelines / 'controllers.py'}:pd"
    assert policy.args == {"kp": 1.0}
    assert [g.target for g in s.resolved_graders() if isinstance(g, CallableGrader)] == [
        f"{pipelines / 'graders.py'}:grade",
        "pkg.mod:fn",
    ]


def test_module_targets_and_registry_ids_are_left_alone(tmp_path: Path) -> None:
    s = spec(source=tmp_path / "p.yaml", sim={"factory": "gym_pusht/PushT-v0"})
    assert s.factory == "gym_pusht/PushT-v0"
    assert s.resolve_target("envs.controllers:cartpole_pd") == "envs.controllers:cartpole_pd"
    assert s.contract_path is None


def test_torch_and_lerobot_paths_resolve(tmp_path: Path) -> None:
    source = tmp_path / "p.yaml"
    torch = spec(source=source, agent={"policy": {"kind": "torch", "target": "m.py:Net", "checkpoint": "w/net.pt"}})
    policy = torch.resolved_agent().policy
    assert isinstance(policy, TorchPolicyConfig)
    assert policy.checkpoint == str(tmp_path.resolve() / "w" / "net.pt")
    assert policy.target == f"{tmp_path.resolve() / 'm.py'}:Net"
    lerobot = spec(source=source, agent={"policy": {"kind": "lerobot", "path": "/abs/act"}, "horizon": 4})
    resolved = lerobot.resolved_agent()
    assert isinstance(resolved.policy, LeRobotPolicyConfig)
    assert resolved.policy.path == "/abs/act"
    assert resolved.horizon == 4


def test_a_spec_built_in_code_resolves_against_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    s = spec(sim={"factory": "CartPole-v1", "contract": "c.json"})
    assert s.source is None
    assert s.contract_path == tmp_path.resolve() / "c.json"


def test_dataset_defaults_follow_the_pipeline_name(tmp_path: Path) -> None:
    assert spec().dataset_root(tmp_path) == tmp_path / "outputs" / "datasets" / "cartpole"
    assert spec().dataset_repo_id == "local/cartpole"
    s = spec(dataset={"root": "data/cp", "repo_id": "lab/cartpole", "video": False})
    assert s.dataset_enabled
    assert s.dataset is not None
    assert not s.dataset.video
    assert s.dataset_root(tmp_path) == tmp_path / "data" / "cp"
    assert s.dataset_repo_id == "lab/cartpole"
    assert not spec(dataset={"enabled": False}).dataset_enabled


def test_spec_hash_is_stable_and_follows_content(tmp_path: Path) -> None:
    here = spec(source=tmp_path / "a" / "p.yaml", sim={"factory": "CartPole-v1", "contract": "c.json"})
    there = spec(source=tmp_path / "b" / "p.yaml", sim={"factory": "CartPole-v1", "contract": "c.json"})
    assert here.spec_hash == there.spec_hash
    assert len(here.spec_hash) == 64
    assert spec(max_steps=10).spec_hash != spec(max_steps=11).spec_hash
    assert spec(max_steps=10).spec_hash == spec(max_steps=10).spec_hash
    attached = {"url": "ws://h:1", "num_envs": 2}
    assert spec(sim={**attached, "token": "a"}).spec_hash == spec(sim={**attached, "token": "b"}).spec_hash


def test_serve_options_carry_hold_and_bounds() -> None:
    s = spec(sim={"factory": "CartPole-v1", "hold": "zero", "bounds": "error"})
    assert s.sim.serve_options()[:4] == ["--hold", "zero", "--bounds", "error"]


def test_a_spawned_sims_frame_limit_reaches_its_child_and_never_the_rollout_hash() -> None:
    """A spawned sim's link refused frames over 64 MiB, and only a served sim's ``--max-frame-bytes`` raised it."""
    import json

    def sim(**fields: Any) -> PipelineSpec:
        return load_pipeline_text(json.dumps({**PINNED, "sim": {**PINNED["sim"], **fields}}), source="/tmp/p.yaml")

    assert "--max-frame-bytes" not in sim().sim.serve_options()
    options = sim(max_frame_mb=256).sim.serve_options()
    assert options[options.index("--max-frame-bytes") + 1] == str(256 * 2**20)
    assert sim(max_frame_mb=0.5).sim.serve_options()[-2:] == ["--max-frame-bytes", str(2**19)]
    assert sim(max_frame_mb=256).rollout_hash == sim().rollout_hash == sim(max_frame_mb=64).rollout_hash
    assert "max_frame_mb" not in json.dumps(sim().model_dump(mode="json")), "unset, the dump is as it was"
    for unusable in (0, 1e-7, "big", True):
        with pytest.raises(SpecError, match="max_frame_mb"):
            sim(max_frame_mb=unusable)
    with pytest.raises(SpecError, match="'max_frame_mb' configures a spawned sim"):
        load_pipeline_text(json.dumps({**PINNED, "sim": {"url": "ws://h:1", "token": "t", "max_frame_mb": 128}}))


def test_a_spawned_sim_is_probed_with_the_first_tasks_seeds_and_options_and_nothing_else_records_them() -> None:
    """An env whose reset needs its task's options must get them in the reset that samples its contract; the
    first tasks' are tried in turn, so one task whose options break reset does not stop the others' sims."""
    from hud_pipelines.eval.runner import sim_settings
    from hud_pipelines.spec.sim_section import PROBED_TASKS

    tasks = [{"seed": 40, "options": {"difficulty": 0.3}}, {"name": "hard", "seed": 9, "options": {"difficulty": 1}}]
    s = spec(tasks=tasks, group=2)
    first, second = ("--probe-seed", "40", "--probe-options", '{"difficulty": 0.3}'), ("--probe-seed", "9")
    third = ("--probe-seed", "41", "--probe-options", '{"difficulty": 0.3}')  # the first task's next episode
    assert sim_settings(s).options[4:] == (*first, *second, "--probe-options", '{"difficulty": 1}', *third)
    one_task = spec(tasks=[{"seed": 7}], group=2)  # one seed whose reset raises errors its own episodes only
    assert sim_settings(one_task).options[4:].count("--probe-seed") == 2, "its two episodes' seeds, no other"
    assert sim_settings(one_task).options[5:10:4] == ("7", "8")
    many = spec(tasks=[{"name": f"t{i}", "seed": i} for i in range(PROBED_TASKS + 2)])
    assert sim_settings(many).options[4:].count("--probe-seed") == PROBED_TASKS, "a sim that cannot reset says so soon"
    assert sim_settings(spec()).options[4:] == ("--probe-seed", "0", "--probe-options", "{}")
    assert s.sim.serve_options() == ["--hold", s.sim.hold.value, "--bounds", s.sim.bounds.value], "no probe asked"
    assert s.rollout_hash == spec(tasks=tasks, group=2).rollout_hash  # the tasks are hashed; the probe adds nothing
    assert "probe" not in json.dumps(s.model_dump(mode="json"))


PINNED: dict[str, Any] = {
    "name": "pinned",
    "sim": {"factory": "CartPole-v1", "num_envs": 2},
    "agent": {"policy": {"kind": "random", "seed": 3}},
    "tasks": [{"name": "t", "seed": 7}],
    "max_steps": 50,
    "graders": [{"kind": "success"}, {"kind": "return", "threshold": 10}],
}
"""A pipeline whose rollout hashes, as earlier versions took them, the tests below pin."""


def test_a_key_added_later_leaves_the_rollout_hash_of_a_pipeline_that_does_not_set_it_as_it_was() -> None:
    import json

    text = PINNED
    spec = load_pipeline_text(json.dumps(text), source="/tmp/pinned.yaml")
    # the hash this pipeline had before success graders took `at` (its results stay current on upgrading), with its
    # two slots stepped one env each: see the next test
    assert spec.rollout_hash == "7a569ead1240ca133ffdcfe84f788599d010ab16d3d093894e99cba33b86d2e5"
    explicit = load_pipeline_text(
        json.dumps({**text, "graders": [{"kind": "success", "at": "any"}, text["graders"][1]]})
    )
    assert explicit.rollout_hash == spec.rollout_hash
    at_end = load_pipeline_text(json.dumps({**text, "graders": [{"kind": "success", "at": "end"}, text["graders"][1]]}))
    assert at_end.rollout_hash != spec.rollout_hash, "grading at the end is another verdict"


def test_results_of_a_registry_id_whose_slots_were_one_vector_env_are_not_current_and_no_other_are_touched() -> None:
    """A registry id of several slots was one gymnasium ``SyncVectorEnv``, and is one env per slot now: an env whose
    reset needs its task's options, or whose observations stray from its space's dtype, ran other episodes then.
    The hashes before that change are pinned: the stepping that changed leaves it, the rest keep theirs."""
    import json

    text = PINNED

    def rollout_hash(sim: dict[str, Any]) -> str:
        return load_pipeline_text(json.dumps({**text, "sim": sim}), source="/tmp/pinned.yaml").rollout_hash

    before = {
        "one vector env": "1d76cf2103c141a93b9a394562dd87057fd460c0ee8f5c8cc4802d939a38f4ae",
        "sync asked for": "f16ffd4f74e53eb1f387615e6c4deb7be34e8c0a21d3c5b7c8e43275c59b107d",
        "a callable": "4c8c0c93c6a85a41bc86ee87f753439c295aa25814cc5fe9406ab699b69dedb3",
        "one slot": "0544f323e89794f1e26330e5c1aa1a0965130ac36640487c0d718c2891118512",
    }
    assert rollout_hash({"factory": "CartPole-v1", "num_envs": 2}) != before["one vector env"]
    sync = {"factory": "CartPole-v1", "num_envs": 2, "args": {"vectorization_mode": "sync"}}
    assert rollout_hash(sync) == before["sync asked for"], "still one SyncVectorEnv: current"
    assert rollout_hash({"factory": "envs.faulty:faulty", "num_envs": 2}) == before["a callable"]
    assert rollout_hash({"factory": "CartPole-v1", "num_envs": 1}) == before["one slot"], "one env either way"
    one_each = {"factory": "CartPole-v1", "num_envs": 2, "shards": 2}
    assert rollout_hash(one_each) == "5ff58c9809b38ba28752fd5940580269862381dc1b4ca1af6edad426cd8a38ef", "one a shard"
    two_in_one = {"factory": "CartPole-v1", "num_envs": 3, "shards": 2}
    assert rollout_hash(two_in_one) != "d8b929fdf411e56a1df51ea8a6197475bce1ee3b3ea24f31ad70ff32437b3505"
    null_mode = {"factory": "CartPole-v1", "num_envs": 2, "args": {"vectorization_mode": None}}  # meant sync then
    assert rollout_hash(null_mode) != "0bc9b0c15ce942540bea634551fe11865d9e2217f8636f511dfec141615b2377"
    from hud_pipelines.spec.hashing import REGISTRY_SLOTS_APART, with_slot_stepping

    lerobot = {"sim": {"lerobot_env": {"type": "pusht"}, "num_envs": 2}}  # a registry id, as its config expands
    assert with_slot_stepping(lerobot)["sim"].items() >= REGISTRY_SLOTS_APART.items()
    assert with_slot_stepping({"sim": {"lerobot_env": {"type": "pusht"}, "num_envs": 1}}) == {
        "sim": {"lerobot_env": {"type": "pusht"}, "num_envs": 1}
    }


def test_a_matrix_value_added_leaves_the_rollout_hash_of_its_control_and_of_the_other_values_as_they_were() -> None:
    """Before, the control task's hash held its own matrix: adding a value made its results stale (``not_run``),
    and every arm's paired comparison then had no control to pair with."""
    import json

    def hashes(values: list[float]) -> dict[str, str]:
        task = {"name": "swing", "seed": 5, "matrix": {"g": values}}
        text = {
            "name": "m",
            "sim": {"factory": "Pendulum-v1"},
            "agent": {"policy": {"kind": "random"}},
            "tasks": [task],
        }
        spec = load_pipeline_text(json.dumps(text))
        return {task.name: spec.task_rollout_hash(index) for index, task in enumerate(spec.tasks)}

    two, three = hashes([9.0, 10.0]), hashes([9.0, 10.0, 11.0])
    assert list(three) == ["swing", "swing-g-9.0", "swing-g-10.0", "swing-g-11.0"]
    assert {name: three[name] for name in two} == two, "the control and the values it had: current"
    assert len(set(three.values())) == 4, "each arm is a configuration of its own"

    from hud_pipelines.eval.configuration import RolloutHashes
    from hud_pipelines.spec.hashing import checkpoint_rollout_hash

    task = {"name": "swing", "seed": 5, "matrix": {"g": [9.0, 10.0]}}
    text = {"name": "m", "sim": {"factory": "Pendulum-v1"}, "agent": {"policy": {"kind": "random"}}, "tasks": [task]}
    spec = load_pipeline_text(json.dumps(text))
    older = "8df51f8c399f6b37668a49b9a536734d036671a9e4fa436fd4a3cbda4bdf902e"  # the control's, with its matrix in
    assert spec.task_rollout_hash(0, with_matrix=True) == older
    current = RolloutHashes.of(spec)
    assert current.current("swing", older), "its results of before stay current on upgrading"
    assert not current.current("swing-g-9.0", older)
    assert current.of_checkpoint("w").current("swing", checkpoint_rollout_hash(older, "w")), "a sweep's too"
    assert RolloutHashes.of(spec, [0]).current("swing", older), "one task's hashes (a sweep plan's) say the same"


def test_a_run_configuration_is_refused_with_the_keys_and_words_of_a_pipeline_file() -> None:
    """A launchpad or run-config override said ``checks.0.min_success_rate.value: Field required``: a union's tag
    in the key and pydantic's words."""
    from hud_pipelines.errors import ConfigurationError
    from hud_pipelines.spec.loader import load_pipeline_text

    spec = load_pipeline_text(
        '{"name": "p", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": {"kind": "random"}}}'
    )
    with pytest.raises(ConfigurationError) as refused:
        spec.with_sections(checks=[{"kind": "min_success_rate", "threshold": 2}], sim={"factory": "x", "num_envs": 0})
    said = str(refused.value)
    assert "checks.0.value: missing required key 'value'" in said
    assert "checks.0.threshold: unknown key 'threshold'" in said
    assert "sim.num_envs: expected a number >= 1, got 0" in said
    with pytest.raises(ConfigurationError) as typoed:  # pydantic's "Input tag 'sucess' found using 'kind' does not..."
        spec.with_sections(graders=[{"kind": "sucess"}], agent={"policy": {"kind": "scriptd", "target": "x:y"}})
    said = str(typoed.value)
    assert (
        "graders.0: unknown kind 'sucess' (did you mean 'success'?); expected one of: success, return, callable" in said
    )
    assert "agent.policy: unknown kind 'scriptd' (did you mean 'scripted'?); expected one of: random, constant" in said
