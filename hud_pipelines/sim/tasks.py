"""A reset's tasks, one per slot, read into what the slots share and what each slot gets.

A task holds a seed, reset options and build arguments. The slots of one sim share one build, so
every task must ask for the same build arguments; the seed and the options are each slot's own.
What a slot is credited with is what it got: a vector env that takes one seed for the batch cannot
give slots distinct seeds, and a registry id's ``vectorization_mode`` is fixed when the sim starts
(it decides whether worker processes start and whether every slot gets its own seed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from hud_pipelines.errors import TaskArgumentError
from hud_pipelines.sim.envs import SlotEnvs, VectorEnvs
from hud_pipelines.sim.factory import VECTORIZATION_MODE, Factory, FactoryKind


@dataclass(frozen=True)
class SlotTasks:
    """One reset's tasks, read: the shared build arguments, then each slot's seed and options."""

    build_args: dict[str, Any]
    seeds: list[int | None]
    options: list[dict[str, Any] | None]


def read_tasks(
    factory: Factory, num_envs: int, operator_args: Mapping[str, Any], tasks: list[dict[str, Any]]
) -> SlotTasks:
    """Split one task per slot; ``operator_args`` are the build arguments the sim was started with."""
    if len(tasks) != num_envs:
        raise TaskArgumentError(f"reset needs one task per slot: {num_envs} slots, {len(tasks)} tasks")
    split = [factory.split_task(task) for task in tasks]
    build_args = split[0][0]
    if (differs := build_difference([slot_build for slot_build, _ in split])) is not None:
        raise TaskArgumentError(differs)
    refuse_fixed(factory, num_envs, operator_args, build_args)
    return SlotTasks(
        build_args=build_args,
        seeds=[_seed(episodic.get("seed"), slot) for slot, (_, episodic) in enumerate(split)],
        options=[_options(episodic.get("options"), slot) for slot, (_, episodic) in enumerate(split)],
    )


def build_difference(builds: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the slots' build arguments cannot share one build (the first slot that differs), or ``None``.

    Led by ``slot N: `` so that a sharded instance names its own slot numbers (:mod:`.shard_naming`)."""
    for slot, build in enumerate(builds):
        if build != builds[0]:
            return (
                f"slot {slot}: asks for build arguments {dict(build)}, the first slot for {dict(builds[0])}: the "
                "slots of one sim share one build"
            )
    return None


def refuse_fixed(
    factory: Factory, num_envs: int, operator_args: Mapping[str, Any], build_args: Mapping[str, Any]
) -> None:
    """A client may repeat, never change, a registry id's ``vectorization_mode``: only the operator sets it."""
    if factory.kind is not FactoryKind.REGISTRY or VECTORIZATION_MODE not in build_args:
        return
    served = factory.vectorization_mode(operator_args, num_envs)
    asked = build_args[VECTORIZATION_MODE]
    if asked != served:
        serves = f"{VECTORIZATION_MODE}={served!r}" if served is not None else "one gym.make env per slot"
        raise TaskArgumentError(
            f"{VECTORIZATION_MODE}={asked!r} is refused: it is fixed when the sim starts (this sim serves "
            f"{factory.name} with {serves}); start the sim with --arg {VECTORIZATION_MODE}={asked} to use it, "
            f"or leave it out of the task"
        )


def refuse_shared_seed(factory: Factory, envs: SlotEnvs, seeds: list[int | None]) -> None:
    """A vector env that takes one seed for the batch cannot give slots distinct seeds: refuse them."""
    if not isinstance(envs, VectorEnvs) or envs.per_slot_seeds or len(set(seeds)) <= 1:
        return
    differ = [slot for slot, seed in enumerate(seeds) if seed != seeds[0]]
    fix = (
        f"serve it without vectorization_mode (each slot its own env and seed) or give every slot seed {seeds[0]}"
        if factory.kind is FactoryKind.REGISTRY
        else f"give every slot seed {seeds[0]}, or have its reset take a list of seeds (per_slot_seeds = True)"
    )
    raise TaskArgumentError(
        f"{factory.name} ({type(envs.env).__name__}) takes one seed for all {envs.num_slots} slots, but the "
        f"tasks ask for seeds {seeds}: slot(s) {differ} would not get the seed they are credited with; {fix}"
    )


def task_prompt(factory: Factory, task: Mapping[str, Any]) -> str:
    """The prompt of a slot whose env offers none: the factory and the task's arguments but the seed (and the
    ones left empty, such as no reset ``options``)."""
    described = ", ".join(
        f"{k}={json.dumps(v, default=str)}" for k, v in sorted(task.items()) if k != "seed" and v not in (None, {}, [])
    )
    return f"{factory.name} {described}".strip()


def _seed(value: object, slot: int) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TaskArgumentError(f"slot {slot}: seed must be an integer or null, got {value!r}")


def _options(value: object, slot: int) -> dict[str, Any] | None:
    if value is None or is_options(value):
        return value
    raise TaskArgumentError(f"slot {slot}: options must be a map or null, got {value!r}")


def is_options(value: object) -> TypeGuard[dict[str, Any]]:
    """Reset options are a map; the env reads its keys."""
    return isinstance(value, dict)
