"""Targets (``module:name``, ``path/to/file.py:name``) load as their files read now, in a process that lives on."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hud_pipelines.targets import load_target


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
