"""What the latest run of a pipeline rolled out: its rollout hash, its overrides of the YAML, its provenance.

``outputs/<name>/configuration.json`` is written as a run starts and read by the grades-side steps
(:func:`current_rollout_hashes`), so the results of a run with overrides are graded as current, those
of any other configuration (or environment: :mod:`hud_pipelines.eval.provenance`) as stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hud_pipelines.eval import provenance, sources
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.spec.hashing import checkpoint_rollout_hash
from hud_pipelines.spec.models import PipelineSpec


def record_configuration(
    effective: PipelineSpec, base: PipelineSpec, outputs: EvalOutputs, *, run_id: str
) -> dict[str, Any]:
    """Note the configuration a run rolls out (its rollout hash and overrides of the YAML); returns the overrides.

    The grades-side steps read it back (:func:`current_rollout_hashes`), so the results of a run with
    overrides are graded as current and those of any other configuration as stale.
    """
    overrides = effective.overrides(base)
    contract = outputs.contract.read_text() if outputs.contract.is_file() else None
    record = {
        "run_id": run_id,
        "rollout_hash": effective.rollout_hash,
        "task_rollout_hashes": RolloutHashes.of(effective).tasks,
        "yaml_rollout_hash": base.rollout_hash,
        "overrides": overrides,
        "provenance": provenance.for_run(
            effective, contract_json=contract, code=sources.digests(effective, outputs.root)
        ),
        "attached": not effective.sim.spawned,
    }
    outputs.configurations.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1)
    write_atomically(_run_record_path(outputs, run_id), text)  # the run's own steps judge by it (:class:`CurrentBy`)
    write_atomically(outputs.configuration_json, text)
    _forget_old_runs(outputs)
    return overrides


RUN_RECORDS_KEPT = 200
"""The latest runs whose own records (``configurations/<run id>.json`` and ``.contract``, ``served_sims/<run
id>.json``, ``served_policies/<run id>.json``) are kept: a run's steps, and a re-execution of it, judge by them;
an older run's judges by the latest."""


def _forget_old_runs(outputs: EvalOutputs) -> None:
    """Remove the records of all but the :data:`RUN_RECORDS_KEPT` latest runs (by when each was written), so that
    a pipeline run every few minutes does not fill its folders."""
    try:
        records = sorted(outputs.configurations.glob("*.json"), key=lambda path: path.stat().st_mtime_ns)
        for old in records[: max(0, len(records) - RUN_RECORDS_KEPT)]:
            for path in (
                old,
                old.with_suffix(".contract"),
                *(f / old.name for f in (outputs.served_sims, outputs.served_policies)),
            ):
                path.unlink(missing_ok=True)
    except OSError:  # another run forgetting the same records meanwhile: what is left is theirs to remove
        return


@dataclass(frozen=True)
class RolloutHashes:
    """The rollout hashes an instance's result must carry to be current: its task's, or the pipeline's.

    A result carries its task's hash (:meth:`PipelineSpec.task_rollout_hash`), so adding or editing
    another task keeps it; a result recorded before tasks were hashed alone carries the pipeline's,
    and is current while the whole configuration is unchanged.
    """

    pipeline: str
    tasks: dict[str, str]
    """Task name -> its rollout hash."""
    with_matrix: dict[str, str] = field(default_factory=dict[str, str])
    """Control task name -> its hash with its ``matrix`` in, which its older results carry: current all the same."""

    @classmethod
    def of(cls, spec: PipelineSpec, indices: Sequence[int] | None = None) -> RolloutHashes:
        """The hashes of ``spec``'s tasks (of those at ``indices`` only, where given: hashing costs a model dump)."""
        chosen = [(i, spec.tasks[i]) for i in (range(len(spec.tasks)) if indices is None else indices)]
        tasks = {task.name: spec.task_rollout_hash(i) for i, task in chosen}
        controls = {t.name: spec.task_rollout_hash(i, with_matrix=True) for i, t in chosen if t.matrix}
        return cls(spec.rollout_hash, tasks, controls)

    def current(self, task: str, found: str) -> bool:
        """Whether a result of ``task`` that carries ``found`` is of this configuration."""
        return found in (self.tasks.get(task), self.pipeline, self.with_matrix.get(task))

    def of_checkpoint(self, content_hash: str) -> RolloutHashes:
        """The hashes of one checkpoint of a sweep: these and the weights' content, each (as its spec's are)."""
        tasks, controls = (
            {task: checkpoint_rollout_hash(hashed, content_hash) for task, hashed in hashes.items()}
            for hashes in (self.tasks, self.with_matrix)
        )
        return RolloutHashes(checkpoint_rollout_hash(self.pipeline, content_hash), tasks, controls)


def current_rollout_hashes(spec: PipelineSpec, outputs: EvalOutputs, run_id: str | None = None) -> RolloutHashes:
    """The hashes results must carry to be current: the latest run's (with its overrides of the YAML; run
    ``run_id``'s where it recorded one), unless the YAML's configuration changed since; then the YAML's own."""
    record = _record(outputs, run_id)
    if record and not _edited_since(spec, record):
        recorded = cast(dict[str, str], record.get("task_rollout_hashes") or {})  # a record before task hashes
        return RolloutHashes(str(record["rollout_hash"]), dict(recorded))
    return RolloutHashes.of(spec)


def _edited_since(spec: PipelineSpec, record: dict[str, Any] | None) -> bool:
    """Whether the YAML's configuration changed since the run of ``record`` (``None``: no run yet, no change)."""
    return bool(record) and record.get("yaml_rollout_hash") != spec.rollout_hash


@dataclass(frozen=True)
class CurrentBy:
    """What a recorded result must match to be current: its task's rollout hash is one of ``hashes``, and
    it ran in ``environment`` (a provenance, :mod:`hud_pipelines.eval.provenance`).

    Left ``None``, each is the latest run's (:meth:`resolve`). The grades, the report and the dataset
    judge by one, so they never disagree on which results count.
    """

    hashes: RolloutHashes | None = None
    environment: dict[str, Any] | None = None
    run_id: str | None = None
    """Whose recorded configuration fills in what is left ``None``: this run's (a run's own steps judge by it, not
    by one that another run, overlapping it with other overrides, recorded since), else the latest run's."""

    def resolve(self, spec: PipelineSpec, outputs: EvalOutputs) -> tuple[RolloutHashes, dict[str, Any]]:
        """Both, the latest run's of ``spec`` where left ``None``.

        Where the YAML changed since that run, the hashes are the YAML's, and so is the configuration in the
        environment (:func:`~hud_pipelines.eval.provenance.configured`): a stale result's reason names what
        differs from the pipeline as it is now, not from the run before the edit.
        """
        hashes = self.hashes or current_rollout_hashes(spec, outputs, self.run_id)
        environment = self.environment if self.environment is not None else recorded_provenance(outputs, self.run_id)
        if self.hashes is None and environment and _edited_since(spec, _record(outputs, self.run_id)):
            environment = provenance.configured(environment, spec)
        return hashes, environment

    def of_checkpoint(self, sweep: PipelineSpec, outputs: EvalOutputs, content_hash: str) -> CurrentBy:
        """What one checkpoint's results must match: the sweep's hashes with the weights' content, in the
        sweep's environment (``sweep`` and ``outputs`` are the sweep's)."""
        hashes, environment = self.resolve(sweep, outputs)
        return CurrentBy(hashes.of_checkpoint(content_hash), environment)


LATEST = CurrentBy()
"""Results are current when they match the latest run's configuration and environment."""


def judged_now(spec: PipelineSpec, outputs: EvalOutputs) -> CurrentBy:
    """What a result must match to count when no run is under way: the latest run's configuration, with the code and
    weights files it read digested as they are now (an edit since that run shows its results as stale at once, as
    the next run would find them)."""
    recorded = recorded_provenance(outputs)
    return CurrentBy(environment=provenance.with_current_code(recorded, spec, outputs.contract, outputs.root))


def judged_in_run(spec: PipelineSpec, outputs: EvalOutputs, run_id: str, parent: str | None = None) -> CurrentBy:
    """What the grades, report and dataset of run ``run_id`` judge by: the configuration it recorded as its rollouts
    began (or the run it re-executes, ``parent``, where it skipped that step); where neither rolled out anything
    (those assets materialized on their own), the results as they stand now (:func:`judged_now`), as
    ``hud-pipelines report`` judges them."""
    for recorded in (run_id, parent):
        if recorded is not None and _run_record_path(outputs, recorded).is_file():
            return CurrentBy(run_id=recorded)
    return judged_now(spec, outputs)


def recorded_overrides(outputs: EvalOutputs, run_id: str | None = None) -> dict[str, Any]:
    """What the latest run (run ``run_id``, where it recorded its configuration) overrode of the YAML (``{}``
    before any run)."""
    record = _record(outputs, run_id)
    return dict(record.get("overrides", {})) if record else {}


def recorded_provenance(outputs: EvalOutputs, run_id: str | None = None) -> dict[str, Any]:
    """The latest run's provenance (``{}`` before any run), with the served sim it claimed, if any; run ``run_id``'s
    where it recorded its configuration (a run's own steps read the run's, whatever runs overlap it).

    A run records its configuration before any sim is met; the served sim it runs is learnt later, by
    whichever step meets one first (the contract step, a unit on a worker), and claimed for the run
    (:func:`claim_served_sim`); so is the contract it derived (:func:`write_contract`: a run on workers records its
    configuration before any unit derives it), else the one written before, where none was recorded; and so is
    what a remote policy's server said of its policy (:func:`hold_served_policy`).
    """
    record = _record(outputs, run_id)
    if not record:
        return {}
    recorded = dict(record.get("provenance") or {})
    derived = _contract_note(outputs, str(record.get("run_id")))
    if derived.is_file():
        recorded["contract_hash"] = derived.read_text()
    elif recorded.get("contract_hash") is None and outputs.contract.is_file():  # a run that noted none (older)
        recorded["contract_hash"] = hashlib.sha256(outputs.contract.read_text().encode()).hexdigest()
    served = read_served_sim(outputs, str(record.get("run_id")))
    if served is None and record.get("attached"):  # it met no served sim (all down): the last one met stands
        served = latest_served_sim(outputs)
    remote = isinstance(agent := recorded.get("policy"), dict) and cast(dict[str, Any], agent).get("kind") == "remote"
    policy = read_served_policy(outputs, str(record.get("run_id")), remote=remote)
    recorded = provenance.with_served_policy(recorded, policy) if policy else recorded
    return provenance.with_served_sim(recorded, served) if served else recorded


def write_contract(outputs: EvalOutputs, run_id: str, contract_json: str) -> None:
    """Write the contract run ``run_id`` derived to ``contract.json``, and note it as the run's: its results carry its
    hash, and ``contract.json`` is whichever run's wrote last (another run, overlapping this one with other sim
    arguments, may rewrite it)."""
    noted = _contract_note(outputs, run_id)
    noted.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.contract, contract_json)
    write_atomically(noted, hashlib.sha256(contract_json.encode()).hexdigest())


def claim_served_sim(outputs: EvalOutputs, run_id: str, served: dict[str, Any]) -> dict[str, Any]:
    """The served sim of run ``run_id``: the one a step of the run claimed already, else ``served``, claimed now.

    ``served_sims/<run id>.json`` holds it. The first claim of a run wins, in whichever process (a hard
    link is made only where no file is): every step and unit of the run holds its sims to that one,
    and a run of another served sim, at the same time or later, has its own.
    """
    return _claim(_claim_path(outputs, run_id), served)


def read_served_sim(outputs: EvalOutputs, run_id: str) -> dict[str, Any] | None:
    """What the served sim that run ``run_id`` claimed says it is (``None``: that run claimed none)."""
    return _read_claim(_claim_path(outputs, run_id))


def latest_served_sim(outputs: EvalOutputs) -> dict[str, Any] | None:
    """The most recent claim of any run (a run that met no served sim keeps judging by it)."""
    return _latest_claim(outputs.served_sims)


def hold_served_policy(policy: object, outputs: EvalOutputs, run_id: str) -> None:
    """Claim what a remote policy's server says of its policy for run ``run_id``, as a served sim is claimed
    (:func:`claim_served_sim`, in ``served_policies/<run id>.json``), and hold the policy to the claim: its
    results' provenance holds it, so the results of another policy served at the same address are never
    pooled with these, and a server of another policy than the run's is refused
    (:class:`~hud_pipelines.errors.PolicyLinkError`). Any other policy has no server: nothing to claim."""
    from hud_pipelines.agent.remote import RemotePolicy

    if isinstance(policy, RemotePolicy):
        try:
            claimed = _claim(_run_file(outputs.served_policies, run_id), {"metadata": policy.identity()})
            policy.hold_to(claimed["metadata"])
        except BaseException:  # no instance runs on it: its connection is closed, not left to the garbage collector
            policy.close()
            raise


def read_served_policy(outputs: EvalOutputs, run_id: str, *, remote: bool = False) -> dict[str, Any] | None:
    """What the policy server that run ``run_id`` claimed said of its policy (``None``: that run claimed none).

    ``remote``: the run's policy is a remote one; where its server could not be reached (no claim), the latest
    claim of any run stands, as for a served sim that is down: the attempt measured nothing, and must not be
    judged another environment than the results it leaves in place."""
    claimed = _read_claim(_run_file(outputs.served_policies, run_id))
    return claimed if claimed is not None or not remote else _latest_claim(outputs.served_policies)


def _claim(path: Path, claimed: dict[str, Any]) -> dict[str, Any]:
    """The claim at ``path``: the first one made there, in whichever process (``claimed``, where none was)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        partial.write_text(json.dumps(claimed, indent=1))
        try:
            os.link(partial, path)
        except FileExistsError:  # another unit of the run claimed first: its claim holds
            pass
        finally:
            partial.unlink(missing_ok=True)
    return _read_claim(path) or claimed


def _latest_claim(folder: Path) -> dict[str, Any] | None:
    claims = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return _read_claim(claims[-1]) if claims else None


def _claim_path(outputs: EvalOutputs, run_id: str) -> Path:
    return _run_file(outputs.served_sims, run_id)


def _run_file(folder: Path, run_id: str) -> Path:
    """``<run id>.json`` in ``folder``, the id made a plain file name."""
    return folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)}.json"


def _read_claim(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    sim: object = json.loads(path.read_text())
    return dict(cast(dict[str, Any], sim)) if isinstance(sim, dict) and sim else None


def _run_record_path(outputs: EvalOutputs, run_id: str) -> Path:
    return _run_file(outputs.configurations, run_id)


def _contract_note(outputs: EvalOutputs, run_id: str) -> Path:
    """``configurations/<run id>.contract``: the sha256 of the contract run ``run_id`` derived."""
    return _run_file(outputs.configurations, run_id).with_suffix(".contract")


def _record(outputs: EvalOutputs, run_id: str | None = None) -> dict[str, Any] | None:
    """Run ``run_id``'s recorded configuration where it recorded one, else the latest run's (``None``: no run yet)."""
    own = None if run_id is None else _run_record_path(outputs, run_id)
    path = own if own is not None and own.is_file() else outputs.configuration_json
    return dict(json.loads(path.read_text())) if path.is_file() else None
