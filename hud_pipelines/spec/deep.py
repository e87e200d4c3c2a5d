"""Deep validation: do the names in a valid spec resolve to things that exist?

Plain loading checks shape only; ``hud-pipelines validate`` (deep by default) also resolves the sim
factory (an unknown registry id or attribute gets the factory resolver's closest matches; a
``sim.lerobot_env`` is resolved already while loading, its registry id is resolved here), checks
that ``sim.python`` names an interpreter, sorts every build argument against the factory's
signature, checks that policy and grader targets are importable, that files a spec points at
exist or parse, and that a constant action fits the contract file when there is one. Each finding is located at the YAML
line that names the culprit. This imports the factory's module (and gymnasium), but policy and
grader modules are only read, not run, where possible (see :mod:`hud_pipelines.spec.target_check`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hud_pipelines.errors import ContractError, HudPipelinesError
from hud_pipelines.spec.agent import ConstantPolicyConfig, LeRobotPolicyConfig, ScriptedPolicyConfig, TorchPolicyConfig
from hud_pipelines.spec.document import KeyPath, YamlDocument
from hud_pipelines.spec.grading import CallableGrader, NoRegressionCheck
from hud_pipelines.spec.lerobot_types import lerobot_type_problems
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, did_you_mean
from hud_pipelines.spec.sections import is_file_target
from hud_pipelines.spec.sim_files import data_file_problems, fleet_file_problems, python_problems
from hud_pipelines.spec.target_check import target_parameters, target_problem

if TYPE_CHECKING:
    from hud_pipelines.agent.checkpoints import Discovery
    from hud_pipelines.sim.factory import Factory

EPISODIC_KEYS = ("seed", "options")


def deep_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """Everything that shape validation cannot see; imports print to stderr so stdout stays the caller's."""
    with contextlib.redirect_stdout(sys.stderr):
        return [
            *python_problems(spec, document),
            *fleet_file_problems(spec, document),
            *data_file_problems(spec, document),
            *_factory_problems(spec, document),
            *contract_problems(spec, document),
            *policy_problems(spec, document),
            *lerobot_type_problems(spec, document),
            *_checkpoint_problems(spec, document),
            *grader_problems(spec, document),
        ]


def unmodelled_factory_problems(document: YamlDocument, source: Path | None, reported: Sequence[str]) -> list[Problem]:
    """The sim factory's own problem in a file whose other problems keep it from becoming a model.

    ``validate`` then still says every problem of the file it can: a typo in the registry id beside a
    bad name is two problems, not one per run of ``validate``. Only a plain ``sim.factory`` with no
    problem of its section reported, and no interpreter of its own (``sim.python``), is resolved.
    """
    data = document.data
    section = _section(cast(dict[str, object], data).get("sim")) if isinstance(data, dict) else None
    if section is None:
        return []
    factory = section.get("factory")
    if not isinstance(factory, str) or "python" in section or any(p == "sim" or p.startswith("sim.") for p in reported):
        return []
    if is_file_target(factory):
        file_part, _, attribute = factory.rpartition(":")
        path = Path(file_part).expanduser()
        base = source.parent if source is not None else Path.cwd()
        factory = f"{path if path.is_absolute() else (base / path).resolve()}:{attribute}"
    with contextlib.redirect_stdout(sys.stderr):
        return _resolved(factory, ("sim", "factory"), document)[1]


def _resolved(target: str, where: KeyPath, document: YamlDocument) -> tuple[Factory | None, list[Problem]]:
    """The factory ``target`` names, or the problem (located at ``where``) that stops it resolving."""
    from hud_pipelines.sim.factory import resolve_factory

    try:
        return resolve_factory(target), []
    except HudPipelinesError as exc:
        return None, [document.problem(where, str(exc))]
    except Exception as exc:  # the user's factory module failed to import
        return None, [document.problem(where, f"loading factory {target!r} raised {_describe(exc)}")]


def _section(value: object) -> dict[str, object] | None:
    """A mapping of the raw document as such (YAML keys are strings: the reader refuses others)."""
    return cast(dict[str, object], value) if isinstance(value, dict) else None


def sweep_source_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A sweep whose checkpoints directory is missing, empty or names a label twice (one look at the files)."""
    try:
        _sweep_discovery(spec)
    except HudPipelinesError as exc:
        return [document.problem(("agent", "policy", "checkpoints"), str(exc))]
    return []


def _checkpoint_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A sweep whose checkpoints directory is missing, empty or names a label twice is found before a run,
    and so is a ``no_regression`` baseline one typo from a label found (one look at the checkpoints)."""
    try:
        found = _sweep_discovery(spec)
    except HudPipelinesError as exc:
        return [document.problem(("agent", "policy", "checkpoints"), str(exc))]
    unreadable = [  # a torch file that is no torch.save file would error every episode of its checkpoint
        document.problem(("agent", "policy", "checkpoints"), problem)
        for checkpoint in (
            found.complete if found is not None and isinstance(spec.agent.policy, TorchPolicyConfig) else ()
        )
        if (problem := _torch_checkpoint_problem(checkpoint.path)) is not None
    ]
    return unreadable + [
        document.problem(("checks", index, "baseline"), message)
        for index, message in misspelled_baselines(spec, _labels(found))
    ]


def _sweep_discovery(spec: PipelineSpec) -> Discovery | None:
    """The checkpoints a sweep's sources hold now (``None`` for a single policy); raises when they cannot be read."""
    policy = spec.agent.policy
    if not isinstance(policy, LeRobotPolicyConfig | TorchPolicyConfig) or policy.checkpoints is None:
        return None
    from hud_pipelines.agent.checkpoints import discover_checkpoints, sources_of

    kind = "torch" if isinstance(policy, TorchPolicyConfig) else "lerobot"
    return discover_checkpoints(sources_of(policy.checkpoints, kind, spec.resolve_path), settle_s=0)


def misspelled_baselines(
    spec: PipelineSpec, labels: Sequence[str] | None = None, *, evaluated: Sequence[str] = ()
) -> list[tuple[int, str]]:
    """``(index in checks, message)`` of each sweep ``no_regression`` baseline that is a typo of a label.

    ``labels``: the sweep's checkpoints found now, when the caller looked already; ``evaluated``: the
    labels with results on disk (a checkpoint whose files are gone keeps them: it is a baseline still). A
    baseline that names no file, or a checkpoint not saved yet, is left to the run (training may still be
    going, the baseline's grades may come from an earlier step of the pipeline's CI): the check then fails
    saying why. One edit away from a label found now, it is a misspelled label, which ``validate`` reports
    and a run refuses before evaluating anything.
    """
    baselines = [(index, c) for index, c in enumerate(spec.checks) if isinstance(c, NoRegressionCheck)]
    if not baselines:
        return []
    if labels is None:
        with contextlib.suppress(HudPipelinesError):  # the checkpoint check reports it
            labels = _labels(_sweep_discovery(spec))
    known = list(labels or ())
    found: list[tuple[int, str]] = []
    for index, check in baselines:
        taken = check.baseline in (*known, *evaluated) or _later_step(check.baseline, known)
        hint = "" if taken else did_you_mean(check.baseline, known)
        if hint and not spec.resolve_path(check.baseline).exists():
            message = f"{check.baseline!r} is no checkpoint of the sweep{hint}; found now: {', '.join(known)}"
            found.append((index, message))
    return found


def _later_step(baseline: str, labels: Sequence[str]) -> bool:
    """Whether ``baseline`` names a step after every saved one of its naming (``002000`` while ``001500`` is
    the last): a checkpoint not saved yet, never a typo of a saved one."""
    naming = _STEP_NUMBER.sub("#", baseline)
    saved = [_numbers(label) for label in labels if _STEP_NUMBER.sub("#", label) == naming]
    return bool(saved) and naming != baseline and _numbers(baseline) > max(saved)


def _numbers(label: str) -> list[int]:
    return [int(n) for n in _STEP_NUMBER.findall(label)]


_STEP_NUMBER = re.compile(r"\d+")


def _labels(found: Discovery | None) -> list[str]:
    """The labels of the checkpoints found, complete or not (none for a single policy)."""
    return [] if found is None else [c.label for c in (*found.complete, *(p.checkpoint for p in found.pending))]


def _factory_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    if spec.factory is None:
        return []
    # a lerobot env config stands for its registry id and build arguments: problems point at its type
    derived = spec.sim.lerobot_env is not None
    where: KeyPath = ("sim", "lerobot_env", "type") if derived else ("sim", "factory")
    factory, refused = _resolved(spec.factory, where, document)
    if factory is None:
        return refused
    problems = [] if derived else _argument_problems(factory.split_task, spec.sim.args, ("sim", "args"), document)
    controls = [t for t in spec.tasks if t.variant_of is None]  # the file's own tasks, in order
    defaults = _defaults(factory)
    for index, task in zip(_control_positions(document, len(controls)), controls, strict=True):
        problems += _argument_problems(factory.split_task, task.args, ("tasks", index, "args"), document)
        for axis, values in task.matrix.items():  # the tasks a matrix adds change one argument: said at the axis
            where: KeyPath = ("tasks", index, "matrix")
            found = [_argument_problems(factory.split_task, {axis: value}, where, document) for value in values]
            problems += list(dict.fromkeys(problem for each in found for problem in each))
            unset = axis not in spec.sim.args and axis not in task.args  # the control builds with the default
            if unset and axis in defaults and any(value == defaults[axis] for value in values):
                problems.append(
                    document.problem(
                        (*where, axis),
                        f"{defaults[axis]!r} is the factory's default value of {axis!r}, which the control builds "
                        "with: that arm would be the control again",
                    )
                )
    return problems


def _defaults(factory: Factory) -> dict[str, Any]:
    """A callable factory's keyword defaults (a registry id's are the registry's: not read here)."""
    import inspect

    from hud_pipelines.sim.factory import FactoryKind

    if factory.kind is not FactoryKind.CALLABLE or not callable(factory.target):
        return {}
    try:
        parameters = inspect.signature(factory.target).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _control_positions(document: YamlDocument, count: int) -> list[int]:
    """Where each of the ``count`` control tasks stands in the file's ``tasks`` list.

    A dumped spec loaded back holds the tasks its matrices added too (each after its control): a
    problem of the second control is then not at ``tasks[1]``.
    """
    written = sum(1 for path in document.entries if len(path) == 2 and path[0] == "tasks")
    found = [i for i in range(written) if ("tasks", i, "variant_of") not in document.entries]
    return found if len(found) == count else list(range(count))


def _argument_problems(
    split: Callable[[Mapping[str, Any]], object], args: Mapping[str, Any], path: KeyPath, document: YamlDocument
) -> list[Problem]:
    problems: list[Problem] = []
    for key, value in args.items():
        if key in EPISODIC_KEYS:
            problems.append(
                document.problem(
                    (*path, key), f"{key!r} is not a build argument: set it on the task ('tasks[i].{key}')", on_key=True
                )
            )
            continue
        try:
            split({key: value})
        except HudPipelinesError as exc:
            problems.append(document.problem((*path, key), str(exc), on_key=True))
    return problems


def contract_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A contract file that does not load, or that the dataset section or a constant action does not fit."""
    path = spec.contract_path
    if path is None or not path.exists():
        return []  # written from the derived contract on first use
    if not path.is_file():
        return [document.problem(("sim", "contract"), f"{path} is a directory; expected a contract.json file")]
    from hud_pipelines.contract import load_contract
    from hud_pipelines.contract.model import ACTION

    try:
        contract = load_contract(path)
    except HudPipelinesError as exc:
        return [document.problem(("sim", "contract"), str(exc))]
    problems: list[Problem] = []
    if spec.dataset is not None and spec.dataset_enabled:  # as the run's contract step refuses it
        from hud_pipelines.dataset.features import DatasetLayout

        try:
            DatasetLayout.build(contract, spec.dataset.writer_options())
        except ContractError as exc:
            where = ("dataset", "state_features") if spec.dataset.state_features is not None else ("dataset",)
            problems.append(document.problem(where, f"does not fit the contract {path}: {exc}"))
    policy = spec.resolved_agent().policy
    if ACTION not in contract.features:  # the run adds the env's action back to the file (a feature it gained)
        return problems
    width = contract.action.size
    if isinstance(policy, ConstantPolicyConfig) and policy.value is not None and len(policy.value) != width:
        message = (
            f"the constant action has {len(policy.value)} entries; the contract {path} has {width} "
            f"(names {contract.action.names})"
        )
        problems.append(document.problem(("agent", "policy", "value"), message))
    return problems


def _torch_checkpoint_problem(path: Path) -> str | None:
    """A torch checkpoint that is missing, or whose bytes are no torch.save file (one look, no torch import)."""
    from hud_pipelines.agent.checkpoint_files import torch_file_problem

    if not path.is_file():
        return f"checkpoint {path} does not exist"
    problem = torch_file_problem(path)
    return None if problem is None else f"checkpoint {path}: {problem}"


def policy_problems(spec: PipelineSpec, document: YamlDocument, *, run_code: bool = True) -> list[Problem]:
    """The policy's target, arguments, checkpoint file or folder (``run_code``: as :func:`target_problem`)."""
    policy = spec.resolved_agent().policy
    where: KeyPath = ("agent", "policy")
    problems: list[Problem] = []
    if isinstance(policy, ScriptedPolicyConfig | TorchPolicyConfig):
        message = target_problem(policy.target, spec.base_dir, run_code=run_code)
        if message is None and run_code and isinstance(policy, ScriptedPolicyConfig) and not policy.args:
            message = _one_argument_problem(spec, policy.target, "the observation batch")
        if message is not None:
            problems.append(document.problem((*where, "target"), message))
        else:
            problems += _target_argument_problems(policy.target, policy.args, (*where, "args"), document, run_code)
    checkpoint = policy.checkpoint if isinstance(policy, TorchPolicyConfig) else None
    if checkpoint is not None:
        problem = _torch_checkpoint_problem(Path(checkpoint))
        if problem is not None:
            problems.append(document.problem((*where, "checkpoint"), problem))
    if isinstance(policy, LeRobotPolicyConfig) and policy.path is not None:
        from hud_pipelines.agent.checkpoint_files import policy_folder_problem

        folder = Path(policy.path)
        problem = policy_folder_problem(folder) if folder.is_dir() else f"LeRobot policy folder {folder} does not exist"
        if problem is not None:
            problems.append(document.problem((*where, "path"), problem))
    return problems


def _target_argument_problems(
    target: str, args: Mapping[str, Any], path: KeyPath, document: YamlDocument, run_code: bool
) -> list[Problem]:
    """An argument the target's signature does not take, found from its source before a run calls it."""
    accepted = target_parameters(target, run_code=run_code)
    if accepted is None:
        return []
    name = target.rpartition(":")[2]
    takes = ", ".join(sorted(accepted)) or "no arguments"
    return [
        document.problem(
            (*path, key),
            f"{name} takes no argument {key!r}{did_you_mean(key, accepted)}; it takes: {takes}",
            on_key=True,
        )
        for key in args
        if key not in accepted
    ]


def grader_problems(spec: PipelineSpec, document: YamlDocument, *, run_code: bool = True) -> list[Problem]:
    """The callable graders' targets (``run_code``: as :func:`target_problem`)."""
    problems: list[Problem] = []
    for index, grader in enumerate(spec.resolved_graders()):
        if isinstance(grader, CallableGrader):
            message = target_problem(grader.target, spec.base_dir, run_code=run_code)
            if message is None and run_code:
                message = _one_argument_problem(spec, grader.target, "the episode dict")
            if message is not None:
                problems.append(document.problem(("graders", index, "target"), message))
    return problems


def _one_argument_problem(spec: PipelineSpec, target: str, argument: str) -> str | None:
    """Why a target's function cannot be called with ``argument`` alone (a grader's episode dict, a scripted policy's
    observation batch); ``None``: it can, it is a class or a policy object (built first), or it does not load here."""
    import inspect

    from hud_pipelines.targets import load_target, one_argument_refused

    try:
        found = load_target(target, base_dir=spec.base_dir)
    except Exception:
        return None
    if inspect.isclass(found) or hasattr(found, "infer") or not callable(found):
        return None
    return one_argument_refused(found, argument)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
