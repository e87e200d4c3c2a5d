"""What a sim says it is: its factory, its build arguments, its interpreter and its package versions.

A sim attached by URL is set up by whoever started its server, maybe on another machine: the
pipeline's YAML names its address, not its factory or arguments. Its ``hello`` carries this record
(protocol version 3; 4 adds the digests of its code), so that a run records the sim it really ran,
differently configured servers are never merged into one table, and the servers of one pipeline
that serve different sims are told apart before an episode runs on the wrong one.

Two records describe the same sim when :func:`same_sim` says so: the same factory (by module or
file name and attribute, so the same project checked out under two paths is one sim), the same
build arguments, the same package versions and the same code: the digests of the factory's file and
of the project files it imports, followed (:func:`~hud_pipelines.targets.target_sources`), keyed
relative to the factory's folder. An edit of a served sim's code is then seen by the runs that
attach to it as it is for a spawned one (its earlier results are another environment's). The
interpreter's path is recorded, not compared.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from hud_pipelines.targets import code_digest, target_sources

SIM_PACKAGES = ("gymnasium", "mujoco", "numpy")
"""Packages of a sim's environment whose versions a result records, beside its factory's own package."""
COMPARED = ("factory_name", "args", "packages", "sources")
"""The fields of a record that decide whether two sims are the same (``sources`` where both records have it:
a server of an earlier version sends none)."""


def sim_identity(factory: str, build_args: Mapping[str, Any]) -> dict[str, Any]:
    """The record a sim of ``factory`` started with ``build_args`` gives of itself (in its own process).

    Its factory's package is looked up by the module's top-level name (``metaworld`` for
    ``metaworld.envs:make``, ``gym_pusht`` for the registry id ``gym_pusht/PushT-v0``): scanning every
    installed distribution costs a sim's start-up a few hundred milliseconds.
    """
    return _identity(factory, json.dumps(dict(build_args), sort_keys=True, default=repr))


@functools.cache
def _identity(factory: str, args: str) -> dict[str, Any]:
    module = factory.split(":")[0] if ":" in factory else factory.split("/")[0] if "/" in factory else None
    top = None if module is None or module.endswith(".py") else module.split(".")[0]
    return {
        "factory": factory,
        "factory_name": factory_name(factory),
        "args": json.loads(args),
        "python": sys.executable,
        "packages": package_versions(top),
        "sources": code_digests(factory),
    }


def code_digests(factory: str) -> dict[str, str]:
    """Path -> short sha256 of the files a factory's code is read from, relative to the factory's folder
    (``{}`` for a registry id whose namespace is no package of the project: it names no file here)."""
    files = target_sources(factory, Path.cwd())
    if not files:
        return {}
    return {os.path.relpath(file, files[0].parent): code_digest(file) for file in files}


def same_sim(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    return all(
        one.get(name) == other.get(name) for name in COMPARED if name != "sources" or (name in one and name in other)
    )


def describe(identity: Mapping[str, Any]) -> str:
    """``seedenv:make with {"length": 5} (numpy 2.2.6, ...)``: what a message names a sim by."""
    versions: dict[str, Any] = identity.get("packages") or {}
    packages = ", ".join(f"{name} {number}" for name, number in versions.items() if number) or "no package versions"
    args = json.dumps(identity.get("args") or {}, sort_keys=True)
    return f"{identity.get('factory_name') or identity.get('factory')} with {args} ({packages})"


def factory_name(factory: str) -> str:
    """A factory without where its file lies: ``x.py:make`` for ``/home/a/envs/x.py:make``; a registry id as it is."""
    if ":" not in factory:
        return factory
    module, attribute = factory.rsplit(":", 1)
    return f"{PurePath(module).name if module.endswith('.py') else module}:{attribute}"


def factory_distribution(factory: str | None) -> str | None:
    """The distribution a factory's module comes from (``metaworld`` for ``metaworld.envs:make``), if installed."""
    if factory is None or ":" not in factory or factory.split(":")[0].endswith(".py"):
        return None
    top = factory.split(":")[0].split(".")[0]
    names = importlib.metadata.packages_distributions().get(top)
    return names[0] if names else top


@functools.cache
def package_versions(factory_package: str | None) -> dict[str, str | None]:
    """The versions of :data:`SIM_PACKAGES` and of the factory's own package in this interpreter."""
    names = [*SIM_PACKAGES, *([factory_package] if factory_package and factory_package not in SIM_PACKAGES else [])]
    return {name: version(name) for name in names}


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
