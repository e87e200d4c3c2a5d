"""Command-line handlers of ``hud-pipelines validate`` and ``hud-pipelines schema``.

Each command is a pair: ``add_*_arguments(parser)`` fills an ``argparse`` (sub)parser and
``run_*(args) -> int`` runs it and returns the exit status, so the top-level CLI only wires them.
Problems go to stdout as one block per problem (``file:line:col: key.path: message`` plus the
line and a caret) so that editors and CI logs link them; the exit status says whether any exist.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from hud_pipelines.spec.loader import collect_pipelines, declared_name, default_pipelines_dir
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, SpecError, display_path
from hud_pipelines.spec.schema import render_json_schema, render_markdown

EXIT_OK = 0
EXIT_PROBLEMS = 1


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="FILE_OR_DIR",
        help="pipeline files, or directories of *.yaml / *.yml files (default: $HUD_PIPELINES_DIR, else ./pipelines)",
    )
    parser.add_argument(
        "--deep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also resolve the sim factory and its arguments, policy and grader import paths and referenced "
        "files (imports the factory's module; default: on)",
    )


def run_validate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Validate every given file; print each problem, or one line per valid pipeline; 1 when any problem exists."""
    stream = out or sys.stdout
    given: list[Path] = list(args.paths)
    deployments: list[Path] = []
    if given:  # a file given may be a deployment file (dagster is imported only then)
        from hud_pipelines.dagster.deployment import is_deployment_file

        deployments = [path for path in given if is_deployment_file(path)]  # checked as what they are
    if deployments and len(deployments) == len(given):
        return _validate_deployments(deployments, [default_pipelines_dir()], stream)
    paths = [path for path in given if path not in deployments] or [default_pipelines_dir()]  # as run looks
    deep: bool = args.deep
    specs, problems = collect_pipelines(paths, deep=deep)
    problems, evaluated = _drop_evaluated_baselines(problems)
    specs, own = _without_own_baselines([*specs, *evaluated])
    problems += own
    known = [spec.name for spec in specs] + [declared_name(Path(problem.file)) for problem in problems]
    # the folder the code location serves, given or by default: every name of the deployment file must be one of its
    served = default_pipelines_dir()
    whole = not args.paths or any(path.is_dir() and path.resolve() == served for path in args.paths)
    deployment = _deployment_problem(known if whole else None, specs)
    if problems:
        print(SpecError(problems).render(), file=stream)
    if deployment is not None:
        print(deployment, file=stream)
    if deployments and _validate_deployments(deployments, paths, stream) != EXIT_OK:
        return EXIT_PROBLEMS
    if problems or deployment is not None:
        return EXIT_PROBLEMS
    for spec in specs:
        print(f"ok  {_summary(spec)}", file=stream)
    if not deployments:  # $HUD_PIPELINES_DEPLOYMENT's file, checked with them (a file given says its own line)
        _say_deployment(stream)
    checked = "deep" if deep else "shallow"
    print(f"{len(specs)} pipeline{'s' if len(specs) != 1 else ''} valid ({checked} check)", file=stream)
    return EXIT_OK


def _drop_evaluated_baselines(problems: list[Problem]) -> tuple[list[Problem], list[PipelineSpec]]:
    """``problems`` less a sweep baseline taken for a typo that has results on disk (in the outputs a run writes
    to), whose files training deleted since: a baseline still, as a run takes it. With them, the specs of the
    files that had no other problem."""
    from hud_pipelines.cli.selection import evaluated_labels
    from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
    from hud_pipelines.spec.grading import NoRegressionCheck
    from hud_pipelines.spec.loader import load_file

    files = {problem.file for problem in problems if re.fullmatch(r"checks\[\d+\]\.baseline", problem.path)}
    dropped: set[tuple[str, str]] = set()
    valid: list[PipelineSpec] = []
    for file in files:
        spec = load_file(Path(file)).spec
        if spec is None:
            continue
        labels = evaluated_labels(spec, EvalOutputs(default_outputs_root().resolve(), spec.name))
        dropped |= {
            (file, f"checks[{index}].baseline")
            for index, check in enumerate(spec.checks)
            if isinstance(check, NoRegressionCheck) and check.baseline in labels
        }
        if all((file, problem.path) in dropped for problem in problems if problem.file == file):
            valid.append(spec)
    return [problem for problem in problems if (problem.file, problem.path) not in dropped], valid


def _without_own_baselines(specs: list[PipelineSpec]) -> tuple[list[PipelineSpec], list[Problem]]:
    """``specs`` less those with a ``no_regression`` baseline that is their own results (in the outputs a run writes
    to), which a run refuses, and a problem at each such baseline's line."""
    from hud_pipelines.cli.selection import own_baselines
    from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
    from hud_pipelines.spec.loader import load_file

    kept: list[PipelineSpec] = []
    problems: list[Problem] = []
    for spec in specs:
        found = own_baselines(spec, EvalOutputs(default_outputs_root().resolve(), spec.name))
        document = load_file(spec.source).document if found and spec.source is not None else None
        if document is None:
            kept.append(spec)
            continue
        problems += [document.problem(("checks", index, "baseline"), message) for index, message in found]
    return kept, problems


def _validate_deployments(paths: list[Path], pipelines: list[Path], stream: TextIO) -> int:
    """Check each deployment file given as ``$HUD_PIPELINES_DEPLOYMENT`` would be read (:func:`_deployment_problem`),
    its pipeline names against those of ``pipelines`` (the files and folders given beside it, or the code
    location's folder)."""
    specs, broken = collect_pipelines(pipelines, deep=False)
    known = [spec.name for spec in specs] + [declared_name(Path(problem.file)) for problem in broken]
    status = EXIT_OK
    for path in paths:
        problem = _deployment_problem(known, specs, path)
        if problem is not None:
            print(problem, file=stream)
            status = EXIT_PROBLEMS
            continue
        _say_deployment(stream, path)
    return status


def _say_deployment(stream: TextIO, path: Path | None = None) -> None:
    """The line of a valid deployment file (by default ``$HUD_PIPELINES_DEPLOYMENT``'s; none when unset)."""
    from hud_pipelines.dagster.deployment import deployment_path, load_deployment
    from hud_pipelines.dagster.execution import load_execution

    path = path or deployment_path()
    if path is None:
        return
    deployment, executor = load_deployment(path), load_execution(path).default.executor
    configured = f"{len(deployment)} pipeline setting(s)" if deployment else "no pipeline settings"
    print(f"ok  {display_path(path)}: deployment file (executor {executor}, {configured})", file=stream)


def _deployment_problem(known: list[str] | None, specs: list[PipelineSpec], path: Path | None = None) -> str | None:
    """What is wrong with the deployment file at ``path`` (by default ``$HUD_PIPELINES_DEPLOYMENT``'s, if one is
    set): its fields and values, and pipeline names that match no pipeline: when the whole pipelines folder was
    validated (``known``), any such name; else a name one typo away from a validated pipeline's, as a run of
    that file refuses it."""
    from hud_pipelines.dagster.deployed import deployment_misfit
    from hud_pipelines.dagster.deployment import (
        deployment_path,
        load_deployment,
        refuse_misspelled,
        refuse_unknown_pipelines,
    )
    from hud_pipelines.dagster.execution import load_execution
    from hud_pipelines.errors import DeploymentError
    from hud_pipelines.spec.loader import pipeline_files

    path = path or deployment_path()
    if path is None:
        return None
    problems: list[str] = []  # each check's, all at once
    deployment: dict[str, Any] = {}
    for check in (lambda: deployment.update(load_deployment(path)), lambda: load_execution(path)):
        try:
            check()
        except DeploymentError as exc:
            problems.append(str(exc))
            deployment.update(exc.checked)  # what was read right is checked all the same
    try:
        if known is not None:
            refuse_unknown_pipelines(deployment, known, path)
    except DeploymentError as exc:
        problems.append(str(exc))
    found: list[str] = [line for problem in problems for line in problem.splitlines()]
    for spec in specs if known is None else []:  # each validated file, as a run of it would refuse the file
        folder = spec.source.parent if spec.source is not None else Path.cwd()
        try:
            refuse_misspelled(deployment, spec.name, [declared_name(file) for file in pipeline_files(folder)], path)
        except DeploymentError as exc:
            found.append(str(exc))
    for spec in specs:  # the sections its fields make with each pipeline's YAML, as the run will validate them
        found += (deployment_misfit(spec, deployment, path) or "").splitlines()
    return "\n".join(dict.fromkeys(found)) or None


def _summary(yaml: PipelineSpec) -> str:
    """The pipeline's line, with the figures a run has: under the deployment file's settings, if one is set."""
    where = display_path(yaml.source) if yaml.source is not None else yaml.name
    spec, deployed = _deployed(yaml)
    partitions = len(spec.partitions())
    return (
        f"{where}: {spec.name} ({len(spec.tasks)} task(s) x group {spec.group} = {partitions} partition(s) "
        f"of {spec.sim.num_envs} slot(s), {_episodes(spec)}){deployed}"
    )


def _deployed(yaml: PipelineSpec) -> tuple[PipelineSpec, str]:
    """``yaml`` as a run configures it under ``$HUD_PIPELINES_DEPLOYMENT``'s file, and what that file sets for
    it (in words; empty when nothing). A field read from an unset variable leaves the YAML's figures."""
    from hud_pipelines.dagster.deployment import deployment_path

    path = deployment_path()
    if path is None:
        return yaml, ""
    from hud_pipelines.dagster.deployed import deployed_spec
    from hud_pipelines.errors import DeploymentError

    try:
        spec = deployed_spec(yaml, Path.cwd())  # the project directory, as a run from here has it
    except DeploymentError:
        return yaml, ""
    fields = ", ".join(spec.overrides(yaml))
    return spec, f"; {display_path(path)} sets {fields}" if fields else ""


def _episodes(spec: PipelineSpec) -> str:
    """The episodes a run schedules; a sweep's are per checkpoint, times the checkpoints there are now."""
    if not spec.is_sweep:
        return f"{spec.scheduled_slots} episodes"
    from hud_pipelines.errors import CheckpointError
    from hud_pipelines.eval.sweep import discover

    per_checkpoint = f"{spec.scheduled_slots} episodes per checkpoint"
    try:
        found = discover(spec, settle_s=0.0)  # complete files count: what a run would evaluate once settled
    except CheckpointError:
        return per_checkpoint
    count = len(found.complete)
    waiting = "; ".join(f"{p.checkpoint.label}: {p.reason}" for p in found.pending)
    incomplete = f"; not complete yet: {waiting}" if waiting else ""
    return f"{per_checkpoint} x {count} checkpoint(s) found now = {spec.scheduled_slots * count}{incomplete}"


def add_schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="the YAML reference as markdown instead of the JSON Schema"
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="write to FILE instead of stdout")
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write: exit 1 when the --output file differs from what would be written (for CI)",
    )


def run_schema(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print or write the JSON Schema (or, with ``--markdown``, the YAML reference)."""
    stream = out or sys.stdout
    markdown: bool = args.markdown
    output: Path | None = args.output
    check: bool = args.check
    text = render_markdown() if markdown else render_json_schema()
    if output is None:
        if check:
            print("--check needs --output FILE to compare with", file=sys.stderr)
            return EXIT_PROBLEMS
        stream.write(text)
        return EXIT_OK
    if check:
        current = output.read_text(encoding="utf-8") if output.is_file() else None
        if current != text:
            print(
                f"{display_path(output)} is out of date; regenerate it with: {_regenerate(markdown, output)}",
                file=stream,
            )
            return EXIT_PROBLEMS
        print(f"{display_path(output)} is up to date", file=stream)
        return EXIT_OK
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {display_path(output)}", file=stream)
    return EXIT_OK


def _regenerate(markdown: bool, output: Path) -> str:
    flag = " --markdown" if markdown else ""
    return f"hud-pipelines schema{flag} -o {display_path(output)}"
