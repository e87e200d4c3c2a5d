"""Where a result came from: the code, the packages, the sim, the policy, the seeds and the machine.

Every instance's result carries the provenance of the run that produced it, and the report and the
Dagster metadata show it. Part of it decides the numbers as much as the YAML does without being in
it: the versions of the simulator and learning packages, the sim's interpreter, the renderer. Those
make the *environment fingerprint*; results of two fingerprints are never merged into one table
(the older ones show as ``not_run`` until they run again, as after an edit of the YAML).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from hud_pipelines.agent.policy_identity import changed, said
from hud_pipelines.contract.file import load_contract, merge_contract
from hud_pipelines.errors import HudPipelinesError
from hud_pipelines.eval import sources
from hud_pipelines.eval.grades import no_html
from hud_pipelines.sim.identity import describe, factory_distribution, package_versions, version
from hud_pipelines.spec.hashing import CREDENTIALS
from hud_pipelines.spec.models import PipelineSpec

UNREADABLE = "unreadable"
"""The digest of a file that cannot be read (:func:`hud_pipelines.targets.code_digest`): deleted, or not readable."""
PACKAGES = ("hud-pipelines", "gymnasium", "mujoco", "numpy", "torch", "lerobot", "dagster")
"""Packages of the agent's environment whose versions a result records."""
PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""This package's folder: its git revision is the code that produced a result (``None`` when installed)."""
RENDERER_VARIABLES = ("MUJOCO_GL", "PYOPENGL_PLATFORM")
FINGERPRINT_FIELDS = ("packages", "sim_python", "sim_packages", "renderer")
"""What, besides the rollout hash, decides a result's numbers: never merged across a change of these
(and of ``served_sim``, a served sim's factory and arguments, where the run attached to one, and of
``sources``, the code and weights files the pipeline's targets read: :mod:`hud_pipelines.eval.sources`; and of
``contract_hash``, the contract the run used, which the user may edit: its names, bounds and rates)."""
SERVED_FIELDS = ("factory_name", "args", "packages", "sources")
"""What of a served sim's own record is part of the fingerprint (``sources``: where its server sent them)."""


def for_run(
    spec: PipelineSpec,
    *,
    contract_json: str | None = None,
    served_sim: dict[str, Any] | None = None,
    served_policy: dict[str, Any] | None = None,
    code: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The provenance of a run of ``spec`` (a sweep member's includes its checkpoint's content hash).

    ``served_sim``: what the served sim that gave the contract says it is (:mod:`hud_pipelines.sim.identity`).
    A sim attached by URL runs where its server was started, with the server's arguments: its factory,
    arguments, interpreter and packages are the server's, and they are part of the fingerprint, so the
    results of a server started otherwise are never merged with these. ``served_policy``: what a remote policy's
    server said of its policy (``{"metadata": ...}``), likewise. ``code``: the sources as digested before the run
    loaded them (:func:`hud_pipelines.eval.sources.digests`), else digested now.
    """
    record: dict[str, Any] = {
        **environment(spec, code),
        "hud_pipelines_revision": _git_revision(PACKAGE_DIR),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **configuration(spec),
        "device": getattr(spec.agent.policy, "device", None),
        "contract_hash": None if contract_json is None else hashlib.sha256(contract_json.encode()).hexdigest(),
        "rollout_hash": spec.rollout_hash,
    }
    record = with_served_policy(record, served_policy) if served_policy else record
    return with_served_sim(record, served_sim) if served_sim else record | {"fingerprint": fingerprint(record)}


def configuration(spec: PipelineSpec) -> dict[str, Any]:
    """The fields of a provenance that are ``spec``'s configuration (a sweep member's: its own policy and weights).

    One expression for what a run records and what a stale result's reason holds it against
    (:mod:`hud_pipelines.eval.rows`): two copies would drift, and name fields that did not change.
    """
    sim = spec.sim
    return {
        "sim_factory": spec.factory or ", ".join(sim.servers) or f"fleet {sim.fleet}",
        "sim_args": dict(sim.args),
        "task_args": {task.name: dict(task.args) for task in spec.tasks if task.args},  # over sim_args, key by key
        "num_envs": sim.num_envs,
        "seeds": {task.name: task.seed for task in spec.tasks},
        "group": spec.group,
        "max_steps": spec.max_steps,
        "graders": spec.model_dump(mode="json", include={"graders"})["graders"],
        "policy": spec.model_dump(mode="json", include={"agent"}, exclude=CREDENTIALS)["agent"]["policy"],
        "checkpoint_hash": spec.checkpoint_hash,
    }


def configured(record: dict[str, Any], spec: PipelineSpec) -> dict[str, Any]:
    """``record`` (a run's provenance) with ``spec``'s configuration over the run's: what results are held against
    once the YAML changed since that run (its rollout hashes are then the YAML's, and so must the fields a stale
    result's reason names be). A served sim's factory and arguments stay as its server said them: the YAML names
    only where it is."""
    now = configuration(spec)
    if not spec.sim.spawned:
        del now["sim_factory"], now["sim_args"]
    return record | now


def with_served_sim(record: dict[str, Any], served_sim: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the sim as the served sim says it is (:func:`for_run`), and its fingerprint anew."""
    updated = record | {
        "sim_factory": served_sim.get("factory"),
        "sim_args": served_sim.get("args") or {},
        "sim_python": served_sim.get("python"),
        "sim_packages": served_sim.get("packages") or {},
        "served_sim": {name: served_sim.get(name) for name in SERVED_FIELDS if name != "sources" or name in served_sim},
    }
    return updated | {"fingerprint": fingerprint(updated)}


def with_served_policy(record: dict[str, Any], served_policy: dict[str, Any]) -> dict[str, Any]:
    """``record`` with what a remote policy's server said of its policy (:func:`for_run`), and its fingerprint anew."""
    updated = record | {"served_policy": served_policy}
    return updated | {"fingerprint": fingerprint(updated)}


def environment(spec: PipelineSpec, code: dict[str, str] | None = None) -> dict[str, Any]:
    """The parts of the provenance that decide numbers besides the YAML (see :data:`FINGERPRINT_FIELDS`).

    A sim under its own interpreter (``sim.python``) has its own packages: their versions, and the
    version of the package its factory comes from, are read there, in one short child process.
    """
    interpreter = _interpreter(spec)
    return {
        "packages": _versions(),
        "sim_python": interpreter,
        "sim_packages": _sim_versions(interpreter, factory_distribution(spec.sim.factory)),
        "renderer": {name: os.environ[name] for name in RENDERER_VARIABLES if name in os.environ},
        "sources": sources.digests(spec) if code is None else code,
    }


def with_current_code(
    recorded: dict[str, Any], spec: PipelineSpec, derived: Path | None = None, outputs_root: Path | None = None
) -> dict[str, Any]:
    """The latest run's provenance (``recorded``) with the code and weights files it read digested as they are now,
    and its contract's hash as the contract file reads now (``derived``: the contract the run derived).

    What results are judged by when nothing runs (``hud-pipelines report``, a Dagster asset materialized on its
    own): an edit of the code or of the contract file since the last run shows its results as stale at once, as
    the next run would (``outputs_root``: where the runs write, never a data file). A served sim's own code is known
    only to its server: it stays as the run recorded it.
    """
    updated = recorded
    contract_now = None if derived is None else contract_hash_now(spec, derived)
    if recorded.get("contract_hash") and contract_now is not None:  # not in the fingerprint: compared on its own
        updated = updated | {"contract_hash": contract_now}
    if not recorded.get("sources"):  # no run yet, a run recorded before sources were, or no file to read
        return updated
    updated = updated | {"sources": sources.digested_again(recorded["sources"], spec, outputs_root)}
    return updated | {"fingerprint": fingerprint(updated)}


def contract_hash_now(spec: PipelineSpec, derived: Path) -> str | None:
    """The hash a run would record for its contract with the contract file ``sim.contract`` as it reads now: the file
    merged over the contract the last run derived (``derived``, as the sim merges it over the env's), so that the
    file's formatting and the order of its features count for nothing and only an edit of what it says (names,
    bounds, rates) does. ``None``: no file, or one that does not load or fit, which the next run reports."""
    path = spec.contract_path
    if path is None or not path.is_file() or not derived.is_file():
        return None
    try:
        merged = merge_contract(load_contract(path), load_contract(derived), source=path)
    except (HudPipelinesError, OSError, ValueError):
        return None
    return hashlib.sha256(merged.to_json().encode()).hexdigest()


def fingerprint(record: dict[str, Any]) -> str:
    """A short hash of the record's :data:`FINGERPRINT_FIELDS`."""
    picked = {name: record.get(name) for name in FINGERPRINT_FIELDS}
    if record.get("sources"):  # absent where no target names a file: such results keep their fingerprint
        picked["sources"] = record["sources"]
    if record.get("served_sim"):  # absent for a spawned sim: its fingerprint is what it always was
        picked["served_sim"] = record["served_sim"]
        picked["sim_python"] = None  # where a server's interpreter lies differs between machines, not the sim
    if record.get("served_policy"):  # absent for a policy of this process: its fingerprint is what it always was
        picked["served_policy"] = record["served_policy"]
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def other_environment(ran: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether a result ran in another environment than the current one (no fingerprint counts as the same).

    A result recorded before sources were (``sources`` absent, or a served sim's record without them), or
    before a remote policy's server was (``served_policy`` absent), is judged on the rest of the fingerprint.
    """
    ran_in, current_in = ran.get("fingerprint"), current.get("fingerprint")
    if not ran_in or not current_in:
        return False
    if _contract_changed(ran, current):
        return True
    judged = current
    for name in ("sources", "served_policy"):
        if name not in ran and judged.get(name):
            judged = {key: value for key, value in judged.items() if key != name}
    served: dict[str, Any] = current.get("served_sim") or {}
    if "sources" in served and "sources" not in (ran.get("served_sim") or {}):  # its server sent no code digests
        judged = judged | {"served_sim": {key: value for key, value in served.items() if key != "sources"}}
    return ran_in != (current_in if judged is current else fingerprint(judged))


def difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed between two environments, in words (``mujoco 3.3.0 -> 4.0.0``)."""
    changes: list[str] = []
    for name in sorted(set(old.get("packages", {})) | set(new.get("packages", {}))):
        before, after = old.get("packages", {}).get(name), new.get("packages", {}).get(name)
        if before != after:
            changes.append(f"{name} {before or 'absent'} -> {after or 'absent'}")
    for name in ("sim_python", "sim_packages", "renderer"):
        if old.get(name) != new.get(name):
            changes.append(f"{name} {old.get(name)} -> {new.get(name)}")
    edited = _edited(old.get("sources") or {}, new.get("sources") or {})
    if edited:
        changes.append(f"code or weights changed: {edited}")
    if _contract_changed(old, new):
        changes.append(
            f"the contract changed (contract.json sha256 {old['contract_hash'][:12]} -> {new['contract_hash'][:12]})"
        )
    served_was: dict[str, Any] = dict(old.get("served_sim") or {})  # copies: the code's digests are taken out
    served_now: dict[str, Any] = dict(new.get("served_sim") or {})
    if "sources" in served_was and "sources" in served_now:  # both servers sent their code's digests
        edited = _edited(served_was.pop("sources"), served_now.pop("sources"))
        if edited:
            changes.append(f"the served sim's code changed: {edited}")
    if served_was != served_now:
        before, after = (describe(r) if r else "a spawned sim" for r in (served_was, served_now))
        changes.append(f"the served sim {before} -> {after}")
    policy_was, policy_now = (record.get("served_policy") for record in (old, new))
    if policy_was and policy_now and policy_was != policy_now:
        changes.append(f"the policy server's metadata {changed(policy_was['metadata'], policy_now['metadata'])}")
    return ", ".join(changes) or "the environment changed"


def _contract_changed(ran: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether the contract a result ran under differs from the current one (an edit of the contract file: other
    names, bounds or rates; a result that recorded none is judged on the rest)."""
    was, now = ran.get("contract_hash"), current.get("contract_hash")
    return bool(was) and bool(now) and was != now


def _edited(was: dict[str, str], now: dict[str, str]) -> str:
    """The names of the files whose digests differ (``my_env.py, helpers.py``), the first few of many, those that no
    digest of the earlier result held said apart (listed in ``sim.data_files`` since), and so those that cannot be
    read now (deleted since), or ``""``."""
    changed = [path for path in was if was[path] != now.get(path)]  # no longer read by the code is a change too
    gone = sorted(Path(path).name for path in changed if now.get(path) == UNREADABLE)
    differ = sorted(Path(path).name for path in changed if now.get(path) != UNREADABLE)
    added = sorted(Path(path).name for path in set(now) - set(was))
    parts = [_some(differ), *([f"unreadable now {_some(gone)}"] if gone else [])]
    return ", ".join([*(part for part in parts if part), *([f"newly tracked {_some(added)}"] if added else [])])


def _some(names: list[str], shown: int = 5) -> str:
    """``a, b, c and 7 more``: a list of names a line can hold."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def markdown(record: dict[str, Any]) -> str:
    """The provenance of the latest run, for ``report.md`` (HTML in its values shown as text)."""
    if not record:
        return ""
    packages = ", ".join(f"{name} {version}" for name, version in record.get("packages", {}).items() if version)
    sim_packages = ", ".join(f"{n} {v}" for n, v in record.get("sim_packages", {}).items() if v) or "n/a"
    renderer = ", ".join(f"{k}={v}" for k, v in record.get("renderer", {}).items()) or "default"
    lines = [
        "",
        "## Provenance",
        "",
        f"- code: hud-pipelines revision `{record.get('hud_pipelines_revision') or 'unknown'}`",
        f"- packages: {packages}",
        f"- sim: `{record.get('sim_factory')}` with {json.dumps(record.get('sim_args', {}))}, "
        f"{record.get('num_envs')} slot(s), under `{record.get('sim_python')}` ({sim_packages}); renderer {renderer}",
        *([f"- tasks' own args over those: {json.dumps(record['task_args'])}"] if record.get("task_args") else []),
        f"- policy: `{json.dumps(record.get('policy', {}))}` on {record.get('device') or 'the default device'}",
        f"- contract sha256 `{record.get('contract_hash') or 'unknown'}`; rollout hash `{record.get('rollout_hash')}`",
        f"- seeds: {json.dumps(record.get('seeds', {}))} x group {record.get('group')}",
        f"- python {record.get('python')} on {record.get('platform')}; environment fingerprint "
        f"`{record.get('fingerprint')}`",
    ]
    if record.get("checkpoint_hash"):
        lines.append(f"- checkpoint sha256 `{record['checkpoint_hash']}`")
    if record.get("served_policy"):
        metadata = record["served_policy"].get("metadata")
        blind = "" if metadata else ": another policy served at its address would not be told apart from it"
        lines.append(f"- the policy server's metadata: {said(metadata)}{blind}")
    return "\n".join(no_html(line) for line in lines) + "\n"  # args, paths and policy settings are the user's text


_VERSIONS_SCRIPT = """
import importlib.metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


def _interpreter(spec: PipelineSpec) -> str:
    if spec.sim.python is None:
        return sys.executable
    from hud_pipelines.sim.process import sim_interpreter

    try:
        return sim_interpreter(spec.resolve_path(spec.sim.python))
    except HudPipelinesError:
        return str(spec.resolve_path(spec.sim.python))  # the sim will not start; its error says why


@functools.cache
def _sim_versions(interpreter: str, factory_package: str | None) -> dict[str, str | None]:
    if interpreter == sys.executable:
        return package_versions(factory_package)
    names = list(package_versions(factory_package))
    try:
        done = subprocess.run(
            [interpreter, "-c", _VERSIONS_SCRIPT, *names], capture_output=True, text=True, timeout=30, check=True
        )
        return {str(k): v for k, v in json.loads(done.stdout).items()}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {name: None for name in names}


@functools.cache
def _versions() -> dict[str, str | None]:
    return {name: version(name) for name in PACKAGES}


@functools.cache
def _git_revision(directory: Path) -> str | None:
    """The project's git revision (``+dirty`` with uncommitted changes), or ``None`` outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head
