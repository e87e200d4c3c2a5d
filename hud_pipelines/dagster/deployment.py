"""Deployment settings: replace a pipeline's resources per deployment, never touching the eval's YAML.

``$HUD_PIPELINES_DEPLOYMENT`` names a YAML file that sets resource fields per pipeline (or for every
pipeline under ``"*"``), the way Dagster projects pick resources by deployment name::

    pipelines:
      cartpole_pd:
        sim:                      # attach to a sim served on another machine instead of spawning one
          factory: null
          args: {}
          url: ws://simhost:8765
          token: {env: SIM_TOKEN}  # read from the environment when the run starts (a Dagster EnvVar)
        contract: {file: null}    # a served sim announces its contract
        agent:
          torch_threads: 4

The eval's YAML stays the one file that says *what* is evaluated; the deployment file says *where*
and *with what* it runs (a served sim fleet, a GPU agent). Fields are those of the resources in
:mod:`hud_pipelines.dagster.resources`; a run's configuration is validated as the YAML is.

An ``execution:`` section says where the steps run (:mod:`hud_pipelines.dagster.execution`): in the process of the
run (the default: no broker, no workers), or each instance as a unit of work on Celery workers. At the
top level it holds for every pipeline; under a pipeline it replaces fields for that one::

    execution:
      executor: celery
      broker: redis://queuehost:6379/0
      retries: 1                  # an instance whose worker was lost runs once more
    pipelines:
      pusht_act:
        execution: {queue: gpu}   # its instances go to the workers of the gpu queue

With ``executor: k8s`` each step is a Kubernetes Job of its own (dagster-k8s's ``k8s_job_executor``):
the units get ``unit_resources`` (a GPU, say) through the ``dagster-k8s/config`` tag, and a unit whose
pod died runs again through a retry policy instead of a lease (:mod:`hud_pipelines.dagster.k8s`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import dagster as dg
from pydantic import TypeAdapter, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from hud_pipelines.dagster.resources import AGENT, CONTRACT, GRADERS, RESOURCE_TYPES, SIM
from hud_pipelines.errors import DeploymentError
from hud_pipelines.spec.agent import AgentConfig
from hud_pipelines.spec.document import syntax_problem
from hud_pipelines.spec.messages import plain_message
from hud_pipelines.spec.problems import closest, did_you_mean

DEPLOYMENT_ENV = "HUD_PIPELINES_DEPLOYMENT"
EVERY_PIPELINE = "*"
PARTS = (SIM, CONTRACT, AGENT, GRADERS)

EXECUTION = "execution"
INTERPOLATION = re.compile(r"(?<!\$)\$\{[A-Za-z_]\w*(?::-[^}]*)?\}")
"""A pipeline file's ``${VAR}`` or ``${VAR:-default}`` (``$${`` is a literal ``${`` there): not expanded here."""

Deployment = dict[str, dict[str, dict[str, Any]]]
"""pipeline (or ``*``) -> resource part -> fields."""


def deployment_path() -> Path | None:
    """The file ``$HUD_PIPELINES_DEPLOYMENT`` names, if it names one."""
    configured = os.environ.get(DEPLOYMENT_ENV)
    return Path(configured).expanduser().resolve() if configured else None


def read_file(path: Path) -> dict[str, Any]:
    """The file's mapping; a top-level key it does not know is refused (a misspelled ``execution:`` would
    otherwise leave every run in process, silently)."""
    loaded = _load(path)
    unknown = [
        f"deployment file {located(path, (key,))}: {key}: unknown key{did_you_mean(key, DEPLOYMENT_KEYS)}; "
        f"expected one of: {', '.join(sorted(DEPLOYMENT_KEYS))}"
        for key in map(str, loaded)
        if key not in DEPLOYMENT_KEYS
    ]
    if unknown:
        raise DeploymentError("\n".join(unknown))
    return loaded


def _load(path: Path, *, duplicates: bool = False) -> dict[str, Any]:
    """The file's mapping; ``duplicates``: a key twice is let through (the last stands), for telling what the file
    is before it is checked, where a key twice is refused at its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DeploymentError(f"deployment file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # a value typed in another encoding (a Latin-1 accent)
        raise DeploymentError(f"deployment file {path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    reader = YAML(typ="safe")
    reader.allow_duplicate_keys = duplicates
    try:
        loaded: object = reader.load(text)
    except MarkedYAMLError as exc:  # at its line, as a pipeline file's (it was a page of ruamel's traceback)
        raise DeploymentError(f"deployment file {syntax_problem(exc, text.splitlines(), str(path)).render()}") from exc
    if not isinstance(loaded, dict):
        raise DeploymentError(f"deployment file {path}: expected a mapping with 'pipelines:' and/or 'execution:'")
    return cast(dict[str, Any], loaded)


DEPLOYMENT_KEYS = frozenset({"pipelines", EXECUTION})
"""The top-level keys of a deployment file (a pipeline file has ``name``)."""


def is_deployment_file(path: Path) -> bool:
    """Whether ``path`` reads as a deployment file: a YAML mapping with no ``name`` whose keys are
    :data:`DEPLOYMENT_KEYS` or one typo from one (``exectuion:`` is then refused as a deployment file's key)."""
    if not path.is_file() or path.suffix not in (".yaml", ".yml"):
        return False
    try:
        keys = {str(key) for key in _load(path, duplicates=True)}  # a deployment file with a key twice is one too
    except DeploymentError:  # not a mapping, or not YAML: validated as what else it may be
        return False
    return bool(keys) and "name" not in keys and all(closest(key, DEPLOYMENT_KEYS) is not None for key in keys)


def load_deployment(path: Path | None = None) -> Deployment:
    """The deployment file at ``path`` (default ``$HUD_PIPELINES_DEPLOYMENT``); ``{}`` when there is none."""
    if path is None:
        path = deployment_path()
        if path is None:
            return {}
    loaded = read_file(path)
    pipelines = loaded.get("pipelines", {} if EXECUTION in loaded else None)
    if not isinstance(pipelines, dict):
        raise DeploymentError(f"deployment file {path}: expected a 'pipelines:' mapping of pipeline -> resources")
    deployment: Deployment = {}
    problems: list[str] = []  # every one at once, as a pipeline file's
    for pipeline, parts in cast(dict[str, Any], pipelines).items():
        deployment[str(pipeline)] = {}
        where = f"deployment file {located(path, ('pipelines', str(pipeline)))}: pipelines.{pipeline}"
        if not isinstance(parts, dict):
            problems.append(f"{where}: expected a mapping of resources")
            continue
        for part, fields in cast(dict[str, Any], parts).items():
            if part == EXECUTION:  # where it runs, not a resource: read by load_execution
                continue
            if part not in PARTS or not isinstance(fields, dict):
                expected = f"not a resource; expected one of {(*PARTS, EXECUTION)}" if part not in PARTS else ""
                problems.append(f"{where}.{part}: {expected or 'expected a mapping'}")
                continue
            checked: dict[str, object] = {}
            for name, value in cast(dict[str, Any], fields).items():
                try:
                    checked[str(name)] = _check_field(path, (str(pipeline), part, str(name)), value)
                except DeploymentError as exc:
                    problems.append(str(exc))
            deployment[str(pipeline)][part] = {k: _value(v) for k, v in checked.items()}
    if problems:  # with the pipelines it names, which a check of their names still reads
        raise DeploymentError("\n".join(problems), checked=deployment)
    return deployment


def refuse_unknown_pipelines(deployment: Deployment, known: Iterable[str], path: Path | None = None) -> None:
    """Refuse a deployment that sets resources of a pipeline that does not exist among ``known``.

    A misspelled name would otherwise leave the pipeline it meant on its YAML's own resources (a local
    sim instead of the served fleet), silently.
    """
    names = set(known)
    where = path or deployment_path() or Path(DEPLOYMENT_ENV)
    unknown = [
        f"deployment file {located(where, ('pipelines', pipeline))}: pipelines.{pipeline}: no pipeline of "
        f"that name{did_you_mean(pipeline, names)}; known: {', '.join(sorted(names)) or 'none'}"
        for pipeline in deployment
        if pipeline != EVERY_PIPELINE and pipeline not in names
    ]
    if unknown:  # every one at once
        raise DeploymentError("\n".join(unknown))


def refuse_misspelled(deployment: Deployment, pipeline: str, beside: Iterable[str], path: Path | None = None) -> None:
    """Refuse a deployment whose pipeline names miss ``pipeline`` (the one being run) by a typo.

    A run of one file cannot know every pipeline the deployment serves, but a name one typo away from
    the running pipeline's, that none of the pipelines ``beside`` it declares while the running one is
    not named, is that pipeline misspelled (``pusht_act`` beside ``pusht_expert`` is a pipeline of its own);
    a typo nearer another of them is that one's (its runs are refused), not this one's.
    """
    if pipeline in deployment:
        return
    known = sorted({*beside, pipeline})
    unknown = [name for name in deployment if name != EVERY_PIPELINE and name not in known]
    mine = [name for name in unknown if closest(name, known) == pipeline and closest(pipeline, [name]) is not None]
    if mine:
        refuse_unknown_pipelines({name: deployment[name] for name in mine}, known, path)


def _check_field(path: Path, keys: tuple[str, str, str], value: object) -> object:
    """A resource field the deployment sets: one the resource has, with a value of its type (or ``{env: NAME}``).

    Returns the value to use: a number written for a text field (``lockstep_threads: 2``) as its text, as
    the pipeline's own resources hold it.
    """
    pipeline, part, name = keys
    return _checked_value(
        f"deployment file {located(path, ('pipelines', *keys))}: pipelines.{pipeline}.{part}.{name}", part, name, value
    )


def checked_overrides(overrides: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, Any]]:
    """``evaluate(deployment=...)``'s resource fields, held to a deployment file's rules: a resource or a field the
    resources do not have, or a value of another type, is refused naming it (a typo left the YAML's value, or
    raised a bare ``KeyError``)."""
    problems: list[str] = []
    checked: dict[str, dict[str, Any]] = {}
    for part, fields in overrides.items():
        if part not in PARTS or not _is_mapping(fields):  # as a caller passed it, whatever its annotation says
            said = f"not a resource{did_you_mean(part, PARTS)}; expected one of {', '.join(PARTS)}"
            problems.append(f"deployment[{part!r}]: {said if part not in PARTS else 'expected a mapping of fields'}")
            continue
        checked[part] = {}
        for name, value in fields.items():
            try:
                checked[part][name] = _value(_checked_value(f"deployment[{part!r}][{name!r}]", part, name, value))
            except DeploymentError as exc:
                problems.append(str(exc))
    if problems:
        raise DeploymentError("\n".join(problems))
    return checked


def _is_mapping(value: object) -> bool:
    return isinstance(value, Mapping)


def _checked_value(where: str, part: str, name: str, value: object) -> object:
    declared = RESOURCE_TYPES[part].model_fields
    if name not in declared:
        fields = ", ".join(sorted(set(declared) - {"project_dir"}))
        raise DeploymentError(
            f"{where}: not a field of the {part} resource{did_you_mean(name, declared)}; its fields: {fields}"
        )
    if INTERPOLATION.search(str(value)):  # a pipeline file's interpolation, sent as written: a token '${SIM_TOKEN}'
        raise DeploymentError(
            f"{where}: '${{...}}' is not expanded in a deployment file; read the environment with {{env: NAME}} "
            "(read when the run starts, never stored)"
        )
    if isinstance(value, dg.EnvVar) or (isinstance(value, dict) and set(cast(dict[str, Any], value)) == {"env"}):
        return cast(object, value)  # read from the environment when the run starts
    adapter = field_adapter(part, name)
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        if isinstance(value, int) and not isinstance(value, bool) and accepts(adapter, str(value)):
            return str(value)
        raise DeploymentError(f"{where}: {'; '.join(plain_message(error) for error in exc.errors())}") from exc
    return cast(object, value)


def field_adapter(part: str, name: str) -> TypeAdapter[object]:
    """What validates a value of the resource ``part``'s field ``name`` (a number for ``num_envs``); a field that
    takes any value for Dagster (``lockstep_threads``: a number or ``auto``) is held to the pipeline's own."""
    annotation = RESOURCE_TYPES[part].model_fields[name].annotation
    if annotation is Any and part == AGENT:
        annotation = AgentConfig.model_fields[name].annotation
    return TypeAdapter[object](cast(Any, annotation))


def accepts(adapter: TypeAdapter[object], value: object) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def located(path: Path, keys: tuple[str, ...]) -> str:
    """``path:line:column`` of the deepest of ``keys`` the file holds (just ``path`` when it cannot be read)."""
    try:
        node: object = YAML(typ="rt").load(path.read_text(encoding="utf-8"))
    except (OSError, YAMLError):
        return str(path)
    found = ""
    for key in keys:
        if not isinstance(node, CommentedMap) or key not in node:
            break
        mapping = node
        line, column = cast(tuple[int, int], mapping.lc.key(key))
        found = f":{line + 1}:{column + 1}"
        node = cast(object, mapping[key])
    return f"{path}{found}"


def for_pipeline(deployment: Deployment, pipeline: str) -> dict[str, dict[str, Any]]:
    """The resource fields the deployment sets for ``pipeline`` (its own over those for every pipeline)."""
    every = deployment.get(EVERY_PIPELINE, {})
    own = deployment.get(pipeline, {})
    return {part: {**every.get(part, {}), **own.get(part, {})} for part in PARTS if part in every or part in own}


def _value(value: Any) -> Any:
    """``{env: NAME}`` becomes a Dagster ``EnvVar`` (read when the run starts, never stored)."""
    if isinstance(value, dict):
        mapping = cast(dict[str, Any], value)
        if set(mapping) == {"env"}:
            return dg.EnvVar(str(mapping["env"]))
        return mapping
    return cast(object, value)
