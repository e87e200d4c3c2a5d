"""A dataset published after partial reruns holds every graded episode of the current results, or says why not.

Each instance's shard is its latest run's; the dataset merges the shards of the current results. An
instance whose result ran with the dataset disabled has no shard of that run, and one whose shard was
written under other dataset settings holds another feature set: publishing either way would lose
episodes without a word, or fail in the merge with no instance named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hud_pipelines.errors import DatasetWriteError
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.spec.models import Partition, PipelineSpec
from tests.dagster.support import REPO


def _spec(tmp_path: Path, **dataset: Any) -> PipelineSpec:
    section = json.dumps({"repo_id": "local/rerun", "root": str(tmp_path / "published"), **dataset})
    text = (
        "name: rerun\nsim: {factory: CartPole-v1, num_envs: 2}\ngroup: 2\nmax_steps: 15\n"
        "agent: {policy: {kind: scripted, target: 'envs.controllers:CartPolePD'}}\n"
        f"graders: [{{kind: return, threshold: 10}}]\ndataset: {section}\n"
    )
    return load_pipeline_text(text, source=tmp_path / "rerun.yaml")


def _published(tmp_path: Path) -> int:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/rerun", root=tmp_path / "published").num_episodes


def test_a_dataset_never_loses_the_episodes_of_a_rerun_without_its_shard_or_of_another_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, an instance rerun with the dataset disabled was left out of the next dataset without a word (2 of
    4 episodes published, the run green), and a shard of other settings failed lerobot's merge, naming nothing."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    first = evaluate(_spec(tmp_path), outputs_dir=out)
    assert _published(tmp_path) == len(first.rows) == 4

    evaluate(_spec(tmp_path, enabled=False), outputs_dir=out, partitions=[Partition(0, 0)])
    with pytest.raises(DatasetWriteError) as refused:
        evaluate(_spec(tmp_path), outputs_dir=out, partitions=[Partition(0, 1)])
    said = str(refused.value)
    assert "1 instance(s) have episodes that no shard of theirs holds as the dataset asks now" in said, said
    assert "task0-i0: no shard of run " in said, "the instance whose run wrote none"
    assert said.endswith("--partition task0-i0"), "and the command that writes it"
    assert _published(tmp_path) == 4, "the dataset published before is left as it was"

    kept = _spec(tmp_path, keep_errored=True)  # another feature set: an `episode.errored` column
    with pytest.raises(DatasetWriteError) as refused:
        evaluate(kept, outputs_dir=out, partitions=[Partition(0, 0)])
    said = str(refused.value)
    assert "task0-i1: its shard was written with keep_errored: false (now true)" in said, said
    assert said.endswith("--partition task0-i1")

    last = evaluate(kept, outputs_dir=out, partitions=[Partition(0, 1)])
    graded = [row for row in last.rows if row.status is not EpisodeStatus.ERRORED]
    assert len(graded) == 4
    assert _published(tmp_path) == 4, "every current graded episode, once"

    stills = _spec(tmp_path, keep_errored=True, video=False, codec="libsvtav1")  # CartPole has no camera to store
    evaluate(stills, outputs_dir=out, partitions=[Partition(0, 0)])
    assert _published(tmp_path) == 4, "settings that change nothing a shard holds refuse nothing"


def test_shards_of_another_layout_are_refused_naming_their_instances_not_left_to_lerobots_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard written by an earlier version, which kept an int64 tick inside ``observation.state``, recorded the same
    settings as one written since (the tick in its own ``observation.tick``): publishing both failed in lerobot's
    merge, naming no instance. The shard of another layout than the latest is refused, with the command that
    writes it again; once it ran, the dataset publishes."""
    from hud_pipelines.dataset import features

    monkeypatch.chdir(REPO)
    section = json.dumps({"repo_id": "local/ticks", "root": str(tmp_path / "published")})
    text = (
        "name: ticks\nsim: {factory: 'tests.dataset.tick_sim:TickEnv', num_envs: 1}\ngroup: 2\nmax_steps: 10\n"
        f"agent: {{policy: {{kind: constant}}}}\ngraders: [{{kind: return, threshold: 5}}]\ndataset: {section}\n"
    )
    spec = load_pipeline_text(text, source=tmp_path / "ticks.yaml")
    out = tmp_path / "out"
    with monkeypatch.context() as earlier:  # the earlier rule: every vector feature inside observation.state
        earlier.setattr(features, "exact_in_float32", lambda feature: True)
        evaluate(spec, outputs_dir=out)
    (out / "ticks" / "shards" / "task0-i0" / "run_id").unlink()  # older still: from before shards named their run
    with pytest.raises(DatasetWriteError) as refused:
        evaluate(spec, outputs_dir=out, partitions=[Partition(0, 1)])
    said = str(refused.value)
    assert "1 instance(s) have shards written with other features, which cannot be merged" in said, said
    assert "task0-i0: its shard holds other features (observation.state float32[3] (not float32[2])" in said
    assert "no observation.tick (int64[1])) than instance task0-i1's, the latest" in said
    assert said.endswith("--partition task0-i0")
    evaluate(spec, outputs_dir=out, partitions=[Partition(0, 0)])
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ticks = LeRobotDataset("local/ticks", root=tmp_path / "published").hf_dataset["observation.tick"]
    assert {int(np.asarray(t).reshape(-1)[0]) for t in ticks} >= {2**25 + 1}, "stored exactly, in its own key"
