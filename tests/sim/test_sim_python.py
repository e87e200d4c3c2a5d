"""``sim.python``: a sim child runs under another interpreter, with only the sim side of this package.

The second interpreters are virtual environments made here in milliseconds (``venv --without-pip``)
that see this environment's packages through a ``.pth`` file: torch is importable there, so a child
that does not import it shows that the serving path never does. Leaving one package out of that
view makes an interpreter that lacks a module the child needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.errors import SimStartError
from hud_pipelines.eval.runner import sim_settings
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.spec.loader import load_pipeline
from tests.conftest import REPO

Spawn = Callable[..., SimProcess]
REPORTING = f"{REPO / 'tests' / 'sim' / 'sims.py'}:reporting_cartpole"
HEAVY_MODULES = ("torch", "lerobot", "dagster")


def make_environment(project: Path, *, without: frozenset[str] = frozenset()) -> Path:
    """A uv-project-like directory whose ``.venv`` sees this environment's packages except ``without``."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    view = project / "packages"
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.suffix != ".pth" and entry.name.split("-")[0] not in without:
            (view / entry.name).symlink_to(entry)
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    (site_packages / "agent_packages.pth").write_text(f"{view}\n")
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory with a ``.venv`` in which torch is importable."""
    root = tmp_path_factory.mktemp("sim-env")
    make_environment(root)
    return root


def served_by(report: Path) -> dict[str, Any]:
    return json.loads(report.read_text())


def test_the_child_runs_under_the_given_interpreter_and_never_imports_torch(
    spawn: Spawn, project: Path, tmp_path: Path
) -> None:
    python = project / ".venv" / "bin" / "python"
    torch_importable = subprocess.run(
        [python, "-c", "import importlib.util as u; assert u.find_spec('torch')"], check=False
    )
    assert torch_importable.returncode == 0, "the test interpreter should be able to import torch"
    report = tmp_path / "served.json"
    sim = spawn(REPORTING, build_args={"report": str(report)}, python=python)
    with sim.connect() as client:
        client.reset({"seed": 0})
        client.step([[1]])
    facts = served_by(report)
    assert facts["executable"] == str(python)
    assert facts["executable"] != sys.executable
    assert Path(facts["prefix"]) == project / ".venv"
    modules = set(facts["modules"])
    assert "hud_pipelines.sim.serve" in modules
    assert not [m for m in HEAVY_MODULES if m in modules]


def test_a_project_directory_runs_its_venv_python(spawn: Spawn, project: Path, tmp_path: Path) -> None:
    report = tmp_path / "served.json"
    sim = spawn(REPORTING, build_args={"report": str(report)}, python=project)
    with sim.connect() as client:
        client.reset({"seed": 0})
    assert served_by(report)["executable"] == str(project / ".venv" / "bin" / "python")


def test_the_child_imports_this_checkout_even_from_another_directory(
    spawn: Spawn, project: Path, tmp_path: Path
) -> None:
    report = tmp_path / "served.json"
    sim = spawn(REPORTING, build_args={"report": str(report)}, python=project, cwd=tmp_path, env={"PYTHONPATH": ""})
    with sim.connect() as client:
        client.reset({"seed": 0})
    assert served_by(report)["executable"] == str(project / ".venv" / "bin" / "python")


def test_a_missing_interpreter_is_a_start_up_error_naming_it(spawn: Spawn, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(SimStartError, match=f"sim interpreter {missing} does not exist"):
        spawn(REPORTING, build_args={"report": "unused"}, python=missing)


def test_a_directory_without_an_environment_says_how_to_create_it(spawn: Spawn, tmp_path: Path) -> None:
    with pytest.raises(SimStartError) as caught:
        spawn(REPORTING, build_args={"report": "unused"}, python=tmp_path)
    message = str(caught.value)
    assert f"sim interpreter {tmp_path / '.venv' / 'bin' / 'python'} does not exist" in message
    assert f"uv sync --project {tmp_path}" in message


def test_a_file_that_is_not_executable_is_refused(spawn: Spawn, tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(SimStartError, match=f"sim interpreter {script} is not an executable file"):
        spawn(REPORTING, build_args={"report": "unused"}, python=script)


def test_an_interpreter_without_a_needed_module_names_it_and_how_to_install_it(spawn: Spawn, tmp_path: Path) -> None:
    project = tmp_path / "no-msgpack"
    python = make_environment(project, without=frozenset({"msgpack"}))
    with pytest.raises(SimStartError) as caught:
        spawn(REPORTING, build_args={"report": "unused"}, python=project)
    error = caught.value
    assert error.child_error == "ModuleNotFoundError: No module named 'msgpack'"
    message = str(error)
    assert message.startswith(error.child_error)
    assert f"the sim interpreter {python} has no module 'msgpack'" in message
    assert f"uv pip install --python {python} msgpack" in message
    assert f"uv sync --project {project}" in message


def write_yaml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_sim_python_is_resolved_against_the_yaml_file(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "pipelines" / "p.yaml",
        "name: p\nsim: {factory: CartPole-v1, python: ../sims/cartpole}\nagent: {policy: {kind: random}}\n",
    )
    assert sim_settings(load_pipeline(path)).python == tmp_path / "sims" / "cartpole"
    default = write_yaml(tmp_path / "q.yaml", "name: q\nsim: {factory: CartPole-v1}\nagent: {policy: {kind: random}}\n")
    assert sim_settings(load_pipeline(default)).python is None


def test_sim_python_belongs_to_a_spawned_sim(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "p.yaml",
        "name: p\nsim: {url: 'ws://h:1', token: t, python: ../env}\nagent: {policy: {kind: random}}\n",
    )
    with pytest.raises(Exception, match="'python' configures a spawned sim"):
        load_pipeline(path)


def test_a_pipeline_runs_its_sim_under_sim_python(project: Path, tmp_path: Path) -> None:
    from hud_pipelines.eval.steps import evaluate

    report = tmp_path / "served.json"
    text = json.dumps(
        {
            "name": "other_python",
            "sim": {"factory": REPORTING, "python": str(project), "args": {"report": str(report)}},
            "agent": {"policy": {"kind": "random"}},
            "max_steps": 5,
            "graders": [{"kind": "return", "threshold": 1}],
        }
    )
    spec = load_pipeline(write_yaml(tmp_path / "pipelines" / "other_python.yaml", text))
    evaluation = evaluate(spec, outputs_dir=tmp_path / "outputs", project_dir=REPO)
    assert not evaluation.failed_instances
    assert evaluation.summary.scheduled == 1
    assert served_by(report)["executable"] == str(project / ".venv" / "bin" / "python")


def test_validate_finds_a_sim_python_that_is_not_set_up(tmp_path: Path) -> None:
    import argparse
    import io

    from hud_pipelines.cli.validate import add_validate_arguments, run_validate

    path = write_yaml(
        tmp_path / "pipelines" / "p.yaml",
        "name: p\nsim:\n  factory: CartPole-v1\n  python: ../sims/none\nagent: {policy: {kind: random}}\n",
    )
    parser = argparse.ArgumentParser()
    add_validate_arguments(parser)
    out = io.StringIO()
    assert run_validate(parser.parse_args([str(path)]), out) == 1
    output = out.getvalue()
    assert f"p.yaml:4:11: sim.python: sim interpreter {tmp_path / 'sims' / 'none'} does not exist" in output


def test_another_interpreter_is_another_configuration(tmp_path: Path) -> None:
    text = "name: p\nsim: {factory: CartPole-v1%s}\nagent: {policy: {kind: random}}\n"
    agents = load_pipeline(write_yaml(tmp_path / "a.yaml", text % ""))
    own = load_pipeline(write_yaml(tmp_path / "b.yaml", text % ", python: ../sims/cartpole"))
    other = load_pipeline(write_yaml(tmp_path / "c.yaml", text % ", python: ../sims/other"))
    assert len({agents.rollout_hash, own.rollout_hash, other.rollout_hash}) == 3
