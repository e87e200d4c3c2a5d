"""The files a sim section names, found before a run: its interpreter, its fleet file, its data files.

``sim.data_files`` lists the files a sim reads besides its Python code. A sim's numbers may depend on
files its imports do not name: a MuJoCo XML and its meshes, a JSON scene, a module it imports by name
at run time. The provenance follows a target's imports on its own
(:func:`~hud_pipelines.targets.target_sources`); these files it cannot see, so the YAML lists them, and
their content joins the results' fingerprint as the code's does (:mod:`hud_pipelines.eval.sources`).
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec.document import YamlDocument
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem

MAX_DATA_FILES = 10_000
"""The most files the patterns are expanded to: a sim's assets, not a disk (each is read whole every run)."""


def expand(patterns: Sequence[str], base_dir: Path) -> list[Path]:
    """The files ``patterns`` name, relative to ``base_dir``: a file, every file below a folder, or what a glob
    pattern (``**`` for any depth) matches; each once, in order, at most :data:`MAX_DATA_FILES`."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        for name in sorted(glob.glob(str(base_dir / Path(pattern).expanduser()), recursive=True)):
            path = Path(name).resolve()
            below = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            found.update(dict.fromkeys(below))
            if len(found) >= MAX_DATA_FILES:
                return list(found)[:MAX_DATA_FILES]
    return list(found)


def data_file_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """Each ``sim.data_files`` entry that names no file: a typo would leave the file it meant untracked."""
    return [
        document.problem(("sim", "data_files", index), f"{pattern!r} names no file under {spec.base_dir}")
        for index, pattern in enumerate(spec.sim.data_files)
        if not expand([pattern], spec.base_dir)
    ]


def python_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A ``sim.python`` that names no interpreter (a uv project not set up yet) is found before a run."""
    if spec.sim.python is None:
        return []
    from hud_pipelines.sim.process import sim_interpreter

    try:
        sim_interpreter(spec.resolve_path(spec.sim.python))
    except HudPipelinesError as exc:
        return [document.problem(("sim", "python"), str(exc))]
    return []


def fleet_file_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A ``sim.fleet`` file that does not load: its own problems, at their lines in that file; one that is not
    there, at the pipeline's ``sim.fleet``."""
    if spec.sim.fleet is None:
        return []
    from hud_pipelines.spec.fleet import fleet_problems

    path = spec.resolve_path(spec.sim.fleet)
    if not path.is_file():
        return [document.problem(("sim", "fleet"), f"no fleet file at {path}")]
    return fleet_problems(path)
