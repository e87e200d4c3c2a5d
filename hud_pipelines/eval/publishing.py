"""The dataset step: merge every instance's latest shard and publish the dataset atomically.

A sweep publishes a dataset per checkpoint (other weights, other data), each in a folder named by its
label. A checkpoint with nothing to publish (results of an earlier configuration, weights that never
loaded) is skipped with a warning; one whose shards cannot be published (a writer that failed) does not
stop the others: every checkpoint that can be is published, then the step fails naming the rest.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from hud_pipelines.errors import DatasetWriteError, EmptyDatasetError, HudPipelinesError
from hud_pipelines.eval.configuration import LATEST, CurrentBy
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.rows import collect_rows, current_results, sweep_members
from hud_pipelines.spec.models import PipelineSpec

if TYPE_CHECKING:
    from hud_pipelines.dataset.summary import DatasetSummary

logger = logging.getLogger(__name__)


def member_dataset(dataset: Path | None, label: str) -> Path | None:
    """A sweep's checkpoint publishes its own dataset, in a folder named by its label (:func:`dataset_step`)."""
    return None if dataset is None else dataset / label


def dataset_root(spec: PipelineSpec, outputs: EvalOutputs, project_dir: Path) -> Path:
    """``dataset.root`` (relative to the project) when the YAML sets it, else ``<outputs>/datasets/<name>``."""
    configured = spec.dataset.root if spec.dataset is not None else None
    return spec.dataset_root(project_dir) if configured else outputs.dataset


def dataset_step(
    spec: PipelineSpec, outputs: EvalOutputs, *, project_dir: Path, run_id: str, current: CurrentBy = LATEST
) -> DatasetSummary:
    """Merge every instance's latest shard and publish the dataset atomically (a sweep: one per checkpoint), once
    every blocking check passes on the results it would publish: within a run the checks hold this step back; the
    dataset asset materialized on its own (the UI, ``dagster asset materialize``) judges them here.

    ``current``: what a result must match to be published (:func:`collect_rows`), as the grades judged them."""
    from hud_pipelines.dataset.shards import ShardStore
    from hud_pipelines.eval.judging import all_verdicts
    from hud_pipelines.eval.report_html import ASSETS_DIR, write_dataset_links

    failing = [
        v.name
        for v in all_verdicts(spec, outputs, collect_rows(spec, outputs, current=current))
        if v.blocking and not v.passed
    ]
    if failing:
        raise HudPipelinesError(
            f"{spec.name}: the dataset is not published while a blocking check fails on the current results "
            f"({', '.join(failing)}; checks.json after the grades says why): run the instances again, or make the "
            "check non-blocking"
        )
    root = dataset_root(spec, outputs, project_dir)
    if not spec.is_sweep:
        store = ShardStore(outputs, spec, run_id=run_id)
        store.publish(root, current_results(spec, outputs, current))
        write_dataset_links(outputs.base / ASSETS_DIR, root, spec.dataset_repo_id)  # the report's cards link to it
        return store.summary(root)
    published: list[tuple[ShardStore, Path]] = []
    refused: list[str] = []
    members = sweep_members(spec, outputs, current)
    for member, expected in members:
        member_root = member_dataset(root, member.label)
        assert member_root is not None
        store = ShardStore(member.outputs, member.spec, run_id=run_id, checkpoint=member.label)
        try:  # one the run did not evaluate again is kept as it is
            store.publish(member_root, current_results(member.spec, member.outputs, expected))
        except EmptyDatasetError as exc:  # results of an earlier configuration, weights that never loaded: no data
            logger.warning("checkpoint %s of %s has no dataset: %s", member.label, spec.name, exc)
            continue
        except DatasetWriteError as exc:  # the other checkpoints still publish theirs
            refused.append(f"checkpoint {member.label}: {exc}")
            continue
        write_dataset_links(member.outputs.base / ASSETS_DIR, member_root, member.spec.dataset_repo_id)
        published.append((store, member_root))
    labels = [member.label for member, _ in members]
    write_dataset_links(outputs.base / ASSETS_DIR, root, spec.dataset_repo_id, members=labels)  # the sweep's page
    if refused:
        raise DatasetWriteError("; ".join(refused))
    if not published:
        raise HudPipelinesError(f"sweep {spec.name!r} has no evaluated checkpoint to publish")
    store, last = published[-1]
    return store.summary(last)  # the last checkpoint's, as the dataset asset shows (one load, not one each)
