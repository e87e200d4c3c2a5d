"""Dagster metadata of the eval's assets: the contract's features, one instance's figures, a run's instances.

Shared by both ways an eval's instances run (in the run's process, or as units on workers), so the UI
shows the same tables either way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import dagster as dg

from hud_pipelines.contract import Contract, state_images
from hud_pipelines.eval.configuration import recorded_provenance
from hud_pipelines.eval.grade_table import cell
from hud_pipelines.eval.grades import summarize
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.runner import InstanceResult
from hud_pipelines.eval.seed_check import read_seed_check
from hud_pipelines.eval.sweep_table import COLUMNS, SweepComparison
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.recording.thumbnails import png_data_uri
from hud_pipelines.spec.models import PipelineSpec


def features_table(contract: Contract) -> dg.TableMetadataValue:
    schema = dg.TableSchema(
        columns=[dg.TableColumn(n, "string") for n in ("feature", "role", "type", "dtype", "shape", "names")]
    )
    records = [
        dg.TableRecord(
            {
                "feature": name,
                "role": feature.role,
                "type": feature.type.value,
                "dtype": feature.dtype,
                "shape": str(list(feature.shape)),
                "names": ", ".join(feature.names or [])[:200],
            }
        )
        for name, feature in contract.features.items()
    ]
    return dg.MetadataValue.table(records, schema=schema)


def instance_metadata(result: InstanceResult) -> dict[str, Any]:
    counts = result.counts()
    return {
        "episodes": len(result.rows),
        "env_steps": result.env_steps,
        "succeeded": counts[EpisodeStatus.SUCCEEDED.value],
        "failed": counts[EpisodeStatus.FAILED.value],
        "errored": counts[EpisodeStatus.ERRORED.value],
        "wall_s": round(result.wall_s, 3),
        **({"error": result.error} if result.error else {}),
    }


def contract_metadata(spec: PipelineSpec, outputs: EvalOutputs, derived: Contract) -> dict[str, Any]:
    """The contract as the UI shows it; ``warnings`` lists observations of an image's shape read as state."""
    seeded = read_seed_check(outputs)
    warned = state_images(derived)
    return {
        "features": features_table(derived),
        "control_rate_hz": derived.control_rate,
        "robot_type": derived.robot_type,
        "path": dg.MetadataValue.path(str(spec.contract_path or outputs.contract)),
        **({} if seeded is None else {"repeats_start_for_seed": seeded.repeats}),
        **({"warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in warned))} if warned else {}),
    }


def instances_metadata(
    outputs: EvalOutputs, run_id: str | None, results: Sequence[InstanceResult], overrides: dict[str, Any]
) -> dict[str, Any]:
    """The run's instances as a table (status, fault, reason), with totals (and its traces, when it ran them)."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(n, k)
            for n, k in (
                ("instance", "string"),
                ("status", "string"),
                ("fault", "string"),
                ("reason", "string"),
                ("episodes", "int"),
                ("errored", "int"),
                ("wall_s", "float"),
            )
        ]
    )
    records = [
        dg.TableRecord(
            {
                "instance": r.key,
                "status": "failed" if r.failed else "completed",
                "fault": r.fault.value if r.fault is not None else "",
                "reason": (r.error or "")[:300],
                "episodes": len(r.rows),
                "errored": r.counts()[EpisodeStatus.ERRORED.value],
                "wall_s": round(r.wall_s, 3),
            }
        )
        for r in results
    ]
    totals = summarize([row for r in results for row in r.rows])
    return {
        "instances": dg.MetadataValue.table(records, schema=schema),
        "ran": len(results),
        "failed": sum(r.failed for r in results),
        "episodes": totals.scheduled,
        "errored": totals.errored,
        "env_steps": sum(r.env_steps for r in results),
        "longest_instance_wall_s": round(max((r.wall_s for r in results), default=0.0), 3),
        **({} if run_id is None else {"traces": dg.MetadataValue.path(str(outputs.traces(run_id)))}),
        "overrides": dg.MetadataValue.json(overrides),
        "provenance": dg.MetadataValue.json(recorded_provenance(outputs, run_id)),
    }


def instances_on_disk(spec: PipelineSpec, outputs: EvalOutputs) -> dict[str, Any]:
    """The ``instances`` asset of a run that ran no rollouts: Dagster's "Materialize all" backfills the
    partitioned rollouts in a run of their own and what follows them in another, which grades what those
    left on disk; its table is each instance's latest result there (the grades judge which are current)."""
    found = [outputs.result(key) for key in ([] if spec.is_sweep else spec.partition_keys())]
    results = [InstanceResult.read(path) for path in found if path.is_file()]
    return {
        **instances_metadata(outputs, None, results, {}),
        "ran": 0,
        "note": "no rollouts ran in this run: each instance's latest result on disk (the grades judge which count)",
    }


def code_versions(spec: PipelineSpec) -> tuple[str, str]:
    """The Dagster code versions of a pipeline's assets: of the contract, rollouts and instances, what decides
    the episodes (the rollout hash); of the grades, report and dataset, the whole YAML (its checks, its
    description, its dataset section too). Dagster shows an asset whose version changed as stale."""
    return spec.rollout_hash[:16], hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]


def comparison_metadata(table: SweepComparison, outputs: EvalOutputs) -> dict[str, Any]:
    """A sweep's comparison table, its summary and plot, for the ``comparison`` asset."""
    rows = [row.as_dict() for row in table.rows]
    columns = [dg.TableColumn(name, _column_kind(rows, name)) for name in COLUMNS]
    records = [dg.TableRecord({name: cell(row.get(name)) for name in COLUMNS}) for row in rows[:500]]
    return {
        "comparison": dg.MetadataValue.table(records, schema=dg.TableSchema(columns=columns)),
        "summary": dg.MetadataValue.md(table.markdown()),
        "best": table.best or "",
        "checkpoints": len(table.overall),
        "path": dg.MetadataValue.path(str(outputs.comparison_csv)),
        "plot": dg.MetadataValue.path(str(outputs.comparison_png)),
        "success_by_step": dg.MetadataValue.md(f"![success rate by training step]({png_data_uri(table.plot())})"),
    }


def _column_kind(rows: Sequence[dict[str, Any]], name: str) -> str:
    values = [row.get(name) for row in rows if row.get(name) is not None]
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "float"
    return "string"
