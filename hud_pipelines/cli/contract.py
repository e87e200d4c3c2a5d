"""``hud-pipelines contract``: derive a pipeline's contract from its sim and refresh the file, keeping edits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hud_pipelines.cli.selection import resolve_pipeline_file


def write_contract(pipeline: str, *, pipelines_dir: Path | None = None, out: Path | None = None) -> int:
    """Start the pipeline's sim once, derive its contract, refresh the file with it, print the features.

    The sim starts exactly as the eval starts it, except that it derives its contract in memory: the
    file is refreshed here (:func:`~hud_pipelines.contract.refresh_contract`), so a file written for
    an env whose shapes have changed since is brought up to date, keeping the edits that still fit,
    where the eval refuses it. Each changed feature is printed (old -> new shape, names dropped).
    """
    from rich.console import Console
    from rich.table import Table

    from hud_pipelines.contract import load_contract, refresh_contract, state_images
    from hud_pipelines.eval.runner import sim_settings
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(resolve_pipeline_file(pipeline, pipelines_dir))
    target = out.resolve() if out is not None else spec.contract_path
    # one process answers for all the shards of a sim: they serve the same contract
    settings = dataclasses.replace(sim_settings(spec, cwd=Path.cwd()), contract_path=None, shards=1)
    with SimPool(settings) as pool:
        contract = pool.contract()
    if target is None:
        outcome = "not written (the pipeline sets no sim.contract; use --out)"
    elif target.exists():
        edited = load_contract(target)
        contract, changes = refresh_contract(edited, contract)
        if changes:  # an unchanged file keeps its user's formatting
            target.write_text(contract.to_json())
        noun = "feature" if len(changes) == 1 else "features"
        summary = f"refreshed {target}: {len(changes)} {noun} changed" if changes else f"{target} is up to date"
        outcome = "\n".join([*changes, summary])
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(contract.to_json())
        outcome = f"written to {target}"
    table = Table(title=f"{spec.name}: contract ({contract.control_rate:g} Hz, robot {contract.robot_type})")
    for column in ("feature", "role", "type", "dtype", "shape", "names"):
        table.add_column(column)
    for name, feature in contract.features.items():
        names = ", ".join(feature.names or [])
        table.add_row(
            name,
            feature.role,
            feature.type.value,
            feature.dtype,
            str(list(feature.shape)),
            names if len(names) < 60 else names[:57] + "...",
        )
    Console().print(table)
    print(outcome)
    for warning in state_images(contract):
        print(f"warning: {warning}")
    return 0
