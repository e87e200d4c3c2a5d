"""The sections of a pipeline file: its tasks, traces and the dataset, and the field rules sections share.

Each is a strict, frozen model (:mod:`hud_pipelines.spec.base`) whose field descriptions become the
JSON Schema and the YAML reference; :class:`~hud_pipelines.spec.models.PipelineSpec` puts them
together and answers the questions that span sections (partitions, seeds, paths). The sim section
is :mod:`hud_pipelines.spec.sim_section`, graders and checks are :mod:`hud_pipelines.spec.grading`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_core import PydanticCustomError

from hud_pipelines.recording.traces import DEFAULT_MAX_VIDEOS, TraceVideo
from hud_pipelines.spec.base import Count, Int, StrictModel, name_field, schema_default
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions, VideoCodec

MAX_SEED = 2**63 - 1
"""Seeds travel as 64-bit integers (the wire's msgpack); a slot's seed adds its position to its task's."""
TASK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"
"""Task names appear in partition keys (``<task>-i<instance>``)."""

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
"""A pipeline's, a check's or a column's name: lowercase letters, digits and '_', starting with a letter."""
CHECK_NAME_PATTERN = NAME_PATTERN
"""Grader and check names become Dagster check names and grade-table columns."""

DEFAULT_DATASET_DIR = Path("outputs") / "datasets"


def spec_rule(at: str, message: str) -> PydanticCustomError:
    """A cross-field rule violation located at ``at`` (a dotted key path relative to the model)."""
    return PydanticCustomError("spec_rule", "{message}", {"message": message, "at": at})


def spec_rules(rules: list[tuple[str, str]]) -> PydanticCustomError:
    """Several ``(at, message)`` violations found by one check, each reported at its own key (a
    validator stops at its first error: one per run of ``validate`` would make a user fix them one by one)."""
    (at, message), *more = rules
    return PydanticCustomError("spec_rule", "{message}", {"message": message, "at": at, "more": more})


def is_file_target(target: str) -> bool:
    """``path/to/file.py:callable`` rather than ``package.module:callable`` or a registry id."""
    module, sep, _ = target.rpartition(":")
    return bool(sep) and module.endswith(".py")


# -- tasks ----------------------------------------------------------------------------------------


MatrixValue = str | int | float | bool
"""A value of one matrix axis: written into the task's build arguments."""


class Variant(StrictModel):
    """What a matrix task changes: one build argument of its control task."""

    control: str = Field(description="the task this one is paired with")
    axis: str = Field(description="the build argument it changes")
    value: MatrixValue = Field(description="the value it gives that argument")


def _value_name(value: MatrixValue) -> str:
    """A matrix value as part of a task name (lowercase, digits, `_`, `.`, `-`)."""
    text = str(value).lower()
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text).strip("_") or "value"


class TaskSpec(StrictModel):
    """One set of task arguments; every instance of the task runs it in all of its slots."""

    name: str = name_field(
        TASK_NAME_PATTERN,
        "unique name used in partition keys and reports; default `task<i>` (its position in the list)",
    )
    seed: Int = Field(
        default=0,
        ge=0,
        le=MAX_SEED,
        description="base seed: slot j of instance i gets `seed + i * num_envs + j`, so every slot differs",
    )
    options: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=schema_default({}),
        description="`reset(options=...)` of every slot",
    )
    args: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=schema_default({}),
        description="build arguments for this task (override `sim.args` key by key)",
    )
    prompt: str | None = Field(
        default=None, description="task string for the policy and the dataset; default: the one the sim offers"
    )
    matrix: dict[str, list[MatrixValue]] = Field(
        default_factory=dict[str, list[MatrixValue]],
        json_schema_extra=schema_default({}),
        description="a perturbation study: build argument -> values; adds one task per value, named "
        "`<task>-<argument>-<value>`, each with that one argument changed and the same seeds, so this task is "
        "the control arm every value is paired with",
    )
    variant_of: Variant | None = Field(
        default=None, description="set on the tasks a `matrix` adds: the control task and the value they change"
    )

    @property
    def control(self) -> str:
        """The task this one is paired with: a matrix arm's control, else itself."""
        return self.variant_of.control if self.variant_of is not None else self.name

    def variants(self) -> list[TaskSpec]:
        """The tasks ``matrix`` adds: one per (argument, value), one argument changed at a time."""
        return [
            TaskSpec(
                name=f"{self.name}-{_value_name(axis)}-{_value_name(value)}",
                seed=self.seed,
                options=self.options,
                args={**self.args, axis: value},
                prompt=self.prompt,
                variant_of=Variant(control=self.name, axis=axis, value=value),
            )
            for axis, values in self.matrix.items()
            for value in values
        ]


def expand_tasks(tasks: list[TaskSpec], sim_args: Mapping[str, Any] | None = None) -> list[TaskSpec]:
    """Name the tasks (``task<i>``) and add each matrix's tasks right after its control.

    A spec validated again (a dumped spec loaded back) holds the tasks its matrices added: each is
    kept once, as it is, when it is exactly what its control's matrix adds. A ``variant_of`` that
    says anything else is refused (it would pair the task with a control under a change it does not
    make), and so is a matrix task whose name another task has: a perturbation arm is never dropped
    or graded under another task's configuration. Every problem is reported at once, located at the
    file's own tasks.
    """
    named = [t if t.name else t.model_copy(update={"name": f"task{i}"}) for i, t in enumerate(tasks)]
    require_unique([t.name for t in named], "tasks", "task")
    controls = [(index, task) for index, task in enumerate(named) if task.variant_of is None]
    added = {variant.name: variant for _, control in controls for variant in control.variants()}
    problems = [
        (
            f"{index}.variant_of",
            f"task {task.name!r} is not one that the matrix of task {task.variant_of.control!r} adds: "
            f"'variant_of' is set by a matrix; write matrix: {{{task.variant_of.axis}: [...]}} on the control task",
        )
        for index, task in enumerate(named)
        if task.variant_of is not None and added.get(task.name) != task
    ]
    problems += _matrix_problems(controls, sim_args or {})
    if problems:
        raise spec_rules(problems)
    return [task for _, control in controls for task in (control, *control.variants())]


def _matrix_problems(controls: list[tuple[int, TaskSpec]], sim_args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with the matrices of ``controls`` (index in the file, task): an axis of no values, a
    value that is the control's own (that arm would be the control again), an added task whose name is taken."""
    problems: list[tuple[str, str]] = []
    owners = {task.name: f"tasks[{index}] has already; rename that task" for index, task in controls}
    for index, control in controls:
        own = {**sim_args, **control.args}  # the control's build arguments: sim.args under its own
        for axis, values in control.matrix.items():
            if not values:
                problems.append((f"{index}.matrix.{axis}", "no values: give the values to try, or remove the axis"))
            elif axis in own and any(value == own[axis] for value in values):
                whose = "control's own" if axis in control.args else "control's (from sim.args)"
                problems.append(
                    (
                        f"{index}.matrix.{axis}",
                        f"{own[axis]!r} is the {whose} value of {axis!r}: that arm would be the control again",
                    )
                )
        for variant in control.variants():
            assert variant.variant_of is not None
            if variant.name in owners:
                owner = owners[variant.name]
                problems.append(
                    (
                        f"{index}.matrix.{variant.variant_of.axis}",
                        f"the matrix adds task {variant.name!r}, a name {owner}"
                        + (" (two values with one name)" if owner == f"tasks[{index}]'s matrix adds already" else ""),
                    )
                )
            owners[variant.name] = f"tasks[{index}]'s matrix adds already"
    return problems


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
    video: bool = Field(
        default=True,
        description="store cameras as video (`true`) or as PNG images (`false`); an RGB video camera of odd height "
        "or width is stored one edge pixel larger (4:2:0 video needs an even size), and declared so",
    )
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
        "`episode.errored` column and kept out of the dataset's statistics; one that errored before its "
        "first step (at reset) has no frame, and a LeRobot episode needs one: it stays in the grades only",
    )
    codec: VideoCodec = Field(
        default=VideoCodec.H264,
        description="video codec: `h264` (fast, the default) or `libsvtav1` (smaller; "
        "its cameras but depth maps must be at least 25 pixels wide)",
    )
    state_features: list[str] | None = Field(
        default=None,
        description="observation features concatenated, in this order, into `observation.state` (float32); default: "
        "every non-camera observation feature in contract order whose values float32 keeps (an integer one of 32 or "
        "64 bits bounded past 2^24, or not bounded, would lose counts: it stays apart); the others become "
        "`observation.<name>` in their own dtype",
    )
    writers: Count = Field(
        default=1,
        le=32,
        description="writers per instance shard, each writing one part in parallel; the published dataset puts its "
        "episodes in one order whatever the writers (by task, then seed), so it is the same files for any `writers`",
    )

    def writer_options(self) -> DatasetOptions:
        """The writer settings this section asks for."""
        return DatasetOptions(
            cameras=CameraStorage.VIDEO if self.video else CameraStorage.IMAGE,
            codec=self.codec,
            state_features=self.state_features,
            keep_errored=self.keep_errored,
            writers=self.writers,
        )


# -- defaults and rules shared by the pipeline ------------------------------------------------------


def default_tasks() -> list[TaskSpec]:
    return [TaskSpec(name="task0")]


def require_unique(names: list[str], field: str, noun: str) -> None:
    """Refuse a name used twice in a list of ``field`` (tasks, graders, checks), located at the second."""
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise spec_rule(
                f"{index}.name",
                f"{noun} name {name!r} is already used by {field}[{seen[name]}]; give each {noun} a unique 'name'",
            )
        seen[name] = index
