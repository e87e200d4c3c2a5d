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

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Self, cast

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hud_pipelines.dataset.options import CameraStorage, DatasetOptions, VideoCodec
from hud_pipelines.errors import ConfigurationError
from hud_pipelines.recording.traces import DEFAULT_MAX_VIDEOS, TraceVideo
from hud_pipelines.sim.actions import BoundsMode, HoldMode
from hud_pipelines.spec.agent import (
    AgentConfig,
    LeRobotPolicyConfig,
    ScriptedPolicyConfig,
    TorchPolicyConfig,
)
from hud_pipelines.spec.base import Float, Int, StrictModel

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
"""Pipeline names become Dagster key prefixes and job names."""
TASK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
"""Task names appear in partition keys (``<task>-i<instance>``)."""
CHECK_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
"""Grader and check names become Dagster check names and grade-table columns."""
SOURCE_CONTEXT = "source"
"""Validation-context key under which the loader passes the YAML file's path."""
DEFAULT_DATASET_DIR = Path("outputs") / "datasets"
CREDENTIALS: dict[str, Any] = {"sim": {"token"}, "agent": {"policy": {"api_key"}}}
"""The secret fields of a pipeline, as a pydantic ``exclude`` (they never decide a rollout)."""
SWEEP_SOURCES: dict[str, Any] = {"sim": {"token"}, "agent": {"policy": {"api_key", "checkpoints"}}}
"""What a sweep's rollout hash leaves out: the credentials and where its checkpoints are listed."""


def spec_rule(at: str, message: str) -> PydanticCustomError:
    """A cross-field rule violation located at ``at`` (a dotted key path relative to the model)."""
    return PydanticCustomError("spec_rule", "{message}", {"message": message, "at": at})


def _omit_default(schema: dict[str, Any]) -> None:
    # For fields whose default is derived from elsewhere (a position, a kind): documented in prose
    # instead of an editor offering a meaningless placeholder.
    schema.pop("default", None)


def _schema_default(value: Any) -> Any:
    """Show a ``default_factory`` default in the JSON Schema (pydantic leaves it out)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["default"] = value

    return extra


def is_file_target(target: str) -> bool:
    """``path/to/file.py:callable`` rather than ``package.module:callable`` or a registry id."""
    module, sep, _ = target.rpartition(":")
    return bool(sep) and module.endswith(".py")


# -- sim ------------------------------------------------------------------------------------------


SPAWN_ONLY_FIELDS = ("args", "contract", "startup_timeout_s", "hold", "bounds", "python")
"""Sim settings that configure a child the pipeline spawns; a sim attached by ``url`` was set up by its server."""


class SimSpec(StrictModel):
    """The simulator: spawned from a factory in a child process, or attached to by URL."""

    factory: str | None = Field(
        default=None,
        min_length=1,
        description="gymnasium registry id (`CartPole-v1`, `gym_pusht/PushT-v0`), `module:callable`, or "
        "`path/to/file.py:callable` relative to the YAML file; exactly one of `factory` and `url`",
    )
    args: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=_schema_default({}),
        description="build arguments of the factory (its keyword parameters; `gym.make` keywords for a registry id)",
    )
    num_envs: Int = Field(
        default=1,
        ge=1,
        description="slots per sim instance, stepped in lockstep (a vectorized factory batches them natively; a "
        "registry id uses gymnasium's `sync` vector env, so every slot keeps its own seed, unless `args` sets "
        "`vectorization_mode`); with `url`: the slots the served sim has",
    )
    contract: str | None = Field(
        default=None,
        min_length=1,
        description="contract.json relative to the YAML file: written from the derived contract on first use, "
        "edited by hand afterwards (names, descriptions, types, bounds); an eval refuses a file whose shapes no "
        "longer match the env, and `hud-pipelines contract <pipeline>` refreshes it, keeping the edits that "
        "still fit; omitted: derived in memory each run",
    )
    startup_timeout_s: Float = Field(
        default=120.0, gt=0, description="deadline for the sim child to build its envs and listen"
    )
    step_timeout_s: Float = Field(default=60.0, gt=0, description="deadline of one reset or step request")
    python: str | None = Field(
        default=None,
        min_length=1,
        exclude_if=lambda value: value is None,  # unset, it leaves the rollout hash as it was before it existed
        description="the Python the sim child runs under, relative to the YAML file: an interpreter "
        "(`/opt/isaac/python.sh`), or a uv project directory whose `.venv/bin/python` is used (`../sims/metaworld`, "
        "set up by `uv sync --project sims/metaworld`); it needs numpy, gymnasium, pydantic, msgpack and websockets "
        "(the sim side of hud-pipelines, which is put on its `PYTHONPATH`), never torch; omitted: the agent's own",
    )
    hold: HoldMode = Field(
        default=HoldMode.LAST,
        description="action a finished slot receives while the others keep stepping: `last` or `zero`",
    )
    bounds: BoundsMode = Field(
        default=BoundsMode.CLIP, description="out-of-bounds continuous actions: `clip` into the bounds, or `error`"
    )
    url: str | None = Field(
        default=None,
        pattern=r"^wss?://",
        description="`ws://host:port` of a sim served elsewhere (`hud-pipelines serve`); exactly one of "
        "`factory` and `url`",
    )
    token: SecretStr | None = Field(
        default=None,
        description="capability token of the sim at `url` (required with `url`; write `${VAR}` to keep it out of git)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.factory is None and self.url is None:
            raise spec_rule("factory", "the sim needs exactly one of 'factory' (spawn it) and 'url' (attach to it)")
        if self.factory is not None and self.url is not None:
            raise spec_rule("url", "'factory' and 'url' exclude each other: spawn a sim or attach to one, not both")
        if self.url is not None:
            if self.token is None:
                raise spec_rule("url", "a sim attached by 'url' needs its 'token' (e.g. token: ${HUD_SIM_TOKEN})")
            for key in SPAWN_ONLY_FIELDS:
                if key in self.model_fields_set:
                    raise spec_rule(
                        key, f"{key!r} configures a spawned sim; a sim attached by 'url' is set up by its server"
                    )
        elif self.token is not None:
            raise spec_rule("token", "'token' belongs to a sim attached by 'url'; a spawned sim gets a fresh one")
        return self

    @property
    def spawned(self) -> bool:
        """The pipeline starts (and owns) the sim, rather than attaching to one served elsewhere."""
        return self.factory is not None

    def serve_options(self) -> list[str]:
        """Command-line options of ``hud-pipelines serve`` that carry this spec's sim-side settings."""
        return ["--hold", self.hold.value, "--bounds", self.bounds.value]


# -- tasks ----------------------------------------------------------------------------------------


class TaskSpec(StrictModel):
    """One set of task arguments; every instance of the task runs it in all of its slots."""

    name: str = Field(
        default="",
        pattern=TASK_NAME_PATTERN,
        description="unique name used in partition keys and reports; default `task<i>` (its position in the list)",
        json_schema_extra=_omit_default,
    )
    seed: Int = Field(
        default=0,
        ge=0,
        description="base seed: slot j of instance i gets `seed + i * num_envs + j`, so every slot differs",
    )
    options: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=_schema_default({}),
        description="`reset(options=...)` of every slot",
    )
    args: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=_schema_default({}),
        description="build arguments for this task (override `sim.args` key by key)",
    )
    prompt: str | None = Field(
        default=None, description="task string for the policy and the dataset; default: the one the sim offers"
    )


# -- graders --------------------------------------------------------------------------------------


class _Named(StrictModel):
    name: str = Field(
        default="",
        pattern=CHECK_NAME_PATTERN,
        description="unique name among its siblings (a column or check name); default: the `kind`",
        json_schema_extra=_omit_default,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data and isinstance(data.get("kind"), str):
            return {**data, "name": data["kind"]}  # pyright: ignore[reportUnknownVariableType]
        return data  # pyright: ignore[reportUnknownVariableType]


class SuccessGrader(_Named):
    """Success from the env's own signal (`info["is_success"]`, `success`, `task_success`); score 1 or 0."""

    kind: Literal["success"] = Field(default="success", description="selects this grader")


class ReturnGrader(_Named):
    """Score is the episode return; success when the return reaches `threshold` (when given)."""

    kind: Literal["return"] = Field(default="return", description="selects this grader")
    threshold: Float | None = Field(
        default=None,
        description="return at or above which an episode succeeded; omitted: the env's success signal decides",
    )


class CallableGrader(_Named):
    """A Python function by import path grades each episode."""

    kind: Literal["callable"] = Field(default="callable", description="selects this grader")
    target: str = Field(
        min_length=1,
        description="`module:function` or `path/to/file.py:function` (relative to the YAML file) called as "
        "`target(episode: dict)` and returning a float score, a bool success, or a dict with `score` and `success`",
    )


GraderSpec = Annotated[SuccessGrader | ReturnGrader | CallableGrader, Field(discriminator="kind")]


# -- checks ---------------------------------------------------------------------------------------


class _Check(_Named):
    blocking: bool = Field(
        default=True, description="a failing blocking check fails the run and stops downstream assets"
    )


class MinSuccessRateCheck(_Check):
    """Passes when succeeded / (succeeded + failed) is at least `value`.

    Errored slots are not failures (bound them with `max_error_rate`); no graded slot at all fails the check.
    """

    kind: Literal["min_success_rate"] = Field(default="min_success_rate", description="selects this check")
    value: Float = Field(ge=0.0, le=1.0, description="lowest acceptable success rate, 0..1")


class MaxErrorRateCheck(_Check):
    """Passes when the share of errored slots (sim or policy faults) is at most `value`."""

    kind: Literal["max_error_rate"] = Field(default="max_error_rate", description="selects this check")
    value: Float = Field(ge=0.0, le=1.0, description="highest acceptable error rate, 0..1")


class MinMeanScoreCheck(_Check):
    """Passes when the mean score of the graded (non-errored) slots is at least `value`."""

    kind: Literal["min_mean_score"] = Field(default="min_mean_score", description="selects this check")
    value: Float = Field(description="lowest acceptable mean score (in the first grader's units)")


class NoRegressionCheck(_Check):
    """Fails when this eval is significantly worse than a baseline run on the same episodes.

    The rows pair up by (task, instance, slot, seed) with the baseline's `grades.json`; McNemar's exact
    test on the paired successes decides. The check fails when the candidate is worse at `confidence`
    and its success rate dropped by more than `max_drop`; when the data cannot tell, it passes and says
    how many paired episodes an answer would take.
    """

    kind: Literal["no_regression"] = Field(default="no_regression", description="selects this check")
    baseline: str = Field(
        min_length=1, description="the baseline's grades.json (or its outputs folder), relative to the YAML file"
    )
    max_drop: Float = Field(default=0.05, ge=0.0, le=1.0, description="largest tolerated drop in success rate, 0..1")
    confidence: Float = Field(default=0.95, gt=0.5, lt=1.0, description="confidence of the verdict (1 - alpha)")


CheckSpec = Annotated[
    MinSuccessRateCheck | MaxErrorRateCheck | MinMeanScoreCheck | NoRegressionCheck, Field(discriminator="kind")
]


# -- dataset --------------------------------------------------------------------------------------


class TracesSpec(StrictModel):
    """What the per-episode traces keep besides their JSON lines."""

    video: TraceVideo = Field(
        default=TraceVideo.FAILED,
        description="camera video per episode, encoded off the stepping path: `failed` (episodes that failed or "
        "errored, the ones worth watching), `all`, or `none`",
    )
    max_videos: Int = Field(
        default=DEFAULT_MAX_VIDEOS, ge=0, description="episodes per instance that keep a video, at most"
    )


class DatasetSpec(StrictModel):
    """Where and how the rollouts are written as a LeRobot v3 dataset."""

    enabled: bool = Field(default=True, description="write the dataset; `false` keeps the section but skips the asset")
    video: bool = Field(default=True, description="store cameras as video (`true`) or as PNG images (`false`)")
    root: str | None = Field(
        default=None,
        min_length=1,
        description="dataset directory relative to the project root; default `outputs/datasets/<name>`",
    )
    repo_id: str | None = Field(
        default=None,
        pattern=r"^[^/\s]+/[^/\s]+$",
        description="LeRobot `repo_id` (`owner/name`); default `local/<name>`",
    )
    keep_errored: bool = Field(
        default=False,
        description="also write episodes of errored slots (their frames up to the fault), flagged by an "
        "`episode.errored` column",
    )
    codec: VideoCodec = Field(
        default=VideoCodec.H264, description="video codec: `h264` (fast, the default) or `libsvtav1` (smaller)"
    )
    state_features: list[str] | None = Field(
        default=None,
        description="observation features concatenated, in this order, into `observation.state`; default: every "
        "non-camera observation feature in contract order (the others become `observation.<name>`)",
    )
    writers: Int = Field(default=1, ge=1, le=32, description="writers per instance shard, each writing one part")

    def writer_options(self) -> DatasetOptions:
        """The writer settings this section asks for."""
        return DatasetOptions(
            cameras=CameraStorage.VIDEO if self.video else CameraStorage.IMAGE,
            codec=self.codec,
            state_features=self.state_features,
            keep_errored=self.keep_errored,
            writers=self.writers,
        )


# -- the pipeline ---------------------------------------------------------------------------------


class Partition(NamedTuple):
    """One instance of one task: a single vectorized sim of ``num_envs`` slots."""

    task_index: int
    instance: int


def _default_tasks() -> list[TaskSpec]:
    return [TaskSpec(name="task0")]


def _default_graders() -> list[GraderSpec]:
    return [SuccessGrader(name="success")]


class PipelineSpec(StrictModel):
    """One eval: a sim, an agent, the tasks it runs, how results are graded and checked, and the dataset."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description="unique pipeline name (lowercase, digits, `_`): the Dagster key prefix and job name",
    )
    description: str = Field(default="", description="one line shown in the Dagster UI and in reports")
    sim: SimSpec = Field(description="the simulator")
    agent: AgentConfig = Field(description="the agent (policy, chunk horizon, batching) that drives every slot")
    tasks: list[TaskSpec] = Field(
        default_factory=_default_tasks,
        json_schema_extra=_schema_default([{"name": "task0", "seed": 0}]),
        min_length=1,
        description="task argument sets; default one task `task0` with seed 0",
    )
    group: Int = Field(
        default=1,
        ge=1,
        description="instances per task (k statistical repeats); each instance is one sim of `num_envs` slots",
    )
    max_steps: Int = Field(default=1000, ge=1, description="steps after which an episode is cut off (truncated)")
    max_concurrent: Int = Field(default=1, ge=1, description="sim instances alive at once")
    rollout_timeout_s: Float = Field(
        default=600.0, gt=0, description="wall-clock bound of one instance; past it the instance's slots end as errored"
    )
    graders: list[GraderSpec] = Field(
        default_factory=_default_graders,
        json_schema_extra=_schema_default([{"kind": "success"}]),
        min_length=1,
        description="how each episode is graded; the first grader decides score and success, the others add columns",
    )
    checks: list[CheckSpec] = Field(
        default_factory=list[CheckSpec],
        json_schema_extra=_schema_default([]),
        description="pass/fail thresholds evaluated on the grades (Dagster asset checks)",
    )
    traces: TracesSpec = Field(
        default_factory=TracesSpec,
        json_schema_extra=_schema_default({}),
        description="what the per-episode traces keep (camera video)",
    )
    dataset: DatasetSpec | None = Field(default=None, description="the LeRobot dataset output; omitted: no dataset")

    _source: Path | None = PrivateAttr(None)
    _weights: tuple[str, str] | None = PrivateAttr(None)
    """For one checkpoint of a sweep: (the sweep's rollout hash, the checkpoint's content hash)."""

    # -- validation -------------------------------------------------------------------------------

    @field_validator("tasks")
    @classmethod
    def _name_tasks(cls, tasks: list[TaskSpec]) -> list[TaskSpec]:
        named = [t if t.name else t.model_copy(update={"name": f"task{i}"}) for i, t in enumerate(tasks)]
        _require_unique([t.name for t in named], "tasks", "task")
        return named

    @field_validator("graders")
    @classmethod
    def _unique_graders(cls, graders: list[GraderSpec]) -> list[GraderSpec]:
        _require_unique([g.name for g in graders], "graders", "grader")
        return graders

    @field_validator("checks")
    @classmethod
    def _unique_checks(cls, checks: list[CheckSpec]) -> list[CheckSpec]:
        _require_unique([c.name for c in checks], "checks", "check")
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
        """The agent settings with file-relative paths (targets, checkpoints, LeRobot folders) made absolute."""
        policy = self.agent.policy
        if isinstance(policy, ScriptedPolicyConfig):
            policy = policy.model_copy(update={"target": self.resolve_target(policy.target)})
        elif isinstance(policy, TorchPolicyConfig):
            checkpoint = None if policy.checkpoint is None else str(self.resolve_path(policy.checkpoint))
            policy = policy.model_copy(update={"target": self.resolve_target(policy.target), "checkpoint": checkpoint})
        elif isinstance(policy, LeRobotPolicyConfig) and policy.path is not None:
            policy = policy.model_copy(update={"path": str(self.resolve_path(policy.path))})
        return self.agent.model_copy(update={"policy": policy})

    # -- sweeps -----------------------------------------------------------------------------------

    @property
    def is_sweep(self) -> bool:
        """Whether the agent names ``checkpoints`` (every checkpoint of a training run) instead of one policy."""
        policy = self.agent.policy
        return isinstance(policy, LeRobotPolicyConfig | TorchPolicyConfig) and policy.checkpoints is not None

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
        member._weights = (self.rollout_hash, content_hash)
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
        return _hash(self.model_dump(mode="json"))

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
                f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
            )
            raise ConfigurationError(
                f"pipeline {self.name!r}: the run's configuration is invalid: {problems}"
            ) from None
        spec._source = self._source
        return spec

    def overrides(self, base: PipelineSpec) -> dict[str, Any]:
        """What this spec sets differently from ``base``: ``{"sim.num_envs": 2, ...}`` (credentials left out)."""
        mine = _flat(self.model_dump(mode="json", exclude=CREDENTIALS))
        theirs = _flat(base.model_dump(mode="json", exclude=CREDENTIALS))
        return {key: value for key, value in mine.items() if theirs.get(key, _MISSING) != value}

    @property
    def rollout_hash(self) -> str:
        """SHA-256 of what decides an instance's graded rows: sim, agent, tasks, steps and graders.

        Results of an instance that ran under another rollout hash are stale: editing a check, the
        description or the dataset section keeps them, editing the policy or a seed does not.
        Credentials (:data:`CREDENTIALS`) are left out altogether: rotating a key, or starting to
        pass one, changes who may connect, not what a rollout does.
        """
        if self._weights is not None:
            return checkpoint_rollout_hash(*self._weights)
        # a sweep's checkpoints are identified by their content, per member, not by where they are listed
        exclude = SWEEP_SOURCES if self.is_sweep else CREDENTIALS
        dumped = self.model_dump(
            mode="json", include={"sim", "agent", "tasks", "max_steps", "graders"}, exclude=exclude
        )
        return _hash(dumped)


_MISSING = object()


def _flat(value: object, prefix: str = "") -> dict[str, Any]:
    """``{"sim": {"num_envs": 2}}`` -> ``{"sim.num_envs": 2}`` (lists stay whole: they are one setting)."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in cast(dict[str, Any], value).items():
            flat |= _flat(item, f"{prefix}{key}.")
        return flat
    return {prefix.rstrip("."): value}


def checkpoint_rollout_hash(sweep_rollout_hash: str, content_hash: str) -> str:
    """The rollout hash of one checkpoint of a sweep: the sweep's and the weights' content, nothing else."""
    return _hash({"sweep": sweep_rollout_hash, "checkpoint": content_hash})


def _hash(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _require_unique(names: list[str], field: str, noun: str) -> None:
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise spec_rule(
                f"{index}.name",
                f"{noun} name {name!r} is already used by {field}[{seen[name]}]; give each {noun} a unique 'name'",
            )
        seen[name] = index
