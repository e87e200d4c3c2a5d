"""What the latest run of a pipeline rolled out: its rollout hash, its overrides of the YAML, its provenance.

``outputs/<name>/configuration.json`` is written as a run starts and read by the grades-side steps,
so the results of a run with overrides are graded as current, those of any other configuration (or
environment: :mod:`hud_pipelines.eval.provenance`) as stale.
"""

from __future__ import annotations

import json
from typing import Any, cast

from hud_pipelines.eval import provenance
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.spec.models import PipelineSpec


def record_configuration(
    effective: PipelineSpec, base: PipelineSpec, outputs: EvalOutputs, *, run_id: str
) -> dict[str, Any]:
    """Note the configuration a run rolls out (its rollout hash and overrides of the YAML); returns the overrides.

    The grades-side steps read it back (:func:`current_rollout_hash`), so the results of a run with
    overrides are graded as current and those of any other configuration as stale.
    """
    overrides = effective.overrides(base)
    contract = outputs.contract.read_text() if outputs.contract.is_file() else None
    record = {
        "run_id": run_id,
        "rollout_hash": effective.rollout_hash,
        "yaml_rollout_hash": base.rollout_hash,
        "overrides": overrides,
        "provenance": provenance.for_run(effective, contract_json=contract),
    }
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.configuration_json, json.dumps(record, indent=1))
    return overrides


def current_rollout_hash(spec: PipelineSpec, outputs: EvalOutputs) -> str:
    """The rollout hash results must carry to be current: the latest run's, unless the YAML changed since."""
    path = outputs.configuration_json
    if path.is_file():
        record = json.loads(path.read_text())
        if record.get("yaml_rollout_hash") == spec.rollout_hash:
            return str(record["rollout_hash"])
    return spec.rollout_hash


def recorded_overrides(outputs: EvalOutputs) -> dict[str, Any]:
    """What the latest run overrode of the YAML (``{}`` before any run)."""
    record = _record(outputs)
    return dict(record.get("overrides", {})) if record else {}


def recorded_provenance(outputs: EvalOutputs) -> dict[str, Any]:
    """The latest run's provenance (``{}`` before any run), with the served sim it claimed, if any.

    A run records its configuration before any sim is met; the served sim it runs is learnt later, by
    whichever step meets one first (the contract step, a unit on a worker), and claimed for the run
    (:func:`claim_served_sim`).
    """
    record = _record(outputs)
    if not record:
        return {}
    recorded = dict(record.get("provenance") or {})
    served = read_served_sim(outputs, str(record.get("run_id")))
    return provenance.with_served_sim(recorded, served) if served else recorded


def claim_served_sim(outputs: EvalOutputs, run_id: str, served: dict[str, Any]) -> dict[str, Any]:
    """The served sim of run ``run_id``: the one a step of the run claimed already, else ``served``, claimed now.

    ``served_sim.json`` holds it with the run's id: every step and unit of the run, in any process,
    holds its sims to the same one, and the results of a later run of another served sim are told apart.
    """
    claimed = read_served_sim(outputs, run_id)
    if claimed is not None:
        return claimed
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.served_sim, json.dumps({"run_id": run_id, "sim": served}, indent=1))
    return served


def read_served_sim(outputs: EvalOutputs, run_id: str) -> dict[str, Any] | None:
    """What the served sim that run ``run_id`` claimed says it is (``None``: none, or another run's)."""
    path = outputs.served_sim
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    sim: object = data.get("sim") if data.get("run_id") == run_id else None
    return dict(cast(dict[str, Any], sim)) if isinstance(sim, dict) and sim else None


def _record(outputs: EvalOutputs) -> dict[str, Any] | None:
    path = outputs.configuration_json
    return dict(json.loads(path.read_text())) if path.is_file() else None
