"""``sim.shards``: what it accepts, and how it enters the rollout hash."""

from __future__ import annotations

from typing import Any

import pytest

from hud_pipelines.sim.pool import SimPool
from hud_pipelines.sim.settings import SimSettings
from hud_pipelines.spec import PipelineSpec


def _spec(**sim: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "sharded",
            "sim": {"factory": "CartPole-v1", "num_envs": 4, **sim},
            "agent": {"policy": {"kind": "random"}},
        }
    )


def test_one_shard_leaves_the_rollout_hash_as_it_was_and_more_change_it() -> None:
    """Existing results stay current; a sharded vectorized factory builds other batches, so its results are apart."""
    plain = _spec()
    assert _spec(shards=1).rollout_hash == plain.rollout_hash
    assert _spec(shards=2).rollout_hash != plain.rollout_hash
    assert _spec(shards=3).sim.shards == 3, "shards need not divide num_envs"


def test_a_pool_refuses_to_shard_a_served_sim() -> None:
    with pytest.raises(ValueError, match="shards=2 splits a sim the pool spawns"):
        SimPool(SimSettings(servers=(("ws://127.0.0.1:1", "t"),), num_envs=4, shards=2))
