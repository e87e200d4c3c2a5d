"""``sim.data_files``: the files a spawned sim reads besides its code, found before a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from hud_pipelines.spec.loader import load_file, load_pipeline_to_run
from hud_pipelines.spec.problems import SpecError
from hud_pipelines.spec.sim_files import expand


def _pipeline(tmp_path: Path, sim: str) -> Path:
    path = tmp_path / "scene.yaml"
    path.write_text(f"name: scene\nsim:\n{sim}\nagent:\n  policy: {{kind: random}}\n")
    return path


def test_data_files_are_files_folders_and_glob_patterns_each_file_once(tmp_path: Path) -> None:
    """Through a symbolic link to a shared folder (each real folder once), in a pipeline folder whose name is a
    glob pattern, without what Python or an editor writes beside the data (it would make every result stale)."""
    base = tmp_path / "project[1]"
    (base / "assets" / "__pycache__").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "hand.stl").write_text("hand")
    (base / "assets" / "meshes").symlink_to(tmp_path / "shared")
    (base / "assets" / "loop").symlink_to(base / "assets")
    for name in ("scene.json", "assets/robot.xml", "assets/.robot.xml.swp", "assets/__pycache__/m.cpython-312.pyc"):
        (base / name).write_text(name)
    found = expand(["scene.json", "assets", "assets/**/*.stl"], base)
    names = [path.relative_to(tmp_path).as_posix() for path in found]
    assert names == ["project[1]/scene.json", "project[1]/assets/robot.xml", "shared/hand.stl"]


def test_a_data_file_that_names_no_file_is_refused_at_its_line_by_validate_and_run(tmp_path: Path) -> None:
    """A typo would leave the file it meant untracked: its edits would pool results of two scenes again."""
    (tmp_path / "scene.json").write_text("{}")
    sim = "  factory: CartPole-v1\n  data_files:\n    - scene.json\n    - scnee.json\n"
    pipeline = _pipeline(tmp_path, sim)
    [problem] = load_file(pipeline, deep=True).problems
    assert (problem.path, problem.line) == ("sim.data_files[1]", 6), problem
    assert problem.message == f"'scnee.json' names no file under {tmp_path}"
    with pytest.raises(SpecError, match=r"sim\.data_files\[1\]: 'scnee.json' names no file"):
        load_pipeline_to_run(pipeline)


def test_a_served_sims_data_files_are_its_servers(tmp_path: Path) -> None:
    sim = "  url: ws://simhost:8765\n  token: t\n  data_files: [scene.json]\n"
    problems = load_file(_pipeline(tmp_path, sim), deep=False).problems
    assert any("'data_files' configures a spawned sim" in p.message for p in problems), problems


def test_a_hidden_file_named_exactly_is_tracked_and_a_listed_modules_imports_are_followed(tmp_path: Path) -> None:
    """``.scene.json`` named exactly was refused as no file; ``plugin.py`` (imported by name at run time) was digested
    alone, so an edit of the helper it imports kept the earlier results current."""
    from hud_pipelines.eval.sources import data_file_digests
    from hud_pipelines.spec.loader import load_pipeline

    (tmp_path / ".scene.json").write_text("{}")
    (tmp_path / "plugin.py").write_text("from helper_of_plugin import T\n")
    (tmp_path / "helper_of_plugin.py").write_text("T = 3.0\n")
    assert expand([".scene.json"], tmp_path) == [(tmp_path / ".scene.json").resolve()]
    sim = "  factory: CartPole-v1\n  data_files: [.scene.json, plugin.py]\n"
    spec = load_pipeline(_pipeline(tmp_path, sim), deep=True)
    assert sorted(data_file_digests(spec)) == [".scene.json", "helper_of_plugin.py", "plugin.py"]
