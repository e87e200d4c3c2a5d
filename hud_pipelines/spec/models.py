"""The pipeline spec: one YAML file per eval, as typed, frozen pydantic models.

The models are the single source of truth for what a pipeline file may say: unknown keys are
refused, implementations are chosen by a ``kind`` discriminator, and every field carries a
description from which both the JSON Schema (``schema/pipeline.schema.json``) and the YAML reference
(``docs/yaml-reference.md``) are generated.

Code that runs a pipeline reads these models, never YAML: :class:`PipelineSpec` answers the
questions a runner has (which partitions exist, which seeds a slot gets, which task dicts go to the
sim, where files referenced by the YAML are) so that the arithmetic lives in one place.

Paths written in a pipeline file (a contract, ``path/to/file.py:callable`` targets, checkpoints,
LeRobot folders) are relative to the file's directory; the models keep them as written (so the
spec hash does not depend on where a checkout lives) and resolve them on request against
:attr:`PipelineSpec.source`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Self, cast

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hud_pipelines.errors import ConfigurationError
from hud_pipelines.spec.agent import (
    AgentConfig,
    LeRobotPolicyConfig,
    ScriptedPolicyConfig,
    TorchPolicyConfig,
)
from hud_pipelines.spec.base import NAME_MAX_LENGTH, Count, Float, StrictModel, schema_default
from hud_pipelines.spec.grading import (
    CallableGrader,
    CheckSpec,
    GraderSpec,
    NoRegressionCheck,
    default_graders,
    refuse_builtin_names,
)
from hud_pipelines.spec.hashing import (
    CREDENTIALS,
    MISSING,
    SWEEP_SOURCES,
    canonical_hash,
    checkpoint_rollout_hash,
    flat,
    rollout_content,
)
from hud_pipelines.spec.messages import plain_message
from hud_pipelines.spec.model_paths import key_path
from hud_pipelines.spec.sections import (
    DEFAULT_DATASET_DIR,
    NAME_PATTERN,
    DatasetSpec,
    TaskSpec,
    TracesSpec,
    default_tasks,
    expand_tasks,
    is_file_target,
    require_unique,
)
from hud_pipelines.spec.sim_section import SimSpec

SOURCE_CONTEXT = "source"
"""Validation-context key under which the loader passes the YAML file's path."""


# -- the pipeline ---------------------------------------------------------------------------------


class Partition(NamedTuple):
    """One instance of one task: a single vectorized sim of ``num_envs`` slots."""

    task_index: int
    instance: int


class PipelineSpec(StrictModel):
    """One eval: a sim, an agent, the tasks it runs, how results are graded and checked, and the dataset."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=NAME_MAX_LENGTH,
        description="unique pipeline name (lowercase, digits, `_`): the Dagster key prefix and job name",
    )
    description: str = Field(default="", description="one line shown in the Dagster UI and in reports")
    sim: SimSpec = Field(description="the simulator")
    agent: AgentConfig = Field(description="the agent (policy, chunk horizon, batching) that drives every slot")
    tasks: list[TaskSpec] = Field(
        default_factory=default_tasks,
        json_schema_extra=schema_default([{"name": "task0", "seed": 0}]),
        min_length=1,
        description="task argument sets; default one task `task0` with seed 0",
    )
    group: Count = Field(
        default=1,
        description="instances per task (k statistical repeats); each instance is one sim of `num_envs` slots",
    )
    max_steps: Count = Field(default=1000, description="steps after which an episode is cut off (truncated)")
    max_concurrent: Count = Field(default=1, description="sim instances alive at once")
    rollout_timeout_s: Float = Field(
        default=600.0, gt=0, description="wall-clock bound of one instance; past it the instance's slots end as errored"
    )
    graders: list[GraderSpec] = Field(
        default_factory=default_graders,
        json_schema_extra=schema_default([{"kind": "success"}]),
        min_length=1,
        description="how each episode is graded; the first grader decides score and success, each other one adds "
        "`<name>_score` and `<name>_success` columns and a line of the report",
    )
    checks: list[CheckSpec] = Field(
        default_factory=list[CheckSpec],
        json_schema_extra=schema_default([]),
        description="pass/fail thresholds evaluated on the grades (Dagster asset checks), after the built-in "
        "blocking `instances_completed` (no instance failed) and `episodes_answered` (some episode was answered)",
    )
    traces: TracesSpec = Field(
        default_factory=TracesSpec,
        json_schema_extra=schema_default({}),
        description="what the per-episode traces keep (camera video)",
    )
    dataset: DatasetSpec | None = Field(default=None, description="the LeRobot dataset output; omitted: no dataset")

    _source: Path | None = PrivateAttr(None)
    _weights: tuple[PipelineSpec, str] | None = PrivateAttr(None)
    """For one checkpoint of a sweep: (the sweep, the checkpoint's content hash)."""

    # -- validation -------------------------------------------------------------------------------

    @field_validator("tasks")
    @classmethod
    def _name_tasks(cls, tasks: list[TaskSpec], info: ValidationInfo) -> list[TaskSpec]:
        sim = info.data.get("sim")  # validated before the tasks (declared first); absent when it failed
        return expand_tasks(tasks, sim.args if isinstance(sim, SimSpec) else None)

    @field_validator("graders")
    @classmethod
    def _unique_graders(cls, graders: list[GraderSpec]) -> list[GraderSpec]:
        require_unique([g.name for g in graders], "graders", "grader")
        return graders

    @field_validator("checks")
    @classmethod
    def _unique_checks(cls, checks: list[CheckSpec]) -> list[CheckSpec]:
        require_unique([c.name for c in checks], "checks", "check")
        refuse_builtin_names([c.name for c in checks])
        return checks

    @model_validator(mode="after")
    def _remember_source(self, info: ValidationInfo) -> Self:
        context = cast(object, info.context)
        if isinstance(context, Mapping):
            source = cast(Mapping[str, object], context).get(SOURCE_CONTEXT)
            if isinstance(source, str | Path):
                self._source = Path(source).resolve()
        return self

    # -- where the pipeline lives -----------------------------------------------------------------

    @property
    def source(self) -> Path | None:
        """The YAML file this spec was loaded from (absolute), or ``None`` for a spec built in code."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the spec are resolved against (the YAML file's, else the cwd)."""
        return self._source.parent if self._source is not None else Path.cwd()

    def resolve_path(self, path: str) -> Path:
        """An absolute path for ``path`` as written in the YAML file (``~`` expanded)."""
        expanded = Path(path).expanduser()
        return expanded if expanded.is_absolute() else (self.base_dir / expanded).resolve()

    def resolve_target(self, target: str) -> str:
        """``target`` with a relative ``file.py`` part made absolute; module paths and registry ids unchanged."""
        if not is_file_target(target):
            return target
        file_part, _, attribute = target.rpartition(":")
        return f"{self.resolve_path(file_part)}:{attribute}"

    @property
    def factory(self) -> str | None:
        """The sim factory ready for ``resolve_factory`` / ``SimProcess.spawn`` (``None`` when attached by URL)."""
        return None if self.sim.factory is None else self.resolve_target(self.sim.factory)

    @property
    def contract_path(self) -> Path | None:
        """Absolute path of the contract file, or ``None`` to keep the derived contract in memory."""
        return None if self.sim.contract is None else self.resolve_path(self.sim.contract)

    def resolved_agent(self) -> AgentConfig:
        """The agent settings with file-relative paths (targets, checkpoints, LeRobot folders) made absolute; a LeRobot
        policy on a ``lerobot_env`` sim is told that env config (it is fed as ``lerobot-eval`` feeds it)."""
        policy = self.agent.policy
        if isinstance(policy, ScriptedPolicyConfig):
            policy = policy.model_copy(update={"target": self.resolve_target(policy.target)})
        elif isinstance(policy, TorchPolicyConfig):
            checkpoint = None if policy.checkpoint is None else str(self.resolve_path(policy.checkpoint))
            policy = policy.model_copy(update={"target": self.resolve_target(policy.target), "checkpoint": checkpoint})
        elif isinstance(policy, LeRobotPolicyConfig) and policy.path is not None:
            policy = policy.model_copy(update={"path": str(self.resolve_path(policy.path))})
        if isinstance(policy, LeRobotPolicyConfig) and self.sim.lerobot_env is not None:
            policy = policy.for_lerobot_env(self.sim.lerobot_env)
        return self.agent.model_copy(update={"policy": policy})

    # -- sweeps -----------------------------------------------------------------------------------

    @property
    def is_sweep(self) -> bool:
        """Whether the agent names ``checkpoints`` (every checkpoint of a training run) instead of one policy."""
        policy = self.agent.policy
        return isinstance(policy, LeRobotPolicyConfig | TorchPolicyConfig) and policy.checkpoints is not None

    @property
    def checkpoint_hash(self) -> str | None:
        """The content hash of this sweep member's checkpoint (``None`` outside a sweep)."""
        return None if self._weights is None else self._weights[1]

    def for_checkpoint(self, path: Path, content_hash: str) -> PipelineSpec:
        """This sweep with one checkpoint's weights: the same sim, tasks, instances and seeds.

        Its rollout hash is the sweep's and the checkpoint's content together (not the folder's path),
        so a result stays current when the run directory moves and goes stale when the weights change.
        """
        policy = self.agent.policy
        if not self.is_sweep:
            raise ValueError(f"pipeline {self.name!r} is not a sweep (its policy names no checkpoints)")
        if isinstance(policy, TorchPolicyConfig):
            policy = policy.model_copy(update={"checkpoints": None, "checkpoint": str(path)})
        else:
            policy = policy.model_copy(update={"checkpoints": None, "path": str(path)})
        member = self.model_copy(update={"agent": self.agent.model_copy(update={"policy": policy})})
        member._source = self._source
        member._weights = (self, content_hash)
        return member

    def resolved_graders(self) -> list[GraderSpec]:
        """The graders with file-relative ``callable`` targets made absolute."""
        return [
            g.model_copy(update={"target": self.resolve_target(g.target)}) if isinstance(g, CallableGrader) else g
            for g in self.graders
        ]

    def resolved_checks(self) -> list[CheckSpec]:
        """The checks with file-relative ``baseline`` paths made absolute."""
        return [
            c.model_copy(update={"baseline": str(self.resolve_path(c.baseline))})
            if isinstance(c, NoRegressionCheck)
            else c
            for c in self.checks
        ]

    # -- partitions, slots and seeds --------------------------------------------------------------

    def partitions(self) -> list[Partition]:
        """Every (task, instance) pair, task-major: the unit of work that one sim instance runs."""
        return [Partition(t, i) for t in range(len(self.tasks)) for i in range(self.group)]

    def partition_key(self, task_index: int, instance: int) -> str:
        """Stable string key of a partition, ``<task name>-i<instance>`` (``task0-i0`` by default)."""
        self._check_partition(task_index, instance)
        return f"{self.tasks[task_index].name}-i{instance}"

    def partition_keys(self) -> list[str]:
        """Keys of :meth:`partitions`, in the same order (a Dagster ``StaticPartitionsDefinition``)."""
        return [self.partition_key(*p) for p in self.partitions()]

    def partition_for_key(self, key: str) -> Partition:
        """The partition a key names; a ``KeyError`` naming the known keys otherwise."""
        for partition in self.partitions():
            if self.partition_key(*partition) == key:
                return partition
        raise KeyError(f"pipeline {self.name!r} has no partition {key!r}; known: {', '.join(self.partition_keys())}")

    def seeds_for(self, task_index: int, instance: int) -> list[int]:
        """Seed of each slot of an instance: ``seed + instance * num_envs + slot``, distinct across a task's slots."""
        self._check_partition(task_index, instance)
        num_envs = self.sim.num_envs
        base = self.tasks[task_index].seed + instance * num_envs
        return [base + slot for slot in range(num_envs)]

    def build_args(self, task_index: int) -> dict[str, Any]:
        """Build arguments of a task: ``sim.args`` overridden key by key by the task's ``args``."""
        return {**self.sim.args, **self.tasks[task_index].args}

    def slot_tasks(self, task_index: int, instance: int) -> list[dict[str, Any]]:
        """The per-slot task dicts for ``reset``: seed, reset options and the task's full build arguments.

        The full build arguments (not only the task's overrides) are sent so that a sim reused across
        tasks is rebuilt back to ``sim.args`` after a task that changed them.
        """
        task = self.tasks[task_index]
        build = self.build_args(task_index)
        return [{**build, "seed": seed, "options": dict(task.options)} for seed in self.seeds_for(task_index, instance)]

    @property
    def slots_per_task(self) -> int:
        """Graded episodes per task: ``group * num_envs``."""
        return self.group * self.sim.num_envs

    @property
    def scheduled_slots(self) -> int:
        """Graded episodes of the whole pipeline (the denominator of its rates)."""
        return len(self.tasks) * self.slots_per_task

    def _check_partition(self, task_index: int, instance: int) -> None:
        if not 0 <= task_index < len(self.tasks) or not 0 <= instance < self.group:
            raise IndexError(
                f"pipeline {self.name!r} has tasks 0..{len(self.tasks) - 1} and instances 0..{self.group - 1}, "
                f"not ({task_index}, {instance})"
            )

    # -- outputs ----------------------------------------------------------------------------------

    @property
    def dataset_enabled(self) -> bool:
        return self.dataset is not None and self.dataset.enabled

    def dataset_root(self, project_root: Path) -> Path:
        """Absolute dataset directory: ``dataset.root`` or ``outputs/datasets/<name>`` under ``project_root``."""
        root = self.dataset.root if self.dataset is not None and self.dataset.root else None
        relative = Path(root).expanduser() if root else DEFAULT_DATASET_DIR / self.name
        return relative if relative.is_absolute() else (project_root / relative).resolve()

    @property
    def dataset_repo_id(self) -> str:
        """LeRobot ``repo_id`` of the dataset: ``dataset.repo_id`` or ``local/<name>``."""
        if self.dataset is not None and self.dataset.repo_id:
            return self.dataset.repo_id
        return f"local/{self.name}"

    @property
    def spec_hash(self) -> str:
        """SHA-256 of the spec's content (after ``${VAR}`` interpolation, secrets masked), as hex.

        Stable across processes and checkouts (paths are hashed as written, not resolved) and
        changed by any edit to a value, the description included; a different token leaves it alone
        (the token is a credential, not an input). Use it as a code or data version.
        """
        return canonical_hash(self.model_dump(mode="json"))

    def with_sections(self, **sections: Any) -> PipelineSpec:
        """This spec with whole top-level sections replaced (a run's resource configuration).

        The sections are validated exactly as the YAML is; a problem raises :class:`ConfigurationError`
        naming the key (``sim.num_envs``), before anything runs.
        """
        kept = {name: getattr(self, name) for name in type(self).model_fields if name not in sections}
        try:
            spec = PipelineSpec.model_validate({**kept, **sections}, context={SOURCE_CONTEXT: self._source})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in key_path(error, type(self)))}: {plain_message(error)}"
                for error in exc.errors()
            )
            raise ConfigurationError(
                f"pipeline {self.name!r}: the run's configuration is invalid: {problems}", errors=exc.errors()
            ) from None
        spec._source = self._source
        return spec

    def overrides(self, base: PipelineSpec) -> dict[str, Any]:
        """What this spec sets differently from ``base``: ``{"sim.num_envs": 2, ...}`` (credentials left out)."""
        mine = flat(self.model_dump(mode="json", exclude=CREDENTIALS))
        theirs = flat(base.model_dump(mode="json", exclude=CREDENTIALS))
        return {key: value for key, value in mine.items() if theirs.get(key, MISSING) != value}

    @property
    def rollout_hash(self) -> str:
        """SHA-256 of what decides the graded rows (sim, agent, tasks, steps, graders): a run's configuration.

        Editing a check, the description or the dataset section keeps it, editing the policy or a seed does not.
        Credentials (:data:`CREDENTIALS`) never enter it: rotating a key changes who may connect, not a rollout."""
        return self._rollout_hash(self.tasks)

    def task_rollout_hash(self, task_index: int, *, with_matrix: bool = False) -> str:
        """The rollout hash of one task's instances, which their results carry: the pipeline's with that task alone,
        so that adding, removing or editing another task (a benchmark's, a matrix value) keeps them; a control's
        ``matrix`` is left out, as it adds tasks, not episodes (``with_matrix``: in, as older results carry it)."""
        return self._rollout_hash([self.tasks[task_index]], with_matrix)

    def _rollout_hash(self, tasks: list[TaskSpec], with_matrix: bool = False) -> str:
        if self._weights is not None:
            sweep, content_hash = self._weights
            return checkpoint_rollout_hash(sweep._rollout_hash(tasks, with_matrix), content_hash)
        # a sweep's checkpoints are identified by their content, per member, not by where they are listed
        exclude = SWEEP_SOURCES if self.is_sweep else CREDENTIALS
        dumped = self.model_dump(mode="json", include={"sim", "agent", "max_steps", "graders"}, exclude=exclude)
        dumped["tasks"] = [task.model_dump(mode="json") | ({} if with_matrix else {"matrix": {}}) for task in tasks]
        return canonical_hash(rollout_content(dumped))
