"""Two attempts of one instance in one run: a retry started while the worker taken for lost still runs.

Each attempt writes its shard apart, and whichever commits last, or first, the instance's shard is one
attempt's whole shard, never a mix of the two or an incomplete one over a whole one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hud_pipelines.dataset.shards import INCOMPLETE_FILE, ShardStore
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.spec.loader import load_pipeline_text

KEY = "task0-i0"


@pytest.fixture(name="stores")
def stores_fixture(tmp_path: Path) -> tuple[ShardStore, ShardStore]:
    spec = load_pipeline_text(
        json.dumps(
            {
                "name": "twice",
                "sim": {"factory": "CartPole-v1"},
                "agent": {"policy": {"kind": "random"}},
                "dataset": {"repo_id": "local/twice"},
            }
        ),
        source=tmp_path / "twice.yaml",
    )
    outputs = EvalOutputs(tmp_path / "outputs", spec.name)
    return ShardStore(outputs, spec, run_id="run"), ShardStore(outputs, spec, run_id="run")


def _write(store: ShardStore, text: str) -> Path:
    pending = store._pending(KEY)
    pending.mkdir(parents=True, exist_ok=True)
    (pending / "part").write_text(text)
    return pending


def _staged(store: ShardStore) -> list[str]:
    return sorted(p.name for p in store.outputs.shard(KEY).parent.iterdir() if p.name.startswith("."))


def test_a_retry_writes_apart_from_the_lost_attempt_and_the_first_whole_commit_stands(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    lost, retry = stores
    _write(lost, "lost attempt")
    _write(retry, "retry")  # the retry starts while the lost attempt still writes
    assert (lost._pending(KEY) / "part").read_text() == "lost attempt", "the retry did not clear it"
    retry.commit(KEY)
    lost.commit(KEY)  # the worker taken for lost ends after all: a whole shard of the same episodes is in place
    assert (retry.outputs.shard(KEY) / "part").read_text() == "retry"
    assert _staged(retry) == [], "no staging or retired dir is left"


@pytest.mark.parametrize("retry_failed", [False, True], ids=["whole", "incomplete"])
def test_a_commit_that_meets_another_attempts_shard_leaves_a_whole_one(
    stores: tuple[ShardStore, ShardStore], monkeypatch: pytest.MonkeyPatch, retry_failed: bool
) -> None:
    lost, retry = stores
    lost_pending = _write(lost, "lost attempt")
    _write(retry, "retry")
    rename = Path.rename
    raced: list[Path] = []

    def the_retry_commits_in_between(self: Path, target: Path) -> Path:
        if self == lost_pending and not raced:
            raced.append(target)
            retry.commit(KEY, failure="OSError: [Errno 28] No space left on device" if retry_failed else None)
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", the_retry_commits_in_between)
    lost.commit(KEY)
    assert raced, "the two commits met"
    shard = retry.outputs.shard(KEY)
    # a whole shard of the run in place stands (the same episodes); an incomplete one is replaced by the whole one
    assert (shard / "part").read_text() == ("lost attempt" if retry_failed else "retry")
    assert not (shard / INCOMPLETE_FILE).exists()
    assert _staged(retry) == [], "no staging or retired dir is left"


def test_an_incomplete_shard_committed_after_a_whole_one_of_the_same_run_leaves_the_whole_one(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    lost, retry = stores
    _write(lost, "lost attempt, cut short")
    _write(retry, "retry")
    retry.commit(KEY)
    lost.commit(KEY, failure="OSError: [Errno 28] No space left on device")
    shard = retry.outputs.shard(KEY)
    assert (shard / "part").read_text() == "retry"
    assert not (shard / INCOMPLETE_FILE).exists()
    assert _staged(retry) == []


def test_a_later_run_replaces_an_earlier_runs_whole_shard_even_with_an_incomplete_one(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    earlier, _ = stores
    _write(earlier, "earlier run")
    earlier.commit(KEY)
    later = ShardStore(earlier.outputs, earlier.spec, run_id="later")
    _write(later, "later run, cut short")
    later.commit(KEY, failure="OSError: [Errno 28] No space left on device")
    shard = later.outputs.shard(KEY)
    assert (shard / "part").read_text() == "later run, cut short", "the instance's result is the later run's now"
    assert (shard / INCOMPLETE_FILE).exists()


def test_staging_of_a_lost_attempt_stays_through_its_run_and_goes_with_a_later_runs_commit(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    lost, retry = stores
    _write(lost, "lost attempt")  # its worker may only be cut off and still be writing
    _write(retry, "retry")
    retry.commit(KEY)
    assert len(_staged(retry)) == 1, "this run's other attempt keeps its staging"
    later = ShardStore(retry.outputs, retry.spec, run_id="later")
    _write(later, "later run")
    later.commit(KEY)
    assert _staged(later) == [], "an earlier run's leftovers are cleared"
