"""Targets (``module:name``, ``path/to/file.py:name``) load as their files read now, in a process that lives on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec.target_check import target_problem
from hud_pipelines.targets import load_target, target_sources


@pytest.fixture(name="folder")
def folder_fixture(tmp_path: Path) -> Iterator[Path]:
    """A folder of the test's own modules; what they add to ``sys.modules`` and ``sys.path`` goes with it."""
    modules, path = set(sys.modules), list(sys.path)
    yield tmp_path
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.path[:] = path


def test_a_file_target_edited_after_it_was_loaded_runs_as_edited_even_within_the_same_second(folder: Path) -> None:
    policy = folder / "edited_policy.py"
    policy.write_text("def act():\n    return 1\n")
    assert load_target("edited_policy.py:act", base_dir=folder)() == 1
    stat = policy.stat()
    policy.write_text("def act():\n    return 2\n")  # same size; the mtime may be the same second
    assert policy.stat().st_size == stat.st_size
    assert load_target("edited_policy.py:act", base_dir=folder)() == 2
    assert load_target("edited_policy.py:act", base_dir=folder)() == 2, "and it stays so"


def test_a_module_target_whose_helper_beside_it_was_edited_runs_the_edited_helper(folder: Path) -> None:
    _write(
        folder,
        {
            "edited_pkg/__init__.py": "",
            "edited_pkg/policy.py": "GAIN = 1\n\n\ndef act():\n    return GAIN\n",
            "plain_helper.py": "from deeper_helper import BASE\n\nSCALE = 10 * BASE\n",
            "deeper_helper.py": "BASE = 1\n",
            "scaled.py": "from plain_helper import SCALE\n\n\ndef act():\n    return SCALE\n",
        },
    )
    assert load_target("edited_pkg.policy:act", base_dir=folder)() == 1
    assert load_target("scaled:act", base_dir=folder)() == 10
    _write(folder, {"deeper_helper.py": "BASE = 2\n"})
    assert load_target("scaled:act", base_dir=folder)() == 20, "the helper's helper is read again, then the rest"
    _write(folder, {"edited_pkg/policy.py": "GAIN = 1\n\n\ndef act():\n    return -GAIN\n"})
    assert load_target("edited_pkg.policy:act", base_dir=folder)() == -1


def test_an_unchanged_target_is_not_executed_again(folder: Path) -> None:
    (folder / "counted.py").write_text("import itertools\n\nLOADS = itertools.count()\n\n\ndef act():\n    return 0\n")
    first = load_target("counted:act", base_dir=folder)
    again = load_target("counted:act", base_dir=folder)
    assert first is again, "the same function object: the module ran once"
    assert next(sys.modules["counted"].LOADS) == 0


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def _clashing_checkout(folder: Path) -> tuple[Path, Path]:
    """A project with its own ``clash_pkg`` package, and another checkout on ``sys.path`` holding one of that name
    (as an editable install's checkout holds ``envs``): ``(project, checkout)``."""
    _write(
        folder,
        {
            "checkout/clash_pkg/__init__.py": "",
            "checkout/clash_pkg/controllers.py": "WHOSE = 'the checkout'\n",
            "project/clash_pkg/__init__.py": "",
            "project/clash_pkg/controllers.py": "WHOSE = 'the project'\n",
            "project/clash_pkg/mine.py": "WHOSE = 'the project, only'\n\ndef make():\n    return WHOSE\n",
            "project/pipelines/.keep": "",
        },
    )
    sys.path.append(str(folder / "checkout"))  # where a .pth file puts it: after the interpreter's own paths
    return folder / "project", folder / "checkout"


def test_a_projects_own_package_wins_over_one_of_the_same_name_already_on_sys_path(folder: Path) -> None:
    """As ``python -m`` puts the working directory first; a console script does not, and the checkout won."""
    project, _ = _clashing_checkout(folder)
    pipelines = project / "pipelines"
    assert load_target("clash_pkg.mine:WHOSE", base_dir=pipelines) == "the project, only"
    assert load_target("clash_pkg.controllers:WHOSE", base_dir=pipelines) == "the project"
    assert sys.path[0] == str(project)
    assert target_sources("clash_pkg.controllers:WHOSE", pipelines)[0] == project / "clash_pkg" / "controllers.py"
    assert target_problem("clash_pkg.mine:make", pipelines) is None, "validate finds what the run imports"


def test_a_package_of_the_projects_name_imported_from_elsewhere_before_is_named_not_used(folder: Path) -> None:
    project, checkout = _clashing_checkout(folder)
    assert load_target("clash_pkg.controllers:WHOSE", base_dir=checkout) == "the checkout"
    said = (
        f"cannot import module 'clash_pkg.controllers': the project's 'clash_pkg' is {project / 'clash_pkg'}, but "
        f"this process imported 'clash_pkg' from {checkout / 'clash_pkg'} before"
    )
    with pytest.raises(HudPipelinesError, match=re.escape(said)):
        load_target("clash_pkg.controllers:WHOSE", base_dir=project / "pipelines")
    assert target_problem("clash_pkg.controllers:WHOSE", project / "pipelines") == (
        f"{said} (one module per name: an installed package or another checkout of that name); rename one of them"
    )


def test_a_console_script_sim_server_imports_the_projects_package_too(folder: Path) -> None:
    """``hud-pipelines serve`` (a console script: no working directory on ``sys.path``) run in a project."""
    project, checkout = _clashing_checkout(folder)
    _write(
        project, {"clash_pkg/sims.py": "import gymnasium as gym\n\n\ndef make():\n    return gym.make('CartPole-v1')\n"}
    )
    command = [str(Path(sys.executable).parent / "hud-pipelines"), "serve", "clash_pkg.sims:make"]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    process = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert json.loads(ready or b"{}").get("url", "").startswith("ws://"), process.stderr and process.stderr.read()
    finally:
        process.kill()
        process.communicate(timeout=20)


def test_a_missing_names_hint_offers_what_could_be_a_target_never_an_imported_module(folder: Path) -> None:
    (folder / "line_env.py").write_text("import numpy as np\nSTEPS = 3\n\ndef make():\n    return 0\n")
    with pytest.raises(HudPipelinesError) as raised:
        load_target(f"{folder / 'line_env.py'}:nope")
    assert str(raised.value).endswith("line_env.py has no attribute 'nope'"), "not 'did you mean np?'"
    with pytest.raises(HudPipelinesError, match="has no attribute 'mkae'; did you mean make"):
        load_target(f"{folder / 'line_env.py'}:mkae")


def test_a_hint_never_runs_an_objects_own_getattr(folder: Path) -> None:
    """Whether a module's value can be a policy is looked up statically: an attribute dict (``__getattr__`` raising
    ``KeyError``) once broke a plain typo's message, and validation of a module that imports it with ``*``."""
    (folder / "attr_policies.py").write_text(
        "class Config(dict):\n    __getattr__ = dict.__getitem__\n\ncfg = Config(a=1)\n\ndef make_policy():\n"
        "    return None\n"
    )
    (folder / "star_policies.py").write_text("from attr_policies import *\n")
    sys.path.insert(0, str(folder))
    with pytest.raises(HudPipelinesError, match="has no attribute 'make_polcy'; did you mean make_policy"):
        load_target("attr_policies:make_polcy")
    assert target_problem("star_policies:make_polcy") == (
        "star_policies has no attribute 'make_polcy' (did you mean 'make_policy'?)"
    )
    assert target_problem("star_policies:cfg") == (
        "star_policies: 'cfg' is a value of type Config, not a function, a class or a policy object"
    )
