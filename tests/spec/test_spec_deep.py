"""Deep validation: the names a spec uses resolve, policy modules are read rather than run."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hud_pipelines.spec import SpecError, load_pipeline
from hud_pipelines.spec.target_check import target_problem

WriteYaml = Callable[..., Path]

HEAVY_MODULE = '''\
"""Stands in for a policy module whose imports are expensive: it must never be executed by validation."""
import not_a_real_heavy_dependency  # would raise ModuleNotFoundError if this file were run

raise RuntimeError("validation executed the module")


class Policy:
    pass


if not_a_real_heavy_dependency:
    def make_policy():
        return Policy()
else:
    from somewhere import fallback_policy as alternate_policy
'''


def pipeline(policy: str, extra: str = "") -> str:
    return f"name: deep\nsim: {{factory: CartPole-v1}}\nagent:\n  policy: {policy}\n{extra}"


def test_file_targets_are_checked_from_source_without_running_the_module(write_yaml: WriteYaml) -> None:
    write_yaml(HEAVY_MODULE, "policies/heavy.py")
    for name in ("Policy", "make_policy", "alternate_policy"):
        path = write_yaml(pipeline(f"{{kind: torch, target: policies/heavy.py:{name}}}"), f"{name}.yaml")
        assert load_pipeline(path, deep=True).name == "deep"
    module = write_yaml(pipeline("{kind: torch, target: policies/heavy.py:not_a_real_heavy_dependency}"), "m.yaml")
    with pytest.raises(SpecError, match="'not_a_real_heavy_dependency' is a module, not a function, a class or a"):
        load_pipeline(module, deep=True)
    with pytest.raises(SpecError, match="has no attribute 'Polcy' \\(did you mean 'Policy'\\?\\)"):
        load_pipeline(write_yaml(pipeline("{kind: scripted, target: policies/heavy.py:Polcy}"), "typo.yaml"), deep=True)


SIGNATURES = """\
import not_a_real_heavy_dependency


class Gain:
    def __init__(self, gain: float = 5.0, *, clip: bool = True) -> None:
        self.gain = gain


class Inherited(Gain):
    pass


def make(scale, offset=0.0):
    return Gain(scale)


def anything(**kwargs):
    return Gain()


def rebound(scale):
    return Gain(scale)


rebound = not_a_real_heavy_dependency.wrap(rebound)


def positional(scale, /, offset=0.0):
    return Gain(scale)
"""


def test_policy_args_are_checked_against_the_targets_signature_read_from_source(write_yaml: WriteYaml) -> None:
    write_yaml(SIGNATURES, "policies/shaped.py")

    def load(target: str, args: str) -> object:
        text = pipeline(f"{{kind: scripted, target: policies/shaped.py:{target}, args: {args}}}")
        return load_pipeline(write_yaml(text, f"{target}.yaml"), deep=True)

    with pytest.raises(SpecError) as refused:
        load("Gain", "{gian: 3, clip: false}")
    message = str(refused.value)
    assert (
        "agent.policy.args.gian: Gain takes no argument 'gian' (did you mean 'gain'?); it takes: clip, gain" in message
    )
    assert "args.clip" not in message, "a keyword-only parameter is an argument too"
    with pytest.raises(SpecError, match=r"args\.offst: make takes no argument 'offst' \(did you mean 'offset'\?\)"):
        load("make", "{scale: 2, offst: 1}")
    for target in ("Inherited", "anything", "rebound"):  # inherited, **kwargs, rebound: not known from source
        load(target, "{whatever: 1}")
    with pytest.raises(SpecError, match=r"args\.scale: positional takes no argument 'scale'; it takes: offset"):
        load("positional", "{scale: 2}")  # args are passed by keyword


def test_a_grader_function_that_cannot_take_the_episode_alone_is_refused_before_any_rollout(
    write_yaml: WriteYaml,
) -> None:
    """Before, validate passed it and every episode of the run errored on the call (``missing 1 required ...``)."""
    from hud_pipelines.errors import GraderError
    from hud_pipelines.eval.graders import build_graders
    from hud_pipelines.spec.grading import CallableGrader

    folder = write_yaml(
        "def two(episode, reference):\n    return 1.0\n"
        "def one(episode, reference=None):\n    return 1.0\n"
        "def none():\n    return 1.0\n",
        "graders/two_argument_graders.py",
    ).parent
    for name, accepted in (("two", False), ("one", True), ("none", False)):
        target = f"graders/two_argument_graders.py:{name}"
        path = write_yaml(pipeline("{kind: random}", f"graders: [{{kind: callable, target: '{target}'}}]\n"), "g.yaml")
        said = _deep_refusal(path)
        if accepted:
            assert said is None, said
            continue
        assert said is not None
        assert "graders[0].target: takes (" in said, said
        assert "but is called with one argument, the episode dict" in said, said
        grader = CallableGrader(name="ref", target=str(folder / f"two_argument_graders.py:{name}"))
        with pytest.raises(GraderError, match=rf"grader 'ref': .*:{name} takes \("):
            build_graders([grader], base_dir=folder)


def test_a_scripted_policy_function_that_cannot_take_the_observations_alone_is_refused_at_its_line(
    write_yaml: WriteYaml,
) -> None:
    """``def act():`` passed validate, and every slot of the run printed its traceback twice."""
    write_yaml(
        "class Factory:\n    def __init__(self):\n        pass\n"
        "    def __call__(self, observation):\n        return None\n"
        "def act(observation):\n    return None\n"
        "def none():\n    return None\n",
        "controllers/signatures.py",
    )
    for name, accepted in (("act", True), ("Factory", True), ("none", False)):
        policy = f"{{kind: scripted, target: 'controllers/signatures.py:{name}'}}"
        said = _deep_refusal(write_yaml(pipeline(policy), "p.yaml"))
        assert (said is None) == accepted, said
        if said is not None:
            assert "agent.policy.target: takes () but is called with one argument, the observation batch" in said, said


def _deep_refusal(path: Path) -> str | None:
    """What a deep load of the pipeline at ``path`` refuses (``None``: it loads)."""
    try:
        load_pipeline(path, deep=True)
    except SpecError as refused:
        return str(refused)
    return None


def test_a_lerobot_policy_type_lerobot_does_not_know_is_refused_at_its_line(write_yaml: WriteYaml) -> None:
    """Before, validate passed ``type: actt`` and every instance of the run errored as setup."""
    from hud_pipelines.spec.lerobot_types import lerobot_policy_types

    assert {"act", "diffusion", "pi0"} <= lerobot_policy_types(), "read from lerobot's own registrations"
    path = write_yaml(pipeline("{kind: lerobot, type: actt}"), "typo.yaml")
    with pytest.raises(SpecError) as refused:
        load_pipeline(path, deep=True)
    said = str(refused.value)
    assert "typo.yaml:4:33: agent.policy.type: lerobot has no policy type 'actt' (did you mean 'act'?)" in said, said
    assert load_pipeline(write_yaml(pipeline("{kind: lerobot, type: act}"), "act.yaml"), deep=True).name == "deep"
    unread = write_yaml(pipeline("{kind: lerobot, path: weights, type: actt}"), "unread.yaml")  # type is not read
    with pytest.raises(SpecError) as refused:
        load_pipeline(unread, deep=True)
    assert "policy type" not in str(refused.value), "only the missing folder is said"


def test_module_targets_are_found_without_importing_them(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = write_yaml(HEAVY_MODULE, "project/mypolicies/heavy.py").parent
    write_yaml("", "project/mypolicies/__init__.py")
    monkeypatch.syspath_prepend(str(package.parent))
    path = write_yaml(pipeline("{kind: torch, target: mypolicies.heavy:Policy}"), "project/p.yaml")
    assert load_pipeline(path, deep=True).name == "deep"
    assert "mypolicies.heavy" not in sys.modules
    with pytest.raises(
        SpecError, match=re.escape("'mypolicies.heavyy': no module of that name (did you mean 'heavy'?)")
    ):
        load_pipeline(
            write_yaml(pipeline("{kind: torch, target: mypolicies.heavyy:Policy}"), "project/q.yaml"), deep=True
        )


def test_a_module_with_dynamic_attributes_is_imported_to_check(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_yaml(
        "def __getattr__(name):\n    if name == 'lazy_policy':\n        return print\n    raise AttributeError(name)\n",
        "dyn/lazy_mod.py",
    )
    monkeypatch.syspath_prepend(str(write_yaml("", "dyn/.keep").parent))
    assert target_problem("lazy_mod:lazy_policy") is None
    assert target_problem("lazy_mod:other") == "lazy_mod has no attribute 'other'"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("json", "expected 'module:attribute'"),
        ("json:", "expected 'module:attribute'"),
        ("json:dumps", None),
        ("os.path:joinn", "os.path has no attribute 'joinn' (did you mean 'join'?)"),
        ("not_a_module_xyz.sub:f", "no module named 'not_a_module_xyz'"),
    ],
)
def test_target_problem_messages(target: str, message: str | None) -> None:
    problem = target_problem(target)
    if message is None:
        assert problem is None
    else:
        assert problem is not None
        assert message in problem


KINDS_OF_NAMES = """\
import numpy as np
from gymnasium import spaces
import not_a_real_heavy_dependency

SLOW_IMPORT = 8
NAMES = ["a", "b"]
POLICY = not_a_real_heavy_dependency.Policy()


def make(seed=0):
    return seed


class LineEnv:
    pass


if not_a_real_heavy_dependency:
    maker = 3
else:
    def maker():
        return 0
"""


def test_a_target_that_is_a_module_or_a_constant_is_refused_from_source_and_typos_are_told_only_callables(
    write_yaml: WriteYaml,
) -> None:
    """A target is called (a factory, a class, a function) or is a policy object: a module or a literal never is,
    and a typo's hint names what could be one, never an imported module (``np`` for ``nope``)."""
    path = write_yaml(KINDS_OF_NAMES, "envs/line_env.py")
    problems = {name: target_problem(f"{path}:{name}", run_code=False) for name in ("np", "SLOW_IMPORT", "NAMES")}
    assert problems == {
        "np": f"{path}: 'np' is a module, not a function, a class or a policy object",
        "SLOW_IMPORT": f"{path}: 'SLOW_IMPORT' is a value of type int, not a function, a class or a policy object",
        "NAMES": f"{path}: 'NAMES' is a value of type list, not a function, a class or a policy object",
    }
    for name in ("make", "LineEnv", "spaces", "POLICY", "maker"):  # a from-import and a mixed binding may be called
        assert target_problem(f"{path}:{name}", run_code=False) is None, name
    assert target_problem(f"{path}:nope", run_code=False) == f"{path} has no attribute 'nope'"
    assert target_problem(f"{path}:mak", run_code=False) == f"{path} has no attribute 'mak' (did you mean 'make'?)"
    yaml = write_yaml(pipeline("{kind: scripted, target: envs/line_env.py:SLOW_IMPORT}"), "constant.yaml")
    with pytest.raises(SpecError, match=r"constant.yaml:4:\d+: agent.policy.target: .* 'SLOW_IMPORT' is a value of"):
        load_pipeline(yaml, deep=True)


def test_an_imported_modules_names_are_judged_by_what_they_hold(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose names its source cannot tell (a module-level ``__getattr__``) is imported, and its values say
    what can be a target, a name only ``__getattr__`` gives too."""
    write_yaml(
        "import json\nLIMIT = 3\ndef make():\n    return 0\ndef __getattr__(name):\n"
        "    if name == 'lazy':\n        return make\n    if name == 'lazy_limit':\n        return LIMIT\n"
        "    raise AttributeError(name)\n",
        "dyn2/lazy_kinds.py",
    )
    monkeypatch.syspath_prepend(str(write_yaml("", "dyn2/.keep").parent))
    assert (
        target_problem("lazy_kinds:json")
        == "lazy_kinds: 'json' is a module, not a function, a class or a policy object"
    )
    assert target_problem("lazy_kinds:LIMIT") is not None
    assert target_problem("lazy_kinds:lazy") is None
    assert target_problem("lazy_kinds:lazy_limit") == (
        "lazy_kinds: 'lazy_limit' is a value of type int, not a function, a class or a policy object"
    )
    assert target_problem("lazy_kinds:jsn") == "lazy_kinds has no attribute 'jsn'"


def test_a_syntax_error_in_a_target_file_is_reported_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def ok():\n    pass\n\ndef broken(:\n")
    problem = target_problem(f"{tmp_path / 'broken.py'}:ok")
    assert problem is not None
    assert "broken.py:4: syntax error" in problem


def test_a_target_file_importing_a_module_beside_it_that_another_of_its_name_shadows_is_reported(
    tmp_path: Path,
) -> None:
    (tmp_path / "numpy.py").write_text("SPEED = 1\n")
    (tmp_path / "policy.py").write_text("def act(obs):\n    from numpy import SPEED\n\n    return SPEED\n")
    problem = target_problem(f"{tmp_path / 'policy.py'}:act")
    assert problem is not None
    assert f"policy.py imports 'numpy', which is {tmp_path / 'numpy.py'} beside it, but 'numpy' resolves to" in problem
    for name in ("random", "time", "json"):  # the standard library's names: a file of that name is unrelated
        (tmp_path / f"{name}.py").write_text("SPEED = 1\n")
    (tmp_path / "stdlib.py").write_text("import json\nimport random\nimport time\n\n\ndef act(obs):\n    return 0\n")
    assert target_problem(f"{tmp_path / 'stdlib.py'}:act") is None
    (tmp_path / "gymnasium.py").write_text(
        "import gymnasium\n\n\ndef make():\n    return gymnasium.make('CartPole-v1')\n"
    )
    assert target_problem(f"{tmp_path / 'gymnasium.py'}:make") is None, "a file wrapping the package of its name"
    (tmp_path / "numpy.py").rename(tmp_path / "speeds.py")  # a name of its own: nothing shadows it
    (tmp_path / "policy.py").write_text("def act(obs):\n    from speeds import SPEED\n\n    return SPEED\n")
    assert target_problem(f"{tmp_path / 'policy.py'}:act") is None


def test_task_build_arguments_are_sorted_against_the_factory(write_yaml: WriteYaml) -> None:
    path = write_yaml(
        """\
        name: args
        sim:
          factory: CartPole-v1
          args: {max_episode_steps: 50, render_mode: rgb_array}
        agent: {policy: {kind: random}}
        tasks:
          - args: {sutton_barto_reward: true}
          - args: {max_episode_step: 10, num_envs: 2}
        """
    )
    with pytest.raises(SpecError) as raised:
        load_pipeline(path, deep=True)
    problems = raised.value.problems
    assert [(p.line, p.path) for p in problems] == [
        (8, "tasks[1].args.max_episode_step"),
        (8, "tasks[1].args.num_envs"),
    ]
    assert "did you mean 'max_episode_steps'?" in problems[0].message
    assert "'num_envs' is set when the sim starts" in problems[1].message


def test_a_dumped_spec_with_its_matrix_tasks_written_out_locates_a_tasks_problem_at_its_own_entry(
    write_yaml: WriteYaml,
) -> None:
    written = """\
        name: args
        sim: {factory: CartPole-v1}
        agent: {policy: {kind: random}}
        tasks:
          - {name: a, matrix: {sutton_barto_reward: [true]}}
          - {name: b, args: {max_episode_steps: 10}}
        """
    dumped = load_pipeline(write_yaml(written, "written.yaml"))
    assert [t.name for t in dumped.tasks] == ["a", "a-sutton_barto_reward-true", "b"]
    document = dumped.model_dump(mode="json", exclude_unset=True)
    document["tasks"][2]["args"] = {"max_episode_step": 10}
    path = write_yaml(json.dumps(document, indent=1))
    with pytest.raises(SpecError) as raised:
        load_pipeline(path, deep=True)
    assert [p.path for p in raised.value.problems] == ["tasks[2].args.max_episode_step"], "b is the file's third task"


def test_an_existing_contract_must_parse(write_yaml: WriteYaml) -> None:
    write_yaml("{not json", "contracts/cartpole.json")
    path = write_yaml(
        pipeline("{kind: random}").replace("CartPole-v1}", "CartPole-v1, contract: contracts/cartpole.json}")
    )
    with pytest.raises(SpecError) as raised:
        load_pipeline(path, deep=True)
    [problem] = raised.value.problems
    assert problem.path == "sim.contract"
    assert problem.line == 2
    missing = write_yaml(
        pipeline("{kind: random}").replace("CartPole-v1}", "CartPole-v1, contract: new/c.json}"), "m.yaml"
    )
    assert load_pipeline(missing, deep=True).contract_path == missing.parent.resolve() / "new" / "c.json"


def test_a_constant_action_that_does_not_fit_the_contract_file_is_reported(write_yaml: WriteYaml) -> None:
    from hud_pipelines.sim.bridge import GymBridge

    with GymBridge("Pendulum-v1", 1) as bridge:
        write_yaml(bridge.contract.to_json(), "contracts/pendulum.json")
    spec = "name: deep\nsim: {factory: Pendulum-v1, contract: contracts/pendulum.json}\nagent:\n  policy: {policy}\n"
    fits = write_yaml(spec.replace("{policy}", "{kind: constant, value: [0.5]}"), "fits.yaml")
    assert load_pipeline(fits, deep=True).name == "deep"
    too_long = write_yaml(spec.replace("{policy}", "{kind: constant, value: [0.5, 1.0]}"), "long.yaml")
    with pytest.raises(SpecError) as raised:
        load_pipeline(too_long, deep=True)
    [problem] = raised.value.problems
    assert (problem.path, problem.line) == ("agent.policy.value", 4)
    assert "the constant action has 2 entries; the contract" in problem.message
    assert "has 1 (names" in problem.message
    edited = json.loads((too_long.parent / "contracts/pendulum.json").read_text())
    del edited["features"]["action"]  # a run adds the env's action back: validate raised KeyError 'action'
    (too_long.parent / "contracts/pendulum.json").write_text(json.dumps(edited))
    assert load_pipeline(too_long, deep=True).name == "deep"


def test_dataset_state_features_the_contract_file_does_not_have_are_reported(write_yaml: WriteYaml) -> None:
    from hud_pipelines.sim.bridge import GymBridge

    with GymBridge("Pendulum-v1", 1) as bridge:
        write_yaml(bridge.contract.to_json(), "contracts/pendulum.json")
    spec = (
        "name: deep\nsim: {factory: Pendulum-v1, contract: contracts/pendulum.json}\nagent:\n  policy: {kind: random}\n"
        "dataset:\n  state_features: [{names}]\n"
    )
    assert load_pipeline(write_yaml(spec.replace("{names}", "state"), "fits.yaml"), deep=True).name == "deep"
    with pytest.raises(SpecError) as raised:
        load_pipeline(write_yaml(spec.replace("{names}", "state, joints"), "unknown.yaml"), deep=True)
    [problem] = raised.value.problems
    assert (problem.path, problem.line) == ("dataset.state_features", 6)
    assert "does not fit the contract" in problem.message
    assert "state_features ['joints'] are not non-camera observation features (those are ['state'])" in problem.message


def test_a_factory_module_that_fails_to_import_is_reported(write_yaml: WriteYaml) -> None:
    write_yaml("raise ValueError('broken factory module')\ndef make():\n    pass\n", "envs_broken.py")
    path = write_yaml("name: f\nsim: {factory: envs_broken.py:make}\nagent: {policy: {kind: random}}\n")
    with pytest.raises(SpecError, match="raised ValueError: broken factory module"):
        load_pipeline(path, deep=True)


def test_deep_validation_keeps_stdout_clean(write_yaml: WriteYaml, capsys: pytest.CaptureFixture[str]) -> None:
    write_yaml("print('noise from an env module')\ndef make(num_envs=1):\n    pass\n", "noisy_env.py")
    path = write_yaml("name: n\nsim: {factory: noisy_env.py:make}\nagent: {policy: {kind: random}}\n")
    load_pipeline(path, deep=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "noise from an env module" in captured.err


def test_shallow_loading_does_not_resolve_anything(write_yaml: WriteYaml) -> None:
    path = write_yaml(pipeline("{kind: scripted, target: nowhere.at_all:fn}").replace("CartPole-v1", "Nope-v9"))
    assert load_pipeline(path).factory == "Nope-v9"


def test_a_factory_typo_is_reported_beside_the_files_other_problems(write_yaml: WriteYaml) -> None:
    text = "name: Bad-Name\nsim: {factory: CartPole-v9}\nagent: {policy: {kind: random}}\n"
    with pytest.raises(SpecError) as caught:
        load_pipeline(write_yaml(text, "two.yaml"), deep=True)
    assert [p.path for p in caught.value.problems] == ["name", "sim.factory"]
    assert "unknown gymnasium registry id 'CartPole-v9'; did you mean CartPole-v1" in caught.value.problems[1].message
    beside = "name: Bad-Name\nsim: {factory: CartPole-v9, num_envs: 0}\nagent: {policy: {kind: random}}\n"
    with pytest.raises(SpecError) as caught:  # a problem of the sim section: the factory is not tried
        load_pipeline(write_yaml(beside, "three.yaml"), deep=True)
    assert [p.path for p in caught.value.problems] == ["name", "sim.num_envs"]
    with pytest.raises(SpecError) as caught:
        load_pipeline(write_yaml(text, "shallow.yaml"), deep=False)
    assert [p.path for p in caught.value.problems] == ["name"]


def test_a_torch_checkpoint_that_is_no_torch_save_file_is_found_before_a_run(write_yaml: WriteYaml) -> None:
    """Its bytes are read, not loaded (torch is not imported): empty, a zip archive cut short, or neither
    a zip archive nor a legacy pickle; a file torch.save wrote passes."""
    import torch

    write_yaml("class Net:\n    pass\n", "nets.py")
    saved = write_yaml("", "weights/saved.pt")
    torch.save({"w": torch.zeros(2)}, saved)
    bad = {
        "empty.pt": (b"", "empty.pt is empty"),
        "notes.pt": (b"not a checkpoint\n", "notes.pt is not a file torch.save writes"),
        "cut.pt": (saved.read_bytes()[:64], "cut.pt is truncated (its zip archive has no end record)"),
    }
    for name, (content, message) in bad.items():
        (saved.parent / name).write_bytes(content)
        path = write_yaml(pipeline(f"{{kind: torch, target: nets.py:Net, checkpoint: weights/{name}}}"), "bad.yaml")
        with pytest.raises(SpecError) as raised:
            load_pipeline(path, deep=True)
        [problem] = raised.value.problems
        assert problem.path == "agent.policy.checkpoint"
        assert message in problem.message
    good = write_yaml(pipeline("{kind: torch, target: nets.py:Net, checkpoint: weights/saved.pt}"), "good.yaml")
    assert load_pipeline(good, deep=True).name == "deep"


def test_a_project_folder_without_init_passed_over_for_a_package_of_its_name_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's ``envs/`` without ``__init__.py`` loses to any regular ``envs`` package on ``sys.path`` (this
    checkout's own, in an editable install): the error named a module of that package as what was meant."""
    elsewhere = tmp_path / "site" / "shadowed_envs"
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("")
    (elsewhere / "policies.py").write_text("")
    project = tmp_path / "project"
    (project / "shadowed_envs").mkdir(parents=True)
    (project / "shadowed_envs" / "reach.py").write_text("def make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "shadowed_envs", raising=False)
    problem = target_problem("shadowed_envs.reach:make", project)
    assert problem is not None
    assert problem.startswith("cannot import module 'shadowed_envs.reach': no module")
    assert (
        f"'shadowed_envs' is {elsewhere / '__init__.py'}, not the project's {project / 'shadowed_envs'}, which has "
        f"no __init__.py: a package of that name elsewhere wins over such a folder (add "
        f"{project / 'shadowed_envs' / '__init__.py'}, or rename the folder)"
    ) in problem
    (project / "shadowed_envs" / "__init__.py").write_text("")
    monkeypatch.delitem(sys.modules, "shadowed_envs", raising=False)
    assert target_problem("shadowed_envs.reach:make", project) is None, "a package of the project's own wins"
