"""The files a sim section names, found before a run: its interpreter, its fleet file, its data files.

``sim.data_files`` lists the files a sim reads besides its Python code. A sim's numbers may depend on
files its imports do not name: a MuJoCo XML and its meshes, a JSON scene, a module it imports by name
at run time. The provenance follows a target's imports on its own
(:func:`~hud_pipelines.targets.target_sources`); these files it cannot see, so the YAML lists them, and
their content joins the results' fingerprint as the code's does (:mod:`hud_pipelines.eval.sources`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec.document import YamlDocument
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem

MAX_DATA_FILES = 10_000
"""The most files the patterns may name: a sim's assets, not a disk (each is read whole every run)."""
SKIPPED = ("__pycache__",)
"""Folders never walked: what Python writes while the sim runs would make every earlier result stale."""


def expand(patterns: Sequence[str], base_dir: Path, *, leaving_out: Path | None = None) -> list[Path]:
    """The files ``patterns`` name, relative to ``base_dir``: a file, every file below a folder (through its symbolic
    links, each folder once), or what a glob pattern (``**`` for any depth) matches; each once, in order, at most
    :data:`MAX_DATA_FILES` + 1 (one more says there are too many). Hidden files and folders, ``__pycache__`` and
    ``.pyc`` files are left out unless named exactly: what the sim or an editor writes beside its data is not its
    data; so is everything below ``leaving_out`` (the outputs root: a run's own results would be taken for the
    sim's data, and every run would find them changed)."""
    found: dict[Path, None] = {}
    outputs = None if leaving_out is None else leaving_out.resolve()
    for pattern in patterns:
        joined = Path(glob.escape(str(base_dir))) / Path(pattern).expanduser()  # the pipeline's folder is no pattern
        exact = not glob.has_magic(pattern)
        for name in sorted(glob.glob(str(joined), recursive=True)):
            path = Path(name)
            if exact or _kept(path):
                files = _files_below(path, outputs) if path.is_dir() else [path.resolve()]
                found.update(dict.fromkeys(f for f in files if outputs is None or not f.is_relative_to(outputs)))
            if len(found) > MAX_DATA_FILES:
                return list(found)[: MAX_DATA_FILES + 1]
    return list(found)


def _files_below(folder: Path, leaving_out: Path | None) -> list[Path]:
    """Every kept file below ``folder``, in order, following symbolic links to folders (a shared mesh store), each
    real folder once (a link to a folder above would loop), none below ``leaving_out``; stops past
    :data:`MAX_DATA_FILES`."""
    files: list[Path] = []
    seen: set[str] = {str(leaving_out)} if leaving_out is not None else set()
    for root, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = sorted(f for f in folders if _kept(Path(f)) and f not in SKIPPED)
        files += [(Path(root) / n).resolve() for n in sorted(names) if _kept(Path(n))]
        if len(files) > MAX_DATA_FILES:
            break
    return files


def _kept(path: Path) -> bool:
    return not path.name.startswith(".") and path.suffix != ".pyc" and path.name not in SKIPPED


def data_file_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """Each ``sim.data_files`` entry that names no file (a typo would leave the file it meant untracked), or more
    than :data:`MAX_DATA_FILES` (a folder of the project's, not the sim's)."""
    problems: list[Problem] = []
    for index, pattern in enumerate(spec.sim.data_files):
        named = expand([pattern], spec.base_dir)
        if not named:
            problems.append(
                document.problem(("sim", "data_files", index), f"{pattern!r} names no file under {spec.base_dir}")
            )
        elif len(named) > MAX_DATA_FILES:
            message = f"{pattern!r} names more than {MAX_DATA_FILES} files: list the files and folders the sim reads"
            problems.append(document.problem(("sim", "data_files", index), message))
    return problems


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
