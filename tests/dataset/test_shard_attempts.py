"""Two attempts of one instance in one run: a retry started while the worker taken for lost still runs; and two
runs of one instance at once.

Each attempt writes its shard apart, and whichever commits last, or first, the instance's shard is one
attempt's whole shard, never a mix of the two or an incomplete one over a whole one; of two runs, the instance
keeps one run's result and shard."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hud_pipelines.dataset.shards import INCOMPLETE_FILE, RUN_FILE, ShardStore
from hud_pipelines.errors import Fault
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.results import InstanceResult, unreached_result
from hud_pipelines.eval.rollouts import put_in_place
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


def test_two_runs_of_one_instance_at_once_leave_one_runs_result_and_shard(
    stores: tuple[ShardStore, ShardStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run a puts its result in place, and before its shard follows, run b puts in place both of its own: the
    instance must end with one run's pair (it ended with b's result beside a's shard, which publishing refused
    as a shard 'removed'); and a's commit must not clear b's staging dir, which b still writes."""
    first, _ = stores
    spec, outputs = first.spec, first.outputs
    runs = {run: ShardStore(outputs, spec, run_id=run) for run in ("run-a", "run-b")}
    for store in runs.values():
        store._hold(KEY)  # as its sink does: a store that writes its staging dir holds it
        _write(store, store.run_id)
    commit = ShardStore.commit
    a_between, b_started = threading.Event(), threading.Event()

    def a_pauses_between_its_result_and_its_shard(self: ShardStore, key: str, *, failure: str | None = None) -> None:
        if self.run_id == "run-a":
            a_between.set()
            b_started.wait(10)
            time.sleep(0.3)  # b runs to its end meanwhile, unless it waits for a
        commit(self, key, failure=failure)

    monkeypatch.setattr(ShardStore, "commit", a_pauses_between_its_result_and_its_shard)

    def put(run: str) -> None:
        result = unreached_result(spec, spec.partitions()[0], run, Fault.INTERRUPTED, run_id=run)
        put_in_place(outputs, result, runs[run])

    a = threading.Thread(target=put, args=("run-a",))
    a.start()
    assert a_between.wait(10)
    b = threading.Thread(target=put, args=("run-b",))
    b.start()
    b_started.set()
    a.join(10)
    b.join(10)
    result = InstanceResult.read(outputs.result(KEY))
    shard = outputs.shard(KEY)
    assert (shard / RUN_FILE).read_text() == result.run_id, "the result and the shard are one run's"
    assert (shard / "part").read_text() == result.run_id
    assert _staged(first) == [], "no staging dir or mark is left"


def test_a_commit_keeps_the_staging_of_another_run_still_writing_and_clears_one_whose_writer_is_gone(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    first, _ = stores
    writing, gone, done = (ShardStore(first.outputs, first.spec, run_id=run) for run in ("writing", "gone", "done"))
    for store in (writing, gone):
        store._hold(KEY)
        _write(store, store.run_id)
    gone._writing.pop(KEY).close()  # its process ended without a commit: the lock went with it
    _write(done, "done")
    done.commit(KEY)
    assert (writing._pending(KEY) / "part").read_text() == "writing", "a run still writing keeps its staging"
    assert not gone._pending(KEY).exists(), "a dead writer's staging is cleared"
    writing.commit(KEY)
    assert (first.outputs.shard(KEY) / "part").read_text() == "writing"
    assert _staged(first) == []


def test_a_commit_clears_the_mark_of_a_writer_that_died_before_it_wrote_and_keeps_a_live_ones(
    stores: tuple[ShardStore, ShardStore],
) -> None:
    """A mark whose staging dir was never made (its writer killed before its first episode) stayed for good."""
    first, _ = stores
    died, starting, done = (ShardStore(first.outputs, first.spec, run_id=run) for run in ("died", "starting", "done"))
    for store in (died, starting):
        store._hold(KEY)  # a mark, locked, and no staging dir yet
    died._writing.pop(KEY).close()  # its process ended: the lock went with it, the mark stayed
    _write(done, "done")
    done.commit(KEY)
    assert _staged(first) == [f"{starting._pending(KEY).name}.writing"], "a live writer's mark stays"
    starting.discard_pending([KEY])
    assert _staged(first) == []
