"""The envs behind a sim's slots, built from its factory: one vector env, or one env per slot.

It is apart from :mod:`hud_pipelines.sim.bridge`, which serves the slots, because building (and letting go of
what a failed build or probe left) is done anew on every rebuild and every probe tried.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Generator
from typing import Any

from hud_pipelines.errors import TaskArgumentError
from hud_pipelines.sim.envs import ENV_FAILURES, ReplicatedEnvs, SlotEnvs, VectorEnvs
from hud_pipelines.sim.factory import Factory, FactoryKind

log = logging.getLogger(__name__)


@contextlib.contextmanager
def built_envs(factory: Factory, build_args: dict[str, Any], num_envs: int) -> Generator[SlotEnvs]:
    """The envs of ``num_envs`` slots; when the block (or the build) raises, every env built is closed."""
    built: list[Any] = []
    try:
        if factory.builds_vector(build_args, num_envs):
            built.append(factory.build(build_args, num_envs))
            # a project's vector env gets the per-slot seed list (the gymnasium vector API allows
            # one); a registry id's native vector_entry_point env takes one int
            envs: SlotEnvs = VectorEnvs(built[0], per_slot_seeds=factory.kind is FactoryKind.CALLABLE)
            if envs.num_slots != num_envs:
                raise TaskArgumentError(
                    f"factory {factory.name} was asked for num_envs={num_envs} but built {envs.num_slots} slots"
                )
        else:
            for _ in range(num_envs):
                built.append(factory.build(build_args, 1))
            envs = ReplicatedEnvs(built, build_one=lambda: factory.build(build_args, 1))
        yield envs
    except BaseException:
        for env in built:
            _close_quietly(env)
        raise


def _close_quietly(env: Any) -> None:
    """Close an env whose build or probe failed; its warnings (gymnasium's async env warns of the reset it was
    waiting for) and errors are beside the point: the build's error is the one to report."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env.close()
    except ENV_FAILURES:  # sys.exit() in its teardown too: the build's error stands
        log.debug("closing a half-built env failed", exc_info=True)
