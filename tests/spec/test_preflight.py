"""What ``hud-pipelines run`` refuses before it starts anything: the deep checks that run none of the user's code."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hud_pipelines.spec import SpecError
from hud_pipelines.spec.loader import load_pipeline_to_run

WriteYaml = Callable[..., Path]

ENV_MODULE = """\
import gymnasium as gym

open(__file__ + ".ran", "w").close()  # marks that the module was run


def make_env(num_envs=1):
    return gym.make("CartPole-v1")
"""

POLICY_MODULE = """\
class Gain:
    def __init__(self, gain: float = 1.0) -> None:
        self.gain = gain

    def __call__(self, observation):
        return observation


def passes(rows, trace=None):
    return True
"""


def _refused(path: Path) -> tuple[str, int, str]:
    with pytest.raises(SpecError) as raised:
        load_pipeline_to_run(path)
    [problem] = raised.value.problems
    return problem.path, problem.line, problem.message


def test_a_run_refuses_at_the_yamls_line_what_validate_finds_without_running_the_users_code(
    write_yaml: WriteYaml,
) -> None:
    """Before, a run checked only that ``file.py`` targets exist: a misspelled factory name or registry id, a
    policy argument or a grader target started a Dagster run and a sim per instance, and ended in errored rows
    (``sim_start``, ``setup``) with no line of the file, exit status 1 where ``validate`` said the line."""
    module = write_yaml(ENV_MODULE, "my_envs.py")
    write_yaml(POLICY_MODULE, "my_policies.py")
    head = "name: p\nsim: {factory: FACTORY}\n"
    policy = "agent: {policy: {kind: scripted, target: my_policies.py:Gain, args: {gain: 2}}}\n"
    graders = "graders: [{kind: callable, target: my_policies.py:passes}]\n"

    def pipeline(factory: str = "my_envs.py:make_env", policy: str = policy, graders: str = graders) -> Path:
        return write_yaml(head.replace("FACTORY", factory) + policy + graders, "p.yaml")

    assert load_pipeline_to_run(pipeline()).name == "p"
    assert load_pipeline_to_run(pipeline("CartPole-v1")).name == "p"
    path, line, message = _refused(pipeline("my_envs.py:make_envv"))
    assert (path, line) == ("sim.factory", 2)
    assert message.endswith("has no attribute 'make_envv' (did you mean 'make_env'?)"), message
    path, line, message = _refused(pipeline("CartPol-v1"))
    assert (path, line) == ("sim.factory", 2)
    assert message.startswith("unknown gymnasium registry id 'CartPol-v1'; did you mean CartPole-v1"), message
    assert _refused(pipeline(policy=policy.replace("{gain: 2}", "{gainn: 2}")))[:2] == ("agent.policy.args.gainn", 3)
    path, line, message = _refused(pipeline(graders=graders.replace("passes", "pases")))
    assert (path, line) == ("graders[0].target", 4)
    assert "has no attribute 'pases' (did you mean 'passes'?)" in message
    assert not Path(f"{module}.ran").exists(), "the sim's module is the sim's to run: read, never imported here"


def test_what_cannot_be_read_without_running_it_is_left_to_the_run(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose names are made at run time, a namespaced registry id (its package registers it in the sim)
    and a sim of another interpreter are the sim's to resolve: a run does not import them to look."""
    write_yaml("def __getattr__(name):\n    raise AttributeError(name)\n", "dynamic/lazy_envs.py")
    monkeypatch.syspath_prepend(str(write_yaml("", "dynamic/.keep").parent))
    for factory in ("lazy_envs:make", "not_imported_pkg/Env-v0"):
        path = write_yaml(f"name: p\nsim: {{factory: '{factory}'}}\nagent: {{policy: {{kind: random}}}}\n")
        assert load_pipeline_to_run(path).factory == factory
    assert "lazy_envs" not in sys.modules
    assert "not_imported_pkg" not in sys.modules


def test_a_dataset_section_the_contract_file_does_not_fit_is_refused_before_the_run(write_yaml: WriteYaml) -> None:
    """Before, the run's first step failed with a chained DatasetFitError (a raw traceback under ``dagster job
    execute``), naming no key."""
    from hud_pipelines.sim.bridge import GymBridge

    with GymBridge("Pendulum-v1", 1) as bridge:
        write_yaml(bridge.contract.to_json(), "contracts/pendulum.json")
    path = write_yaml(
        "name: p\nsim: {factory: Pendulum-v1, contract: contracts/pendulum.json}\nagent: {policy: {kind: random}}\n"
        "dataset: {state_features: [nope]}\n"
    )
    where, line, message = _refused(path)
    assert (where, line) == ("dataset.state_features", 4)
    assert "state_features ['nope'] are not non-camera observation features" in message


def test_a_module_in_a_package_is_read_without_running_the_packages_init(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, finding ``my_tasks.envs`` imported ``my_tasks`` (``importlib.util.find_spec``), whose ``__init__``
    may import the sim's own stack (MuJoCo, Isaac) into the process that runs the eval."""
    init = write_yaml('open(__file__ + ".ran", "w").close()\n', "project/my_tasks/__init__.py")
    envs = write_yaml(ENV_MODULE, "project/my_tasks/envs.py")
    write_yaml(POLICY_MODULE, "project/my_tasks/policies.py")
    monkeypatch.syspath_prepend(str(init.parent.parent))
    policy = "agent: {policy: {kind: scripted, target: 'my_tasks.policies:Gain', args: {gain: 2}}}\n"

    def pipeline(factory: str, args: str = "{gain: 2}") -> Path:
        text = f"name: p\nsim: {{factory: '{factory}'}}\n" + policy.replace("{gain: 2}", args)
        return write_yaml(text, "project/p.yaml")

    assert load_pipeline_to_run(pipeline("my_tasks.envs:make_env")).name == "p"
    path, _, message = _refused(pipeline("my_tasks.envs:make_envv"))
    assert (path, message) == ("sim.factory", "my_tasks.envs has no attribute 'make_envv' (did you mean 'make_env'?)")
    assert _refused(pipeline("my_tasks.envs:make_env", "{gainn: 2}"))[0] == "agent.policy.args.gainn"
    assert _refused(pipeline("my_tasks.envz:make_env"))[2] == (
        "cannot import module 'my_tasks.envz': no module named 'my_tasks.envz' (did you mean 'envs'?)"
    )
    assert _refused(pipeline("my_taskz.envs:make_env"))[2].startswith("cannot import module 'my_taskz.envs': no ")
    init.write_text("__path__.append('/elsewhere')\n" + init.read_text())  # it may add places when it runs
    assert load_pipeline_to_run(pipeline("my_tasks.envz:make_env")).name == "p", "left to the run, which runs it"
    assert not Path(f"{init}.ran").exists(), "the package's __init__ never ran"
    assert not Path(f"{envs}.ran").exists(), "nor its module"
    assert "my_tasks" not in sys.modules


def test_a_sim_of_its_own_interpreter_still_needs_its_factory_file(write_yaml: WriteYaml) -> None:
    path = write_yaml(
        f"name: p\nsim: {{factory: ./nowhere.py:make, python: {sys.executable}}}\nagent: {{policy: {{kind: random}}}}\n"
    )
    where, _, message = _refused(path)
    assert where == "sim.factory"
    assert message.startswith("file "), message
    assert message.endswith("nowhere.py does not exist"), message


def test_a_lerobot_policy_path_that_is_no_policy_folder_is_refused_naming_the_folder_meant(
    write_yaml: WriteYaml,
) -> None:
    """A lerobot-train run or step folder passed ``validate`` and failed every instance once the sims had started
    ("no config.json"), the YAML's line unsaid."""
    config = write_yaml("{}", "project/train/checkpoints/000100/pretrained_model/config.json")
    step = config.parent.parent
    run = step.parent.parent

    def pipeline(folder: Path) -> Path:
        policy = f"{{policy: {{kind: lerobot, path: '{folder}'}}}}"
        return write_yaml(f"name: p\nsim: {{factory: CartPole-v1}}\nagent: {policy}\n", "project/p.yaml")

    where, line, message = _refused(pipeline(run))
    assert (where, line) == ("agent.policy.path", 3)
    assert message == (
        f"{run} is a lerobot-train run: name one checkpoint ({run / 'checkpoints'}/<step>/pretrained_model), or "
        f"evaluate every checkpoint with 'checkpoints: {run}' (a sweep)"
    )
    assert _refused(pipeline(step))[2] == f"{step} is a lerobot-train step folder: name its policy, {config.parent}"
    assert _refused(pipeline(run / "checkpoints"))[2] == (
        f"{run / 'checkpoints'} is not a pretrained LeRobot policy folder (no config.json)"
    )
    assert load_pipeline_to_run(pipeline(config.parent)).name == "p"


def test_what_a_deployment_file_replaces_is_not_the_yamls_to_judge(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A YAML's spawned sim whose module lives on the sim host, served there by the deployment file's ``url``:
    the run has no such module to read, and needs none."""
    from hud_pipelines.dagster.deployed import deployed_spec

    path = write_yaml("name: p\nsim: {factory: 'isaac_tasks:make'}\nagent: {policy: {kind: random}}\n")
    assert _refused(path)[2].startswith("cannot import module 'isaac_tasks'")
    deployment = write_yaml(
        "pipelines:\n  p:\n    sim: {factory: null, args: {}, url: 'ws://isaac-box:8765', token: t}\n"
        "    contract: {file: null}\n",
        "deployment.yaml",
    )
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    spec = load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent))
    assert spec.factory == "isaac_tasks:make", "the YAML's spec, as it is"


def test_a_sim_factory_a_deployment_file_spawns_in_place_of_the_yamls_is_judged_before_the_run(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``factory: CartPol-v1`` in a deployment file started a Dagster run whose every episode errored as
    ``sim_start``, replacing the earlier good results; the same typo in the YAML is refused before anything runs."""
    from hud_pipelines.dagster.deployed import deployed_spec

    path = write_yaml("name: p\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: random}}\n")
    deployment = write_yaml("pipelines:\n  p:\n    sim: {factory: CartPol-v1}\n", "deployment.yaml")
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    with pytest.raises(SpecError) as refused:
        load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent))
    said = str(refused.value)
    assert "the run's configuration (run config or deployment file): sim.factory:" in said, said
    assert "CartPol-v1" in said
    deployment.write_text("pipelines:\n  p:\n    sim: {factory: Pendulum-v1}\n")
    assert load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent)).name == "p"
    deployment.write_text("pipelines:\n  p:\n    sim: {data_files: [nothere.json]}\n")  # its files, checked too
    with pytest.raises(SpecError, match=r"configuration .*: sim\.data_files\[0\]: 'nothere.json' names no file"):
        load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent))


def test_a_policy_the_deployment_leaves_as_it_is_is_judged_at_the_yamls_line_and_one_it_replaces_as_its_own(
    write_yaml: WriteYaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment that set only ``agent: {torch_threads: 4}`` left the YAML's policy unjudged (the whole agent
    section had changed); a policy it replaces is judged too, said as the run's configuration (no YAML line)."""
    from hud_pipelines.dagster.deployed import deployed_spec

    path = write_yaml(
        "name: p\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: scripted, target: 'envs.controllers:Nope'}}\n"
    )
    deployment = write_yaml("pipelines:\n  p:\n    agent: {torch_threads: 4}\n", "deployment.yaml")
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    with pytest.raises(SpecError) as kept:
        load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent))
    assert f"{path}:3:" in str(kept.value), "at the YAML's line"
    assert "agent.policy.target: envs.controllers has no attribute 'Nope'" in str(kept.value)

    path.write_text("name: p\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: random}}\n")
    deployment.write_text("pipelines:\n  p:\n    agent: {policy: {kind: scripted, target: 'envs.controllers:Nope'}}\n")
    with pytest.raises(SpecError) as replaced:
        load_pipeline_to_run(path, as_deployed=lambda yaml: deployed_spec(yaml, path.parent))
    said = str(replaced.value)
    assert "the run's configuration (run config or deployment file): agent.policy.target: envs.controllers" in said
