"""Load pipeline files into :class:`PipelineSpec` models, reporting every problem at once.

Loading a file runs three passes and keeps going after each one finds problems, so that a single
``validate`` shows everything that is wrong:

1. read the YAML (syntax, tabs, duplicate keys, tags, ``${VAR}`` interpolation) with positions;
2. validate the data against the models (types, ranges, unknown keys and kinds, cross-field rules);
3. optionally (``deep=True``) resolve what the spec names: the sim factory and its arguments,
   policy and grader import paths, referenced files.

Anything found raises one :class:`SpecError` listing all problems (across all files for
:func:`load_pipelines`), each with file, line, column, key path and the offending line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pydantic import ValidationError

from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.spec.document import KeyPath, YamlDocument, read_document, without_extensions
from hud_pipelines.spec.models import SOURCE_CONTEXT, PipelineSpec
from hud_pipelines.spec.problems import Problem, SpecError, display_path
from hud_pipelines.spec.validation import validation_problems

PIPELINE_SUFFIXES = (".yaml", ".yml")
PIPELINES_ENV = "HUD_PIPELINES_DIR"


@dataclass(frozen=True)
class Loaded:
    """The outcome of loading one file: the spec when it is valid, and every problem found."""

    file: str
    spec: PipelineSpec | None
    problems: list[Problem]
    document: YamlDocument | None


def load_pipeline(path: Path | str, *, deep: bool = False, env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Load one pipeline file; raises :class:`SpecError` with all of its problems."""
    loaded = load_file(Path(path), deep=deep, env=env)
    if loaded.spec is None or loaded.problems:
        raise SpecError(loaded.problems)
    return loaded.spec


def load_pipeline_to_run(
    path: Path | str, *, as_deployed: Callable[[PipelineSpec], PipelineSpec] | None = None
) -> PipelineSpec:
    """Load one pipeline file to run it: as :func:`load_pipeline`, and what it names must be there as far as
    reading tells, without running any of its code (:mod:`hud_pipelines.spec.preflight`). ``as_deployed``: the
    spec as the run will have it (a deployment file's fields applied); what that replaces is not the YAML's to
    judge."""
    loaded = load_file(Path(path))
    if loaded.spec is None or loaded.problems or loaded.document is None:
        raise SpecError(loaded.problems)
    try:
        deployed = loaded.spec if as_deployed is None else as_deployed(loaded.spec)
    except HudPipelinesError:  # refused in its own words by the caller's checks of the deployment file
        deployed = None
    _refuse(loaded.spec, loaded.document, deployed)
    return loaded.spec


def refuse_unrunnable(spec: PipelineSpec, as_run: PipelineSpec) -> None:
    """Raise :class:`SpecError` with what a run of ``spec`` would fail on, read from its file as
    :func:`load_pipeline_to_run` reads it (``as_run``: the spec as the run's resources configure it; what they
    change is not the file's to judge). Where a Dagster run starts (the UI, ``dagster job execute``, a sensor),
    as ``hud-pipelines run`` refuses before it starts one: a misspelled factory or argument is said at its line
    rather than as an error of every instance. A spec without a file, or whose file was edited since, is not
    judged here."""
    if spec.source is None or not spec.source.is_file():
        return
    loaded = load_file(spec.source)
    if loaded.spec is not None and loaded.document is not None and not loaded.problems and loaded.spec == spec:
        _refuse(loaded.spec, loaded.document, as_run)


def located(spec: PipelineSpec, path: KeyPath) -> str | None:
    """``file:line:column: key`` of ``path`` in ``spec``'s file, for an error found only once the run derived
    something (the sim's contract); ``None`` without a file, or where the file's section no longer says it."""
    if spec.source is None or not spec.source.is_file():
        return None
    loaded = load_file(spec.source)
    section = str(path[0])
    if loaded.spec is None or loaded.document is None or getattr(loaded.spec, section) != getattr(spec, section):
        return None
    problem = loaded.document.problem(path, "")
    return f"{problem.where}: {problem.path}"


def _refuse(spec: PipelineSpec, document: YamlDocument, as_run: PipelineSpec | None) -> None:
    """Raise :class:`SpecError` with :func:`~hud_pipelines.spec.preflight.runnable_problems`, if any."""
    from hud_pipelines.spec.preflight import runnable_problems

    problems = runnable_problems(spec, document, as_run)
    if problems:
        raise SpecError(problems)


CREDENTIAL_PATHS = ("sim.token", "agent.policy.api_key")
"""Where a pipeline holds credentials: what reads results alone (``report``) needs none of them."""
_UNSET = re.compile(r"environment variable (?P<name>[A-Za-z_][A-Za-z0-9_]*) is not set")


def load_pipeline_for_results(path: Path | str) -> PipelineSpec:
    """Load a pipeline to read its results: a credential from an unset variable (``token: ${SIM_TOKEN}``)
    reaches no sim here, so it does not stop the load (credentials are never part of a result's hash)."""
    try:
        return load_pipeline(path)
    except SpecError as error:
        unset = [_UNSET.search(p.message) if p.path in CREDENTIAL_PATHS else None for p in error.problems]
        if not all(unset):
            raise
        stand_ins = {found.group("name"): "unset" for found in unset if found is not None}
        return load_pipeline(path, env={**os.environ, **stand_ins})


def load_pipeline_text(
    text: str,
    *,
    source: Path | str | None = None,
    deep: bool = False,
    env: Mapping[str, str] | None = None,
) -> PipelineSpec:
    """Load a pipeline from YAML text; ``source`` (a path, need not exist) anchors relative paths and messages."""
    file = display_path(source) if source is not None else "<string>"
    loaded = _load_text(text, file, Path(source) if source is not None else None, deep=deep, env=env)
    if loaded.spec is None or loaded.problems:
        raise SpecError(loaded.problems)
    return loaded.spec


def load_pipelines(
    directory: Path | str, *, deep: bool = False, env: Mapping[str, str] | None = None
) -> list[PipelineSpec]:
    """Load every ``*.yaml`` / ``*.yml`` in ``directory`` (sorted by file name; an empty directory gives ``[]``).

    Raises :class:`SpecError` listing the problems of all files, including a ``name`` used twice.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise SpecError([Problem(display_path(folder), 0, 0, "", "no such directory of pipeline files")])
    specs, problems = _load_many(pipeline_files(folder), deep=deep, env=env)
    if problems:
        raise SpecError(problems)
    return specs


def collect_pipelines(
    paths: Iterable[Path | str], *, deep: bool = False, env: Mapping[str, str] | None = None
) -> tuple[list[PipelineSpec], list[Problem]]:
    """Load files and directories of pipeline files without raising: the valid specs and all problems.

    A directory without pipeline files and a path that does not exist are problems too, so that a
    ``validate`` of nothing never passes by accident.
    """
    files: list[Path] = []
    problems: list[Problem] = []
    for entry in (Path(p) for p in paths):
        if entry.is_dir():
            found = pipeline_files(entry)
            if not found:
                problems.append(Problem(display_path(entry), 0, 0, "", "no pipeline files (*.yaml, *.yml) here"))
            files += found
        elif entry.is_file():
            files.append(entry)
        else:
            problems.append(Problem(display_path(entry), 0, 0, "", "no such file or directory"))
    unique = list(dict.fromkeys(f.resolve() for f in files))
    specs, found_problems = _load_many(unique, deep=deep, env=env)
    return specs, problems + found_problems


def default_pipelines_dir() -> Path:
    """``$HUD_PIPELINES_DIR``, else ``./pipelines``: where names given on the command line are looked up."""
    configured = os.environ.get(PIPELINES_ENV)
    return Path(configured).expanduser().resolve() if configured else (Path.cwd() / "pipelines").resolve()


def contract_refresh_targets(contract: Path) -> list[str]:
    """How each pipeline whose ``sim.contract`` is the file ``contract`` is named to ``hud-pipelines contract``.

    Pipeline files are looked for in the pipelines directory and in the contract's own directory and
    the one above it (``contracts/x.json`` next to its pipelines); a pipeline is named by its
    ``name`` where that finds its file (``<pipelines dir>/<name>.yaml``), else by its path. Files
    that do not load are skipped: this only words an error message.
    """
    target = contract.resolve()
    folders = dict.fromkeys(d for d in (default_pipelines_dir(), target.parent, target.parent.parent) if d.is_dir())
    files = dict.fromkeys(f.resolve() for folder in folders for f in pipeline_files(folder))
    named: list[str] = []
    for file in files:
        spec = load_file(file).spec
        if spec is None or spec.contract_path != target:
            continue
        named.append(run_argument(spec))
    return named


def run_argument(spec: PipelineSpec) -> str:
    """What names ``spec`` to the CLI (``hud-pipelines run <it>``): its ``name`` where that finds its file
    (``<pipelines dir>/<name>.yaml``), else its file's path."""
    file = spec.source
    if file is None or any(default_pipelines_dir() / f"{spec.name}{s}" == file for s in PIPELINE_SUFFIXES):
        return spec.name
    return display_path(file)


def refresh_hint(contract: Path) -> str:
    """How to refresh the contract file ``contract``: the ``hud-pipelines contract`` command of each
    pipeline that names it (found next to the file and in the pipelines directory)."""
    commands = [f"`hud-pipelines contract {target}`" for target in contract_refresh_targets(contract)]
    command = " or ".join(commands) or "`hud-pipelines contract <pipeline>`"
    return (
        f"to take the env's shapes, refresh it with {command} "
        "(it keeps the names and descriptions that still fit and lists what changed)"
    )


def pipeline_files(directory: Path) -> list[Path]:
    """The pipeline files directly in ``directory``, sorted by name."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in PIPELINE_SUFFIXES)


def declared_name(path: Path) -> str:
    """The ``name`` a pipeline file declares, read even from a file that does not validate; else its stem."""
    try:
        document, _ = read_document(path.read_text(encoding="utf-8"), str(path), {})
    except (OSError, UnicodeDecodeError):
        return path.stem
    data: object = document.data if document is not None else None
    name = cast(dict[str, object], data).get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else path.stem


def load_file(path: Path, *, deep: bool = False, env: Mapping[str, str] | None = None) -> Loaded:
    """Load one file without raising."""
    file = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Loaded(file, None, [Problem(file, 0, 0, "", "no such file")], None)
    except (OSError, UnicodeDecodeError) as exc:
        return Loaded(file, None, [Problem(file, 0, 0, "", f"cannot read the file: {exc}")], None)
    return _load_text(text, file, path, deep=deep, env=env)


def _load_text(text: str, file: str, source: Path | None, *, deep: bool, env: Mapping[str, str] | None) -> Loaded:
    document, problems = read_document(text, file, os.environ if env is None else env)
    if document is None:
        return Loaded(file, None, sorted(problems, key=Problem.sort_key), None)
    context = {SOURCE_CONTEXT: source} if source is not None else {}
    try:
        spec = PipelineSpec.model_validate(without_extensions(document.data), context=context)
    except ValidationError as exc:
        reported = [p.path for p in problems]
        problems += [p for p in validation_problems(exc, document) if not _covered(p.path, reported)]
        if deep:
            from hud_pipelines.spec.deep import unmodelled_factory_problems

            problems += unmodelled_factory_problems(document, source, [p.path for p in problems])
        return Loaded(file, None, sorted(problems, key=Problem.sort_key), document)
    if deep and not problems:
        from hud_pipelines.spec.deep import deep_problems

        problems += deep_problems(spec, document)
    return Loaded(file, spec, sorted(problems, key=Problem.sort_key), document)


def _load_many(
    files: Iterable[Path], *, deep: bool, env: Mapping[str, str] | None
) -> tuple[list[PipelineSpec], list[Problem]]:
    specs: list[PipelineSpec] = []
    problems: list[Problem] = []
    owners: dict[str, Loaded] = {}
    for path in files:
        loaded = load_file(path, deep=deep, env=env)
        problems += loaded.problems
        spec = loaded.spec
        if spec is None or loaded.document is None:
            continue
        first = owners.get(spec.name)
        if first is not None and first.document is not None:
            where = first.document.problem(("name",), "").where
            problems.append(
                loaded.document.problem(
                    ("name",), f"pipeline name {spec.name!r} is already used by {where}; names must be unique"
                )
            )
            continue
        owners[spec.name] = loaded
        if not loaded.problems:
            specs.append(spec)
    return specs, problems


def _covered(path: str, reported: list[str]) -> bool:
    """A validation error at ``path`` merely echoes a reading problem there (e.g. an unset ``${VAR}``)."""
    return any(path == r or path.startswith((f"{r}.", f"{r}[")) for r in reported if r)


__all__ = [
    "PIPELINES_ENV",
    "Loaded",
    "collect_pipelines",
    "contract_refresh_targets",
    "default_pipelines_dir",
    "load_file",
    "load_pipeline",
    "load_pipeline_text",
    "load_pipelines",
    "pipeline_files",
]
