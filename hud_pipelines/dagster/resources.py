"""The Dagster resources of one pipeline: its sim, its contract, its agent and its graders.

Each is a typed ``ConfigurableResource`` whose defaults are the pipeline YAML's section, keyed
``<pipeline>__sim``, ``<pipeline>__contract``, ``<pipeline>__agent`` and ``<pipeline>__graders``
(resource keys must be unique across a code location). So a Dagster user sees each part of an eval
in the UI, can change one for a run from the launchpad or run config (``resources:
{cartpole_pd__sim: {config: {num_envs: 2}}}``), and a deployment can swap one (a served sim fleet
for spawned sims, see :mod:`hud_pipelines.dagster.deployment`) without touching the eval's YAML.

A run's sections are validated as the YAML is (the same models, errors naming the key) when the
resources are set up, before any sim starts; what differs from the YAML is an *override*, part of
the rollout hash and recorded with every result, so results of different configurations are never
mixed.

The sim resource owns the subprocesses: a lazy :class:`~hud_pipelines.sim.pool.SimPool` (no sim
starts until an asset asks for one, because ``dagster job execute`` / ``dg launch`` initialise a
job's resources once more after the run), closed in tear-down, which runs on success, failure and
cancellation. A set-up that fails has started nothing, so the missing tear-down leaks nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, cast

import dagster as dg
from pydantic import BaseModel, Field, PrivateAttr, SecretStr, TypeAdapter, ValidationError, create_model

from hud_pipelines.errors import ConfigurationError
from hud_pipelines.eval.runner import sim_settings
from hud_pipelines.sim.pool import SimPool
from hud_pipelines.spec.agent import AgentConfig
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.sim_section import DEFAULT_BUSY_TIMEOUT_S, DEFAULT_MAX_FRAME_MB, SimSpec


def resource_key(pipeline: str, part: str) -> str:
    """``<pipeline>__<part>``: the key of one of a pipeline's resources."""
    return f"{pipeline}__{part}"


SIM, CONTRACT, AGENT, GRADERS = "sim", "contract", "agent", "graders"

YamlMapping = dict  # pyright: ignore[reportMissingTypeArgument]
"""A YAML mapping as resource config: Dagster reads a bare ``dict`` as a permissive mapping, the only
kind whose members may be ``null`` (``dict[str, Any]`` refuses ``path: null``)."""


class SimResource(dg.ConfigurableResource):  # type: ignore[misc]
    """The sims of a pipeline: spawned from ``factory`` in child processes (or attached at ``url``), lazily,
    each owning its main thread; every one of them is stopped (its process group killed) when the run ends."""

    factory: str | None = Field(default=None, description="registry id, module:callable or file.py:callable")
    args: YamlMapping = Field(default_factory=YamlMapping, description="build arguments of the factory")
    num_envs: int = Field(default=1, description="slots per sim instance, stepped in lockstep")
    shards: int = Field(default=1, description="sim processes per instance, each serving a slice of the slots")
    startup_timeout_s: float = Field(default=120.0, description="deadline for a sim to build its envs and listen")
    step_timeout_s: float = Field(default=60.0, description="deadline of one reset or step request")
    busy_timeout_s: float = Field(
        default=DEFAULT_BUSY_TIMEOUT_S, description="how long an instance waits for served sims others drive"
    )
    python: str | None = Field(default=None, description="the sim's interpreter, or a uv project directory")
    hold: str = Field(default="last", description="action of a finished slot: last or zero")
    bounds: str = Field(default="clip", description="out-of-bounds continuous actions: clip or error")
    max_frame_mb: float = Field(default=DEFAULT_MAX_FRAME_MB, description="the largest message of a sim's link, MiB")
    data_files: list[str] = Field(default_factory=list, description="files the sim reads besides its code")
    url: str | None = Field(default=None, description="ws://host:port of a sim served elsewhere")
    urls: list[str] | None = Field(default=None, description="a fleet: ws://host:port of several served sims")
    fleet: str | None = Field(default=None, description="a fleet file: served sims, each with its token")
    token: str | None = Field(default=None, description="capability token of the sim at url (an EnvVar)")
    lerobot_env: YamlMapping | None = Field(default=None, description="a lerobot env config: type and its fields")
    project_dir: str = Field(default=".", description="directory the sim children start in (imports resolve there)")

    _pool: SimPool | None = PrivateAttr(default=None)

    def section(self) -> dict[str, Any]:
        """The ``sim`` section this resource stands for (without ``contract``: the contract resource's)."""
        return {
            "factory": self.factory,
            "args": _section(self.args),  # pyright: ignore[reportUnknownArgumentType]
            "num_envs": self.num_envs,
            "shards": self.shards,
            "startup_timeout_s": self.startup_timeout_s,
            "step_timeout_s": self.step_timeout_s,
            "busy_timeout_s": self.busy_timeout_s,
            "python": self.python,
            "hold": self.hold,
            "bounds": self.bounds,
            "max_frame_mb": self.max_frame_mb,
            "data_files": list(self.data_files),
            "url": self.url,
            "urls": self.urls,
            "fleet": self.fleet,
            "token": self.token,
            "lerobot_env": None if self.lerobot_env is None else _section(self.lerobot_env),  # pyright: ignore[reportUnknownArgumentType]
        }

    def pool(self, spec: PipelineSpec) -> SimPool:
        """The run's sim pool for ``spec`` (the effective spec of this run); created on first use."""
        if self._pool is None:
            self._pool = SimPool(sim_settings(spec, cwd=Path(self.project_dir)))
        return self._pool

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class ContractResource(dg.ConfigurableResource):  # type: ignore[misc]
    """The contract both sides share: derived from the sim, merged with the edited file, validated on every frame."""

    file: str | None = Field(
        default=None, description="contract.json relative to the pipeline YAML; none: derived in memory each run"
    )


class AgentResource(dg.ConfigurableResource):  # type: ignore[misc]
    """The agent that drives every slot: its policy (kind and settings, e.g. a checkpoint), batching and threads.
    The policy is built once per run and shared by the instances."""

    policy: YamlMapping = Field(description="the policy section: kind and its settings (path, checkpoint, seed)")
    horizon: int | None = Field(default=None, description="actions of each chunk executed before asking again")
    send_ahead: int = Field(default=8, description="steps sent to a served sim ahead of their observation")
    forward_timeout_s: float = Field(default=300.0, description="deadline of one policy forward")
    batching: YamlMapping = Field(default_factory=YamlMapping, description="max_wait_ms, batch_size, across_instances")
    torch_threads: int | None = Field(default=1, description="torch intra-op threads")
    lockstep_threads: Any = Field(  # an integer or "auto": Dagster's config has no union of scalars, the spec checks it
        default="auto", description="threads of a forward every sim waits on: a number, auto or null"
    )

    def section(self) -> dict[str, Any]:
        threads = _read_now(self.lockstep_threads, "agent.lockstep_threads")
        return {
            "policy": _section(self.policy),  # pyright: ignore[reportUnknownArgumentType]
            "horizon": self.horizon,
            "send_ahead": self.send_ahead,
            "forward_timeout_s": self.forward_timeout_s,
            "batching": _section(self.batching),  # pyright: ignore[reportUnknownArgumentType]
            "torch_threads": self.torch_threads,
            "lockstep_threads": threads,
        }


_ENV_READ = TypeAdapter(dict[Literal["env"], str])
"""``{env: NAME}``: as a run config writes it, and as Dagster gives an ``EnvVar`` default of a field back."""


def _read_now(value: object, key: str) -> object:
    """A field of any type, which Dagster hands over unread: an ``EnvVar`` or ``{env: NAME}`` is read from the
    environment now (an unset one is refused naming ``key``), and a number's text (``"2"``) is the number."""
    name = value.env_var_name if isinstance(value, dg.EnvVar) else None
    with contextlib.suppress(ValidationError):
        name = _ENV_READ.validate_python(value)["env"]
    if name is not None:
        if name not in os.environ:
            raise ConfigurationError(f"{key}: environment variable {name} is not set")
        value = os.environ[name]
    return int(value) if isinstance(value, str) and value.isdigit() else value


class GradersResource(dg.ConfigurableResource):  # type: ignore[misc]
    """How episodes are graded (the first grader decides) and the pass/fail checks on the grades."""

    graders: list[YamlMapping] = Field(description="graders, as under graders: in the YAML")
    checks: list[YamlMapping] = Field(  # pyright: ignore[reportUnknownVariableType]
        default_factory=list, description="checks, as under checks: in the YAML"
    )


RESOURCE_TYPES: dict[str, type[BaseModel]] = {
    SIM: SimResource,
    CONTRACT: ContractResource,
    AGENT: AgentResource,
    GRADERS: GradersResource,
}
"""Each part of a pipeline's resources and its class: what a deployment file's fields are checked against."""


@dataclass(frozen=True)
class PipelineResources:
    """The four resources of one pipeline, as the YAML (and the deployment) configure them."""

    sim: SimResource
    contract: ContractResource
    agent: AgentResource
    graders: GradersResource

    def by_key(self, pipeline: str) -> dict[str, object]:
        return {
            resource_key(pipeline, SIM): self.sim,
            resource_key(pipeline, CONTRACT): self.contract,
            resource_key(pipeline, AGENT): self.agent,
            resource_key(pipeline, GRADERS): self.graders,
        }


def pipeline_resources(
    spec: PipelineSpec, *, project_dir: Path, deployment: dict[str, dict[str, Any]] | None = None
) -> PipelineResources:
    """The resources of ``spec`` with the YAML's values as their configuration.

    ``deployment`` replaces fields per resource (``{"sim": {"url": ..., "token": EnvVar(...)}}``): the
    one construction path of the Dagster definitions, the CLI and :func:`~hud_pipelines.eval.steps.evaluate`.
    """
    swap = deployment or {}
    sim: dict[str, Any] = _plain(spec.sim.model_dump(exclude={"contract"}))
    agent: dict[str, Any] = _plain(spec.agent.model_dump())
    graders = [_plain(g.model_dump()) for g in spec.graders]
    checks = [_plain(c.model_dump()) for c in spec.checks]
    return PipelineResources(
        sim=_configured(SimResource, _fields(sim, {"project_dir": str(project_dir)}, swap.get(SIM, {}))),
        contract=_configured(ContractResource, _fields({"file": spec.sim.contract}, swap.get(CONTRACT, {}))),
        agent=_configured(AgentResource, _fields(agent, swap.get(AGENT, {}))),
        graders=_configured(GradersResource, _fields({"graders": graders, "checks": checks}, swap.get(GRADERS, {}))),
    )


def _configured[R: SimResource | ContractResource | AgentResource | GradersResource](
    kind: type[R], values: dict[str, Any]
) -> R:
    """An instance of a subclass of ``kind`` whose field *defaults* are ``values``.

    Dagster replaces a resource's whole configuration when a run configures it, filling the fields
    the run leaves out from the class defaults, not from the instance. With the YAML's values as the
    defaults, a run that sets only ``num_envs`` keeps the rest of the YAML, and the launchpad shows
    the YAML's values to start from.
    """
    fields: dict[str, Any] = {}
    declared: dict[str, Any] = dict(kind.model_fields)
    for name, value in values.items():
        field = declared[name]
        fields[name] = (field.annotation, Field(default=value, description=field.description))
    base: type[BaseModel] = kind
    model: type[BaseModel] = create_model(base.__name__, __base__=base, __doc__=base.__doc__, **fields)  # pyright: ignore[reportUnknownArgumentType]
    return cast(Callable[[], R], model)()


def _section(mapping: object) -> dict[str, Any]:
    """A permissive config mapping as a typed section dict."""
    return dict(cast(dict[str, Any], mapping))


def _fields(*layers: dict[str, Any]) -> dict[str, Any]:
    """Resource fields: the YAML's, then what the deployment replaces (later layers win)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    return merged


def _as_written(model: type[BaseModel], section: dict[str, Any]) -> dict[str, Any]:
    """``section`` without the entries that only repeat the model's defaults, as a YAML would leave them out
    (some rules depend on what is set: a sim attached by ``url`` must not set ``args``)."""
    kept: dict[str, Any] = {}
    for name, value in section.items():
        field = model.model_fields.get(name)
        if field is None or value != _plain(field.get_default(call_default_factory=True)):
            kept[name] = value
    return kept


def _plain(value: Any) -> Any:
    """A model dump as plain config values: secrets revealed (resources hold them), enums as their values."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return _plain(value.model_dump())
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in cast(dict[Any, Any], value).items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in cast(list[Any], value)]
    if isinstance(value, Path):
        return str(value)
    return value


def effective_spec(
    spec: PipelineSpec, sim: SimResource, contract: ContractResource, agent: AgentResource, graders: GradersResource
) -> PipelineSpec:
    """``spec`` as this run's resources configure it, validated like the YAML (errors name the key)."""
    return spec.with_sections(
        sim=_as_written(SimSpec, {**sim.section(), "contract": contract.file}),
        agent=_as_written(AgentConfig, agent.section()),
        graders=graders.graders,
        checks=graders.checks,
    )
