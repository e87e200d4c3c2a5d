"""What the latest run of a pipeline rolled out: its rollout hash, its overrides of the YAML, its provenance.

``outputs/<name>/configuration.json`` is written as a run starts and read by the grades-side steps,
so the results of a run with overrides are graded as current, those of any other configuration (or
environment: :mod:`hud_pipelines.eval.provenance`) as stale.
"""

from __future__ import annotations

import json
from typing import Any

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
    served = read_served_sim(outputs)
    record = {
        "run_id": run_id,
        "rollout_hash": effective.rollout_hash,
        "yaml_rollout_hash": base.rollout_hash,
        "overrides": overrides,
        "provenance": provenance.for_run(effective, contract_json=contract, served_sim=served),
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
    """The latest run's provenance (``{}`` before any run)."""
    record = _record(outputs)
    return dict(record.get("provenance") or {}) if record else {}


def write_served_sim(outputs: EvalOutputs, served: dict[str, Any] | None) -> None:
    """``served_sim.json``: what the served sim that gave the contract says it is; removed for a spawned sim."""
    if not served:
        outputs.served_sim.unlink(missing_ok=True)
        return
    outputs.base.mkdir(parents=True, exist_ok=True)
    write_atomically(outputs.served_sim, json.dumps(served, indent=1))


def read_served_sim(outputs: EvalOutputs) -> dict[str, Any] | None:
    path = outputs.served_sim
    return dict(json.loads(path.read_text())) if path.is_file() else None


def _record(outputs: EvalOutputs) -> dict[str, Any] | None:
    path = outputs.configuration_json
    return dict(json.loads(path.read_text())) if path.is_file() else None
