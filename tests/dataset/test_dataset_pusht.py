"""A PushT eval (camera + state) written, loaded, summarized and trained on by a LeRobot policy."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from hud_pipelines.dataset.publish import DatasetBuild, PublishResult
from hud_pipelines.dataset.summary import summarize_dataset
from hud_pipelines.recording.events import EpisodeOutcome
from tests.dataset.rollouts import contract_of, rollout
from tests.dataset.support import check_episodes, load

PUSHT = "gym_pusht/PushT-v0"
BUILD_ARGS = {"obs_type": "pixels_agent_pos"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pusht(tmp_path_factory: pytest.TempPathFactory) -> tuple[PublishResult, list[EpisodeOutcome]]:
    target = tmp_path_factory.mktemp("pusht") / "pusht"
    contract = contract_of(PUSHT, BUILD_ARGS)
    with DatasetBuild(target, contract) as build:
        _, outcomes = rollout(
            build.sink("instance-0"), PUSHT, num_envs=2, rounds=2, max_steps=25, build_args=BUILD_ARGS
        )
        return build.publish(), outcomes


def test_pusht_dataset_loads_with_camera_and_state(pusht: tuple[PublishResult, list[EpisodeOutcome]]) -> None:
    published, outcomes = pusht
    dataset = load(published.path)
    assert dataset.num_episodes == len(outcomes) == 4
    assert dataset.fps == 10
    assert sorted(check_episodes(dataset)) == sorted(o.steps for o in outcomes)
    assert dataset.meta.video_keys == ["observation.images.pixels"]
    assert dataset.meta.robot_type == contract_of(PUSHT, BUILD_ARGS).robot_type
    item = dataset[0]
    assert tuple(item["observation.images.pixels"].shape) == (3, 96, 96)
    assert tuple(item["observation.state"].shape) == (2,)
    assert tuple(item["action"].shape) == (2,)
    assert item["task"].startswith(PUSHT)
    stats = dataset.meta.stats
    assert np.asarray(stats["observation.images.pixels"]["mean"]).shape == (3, 1, 1)
    assert {"observation.state", "action", "next.reward", "next.success"} <= set(stats)


def test_summary_has_counts_features_stats_and_first_frames(pusht: tuple[PublishResult, list[EpisodeOutcome]]) -> None:
    from PIL import Image

    published, _ = pusht
    summary = summarize_dataset(published.path)
    assert (summary.episodes, summary.frames) == (published.episodes, published.frames)
    assert summary.size_bytes > 0
    assert [row.key for row in summary.features][:2] == ["observation.images.pixels", "observation.state"]
    assert "observation.state" in [row.key for row in summary.stats]
    assert summary.thumbnail_png is not None
    strip = Image.open(io.BytesIO(summary.thumbnail_png))
    assert strip.size == (4 * 96 + 3 * 2, 96)  # one row (one camera), one tile per episode
    assert np.asarray(strip).std() > 0  # real pixels, not a blank canvas

    import dagster as dg

    metadata = summary.dagster_metadata()
    assert metadata["episodes"] == 4
    assert isinstance(metadata["features"], dg.TableMetadataValue)
    assert isinstance(metadata["first_frames"], dg.MarkdownMetadataValue)


def test_a_lerobot_policy_trains_on_the_dataset(pusht: tuple[PublishResult, list[EpisodeOutcome]]) -> None:
    import torch
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors

    published, _ = pusht
    meta = LeRobotDatasetMetadata(published.repo_id, root=published.path)
    config: Any = make_policy_config(
        "act",
        device="cpu",
        pretrained_backbone_weights=None,
        chunk_size=8,
        n_action_steps=8,
        dim_model=64,
        n_heads=2,
        dim_feedforward=128,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
    )
    policy: Any = make_policy(config, ds_meta=meta)
    preprocessor, _ = make_pre_post_processors(config, dataset_stats=meta.stats)
    dataset = LeRobotDataset(
        published.repo_id, root=published.path, delta_timestamps=resolve_delta_timestamps(config, meta)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    policy.train()
    losses: list[float] = []
    for step, batch in enumerate(loader):
        if step == 3:
            break
        loss, _ = policy.forward(preprocessor(batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert len(losses) == 3
    assert all(np.isfinite(losses))
    after = [p for p in policy.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
