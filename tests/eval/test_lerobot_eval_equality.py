"""A ``sim.lerobot_env`` pipeline reports lerobot-eval's own per-episode numbers on the same policy and seeds.

lerobot-eval runs as a subprocess (``lerobot-eval`` beside this Python) on a random-weight ACT saved with
lerobot's PushT inputs; the pipeline runs the same folder with ``num_envs`` = its batch size, ``group`` = its
batches and the task seed = its ``--seed``. Every episode's seed, return, best reward and success must agree
(rewards to float tolerance: lerobot sums them in torch). About 40 s here, most of it two torch imports.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.dagster.support import REPO
from tests.eval.lerobot_equality import (
    ACT_SMALL,
    make_policy_folder,
    pipeline_yaml,
    run_lerobot_eval,
    run_pipeline,
)

pytestmark = pytest.mark.slow
EPISODES, BATCH, LENGTH, SEED = 4, 2, 20, 1000


def test_a_lerobot_env_pipeline_gives_lerobot_evals_episodes(tmp_path: Path) -> None:
    folder = make_policy_folder(tmp_path / "act", overrides=ACT_SMALL)
    theirs = run_lerobot_eval(
        folder, tmp_path / "lerobot", episodes=EPISODES, batch_size=BATCH, episode_length=LENGTH, seed=SEED
    )
    path = tmp_path / "equality.yaml"
    path.write_text(pipeline_yaml(folder, episodes=EPISODES, batch_size=BATCH, episode_length=LENGTH, seed=SEED))
    ours = run_pipeline(path, tmp_path / "outputs", REPO)

    assert [e.seed for e in theirs.episodes] == [SEED + i for i in range(EPISODES)], "lerobot-eval's seed rule"
    assert [e.seed for e in ours.episodes] == [e.seed for e in theirs.episodes]
    assert [e.success for e in ours.episodes] == [e.success for e in theirs.episodes]
    for mine, peer in zip(ours.episodes, theirs.episodes, strict=True):
        assert math.isclose(mine.sum_reward, peer.sum_reward, rel_tol=1e-6, abs_tol=1e-9), (mine, peer)
        assert math.isclose(mine.max_reward, peer.max_reward, rel_tol=1e-6, abs_tol=1e-9), (mine, peer)
    assert len({round(e.sum_reward, 6) for e in theirs.episodes}) > 1, "the episodes differ (a comparison worth making)"
