"""Dataset shards per instance, kept between runs, and their publication as one dataset.

Each instance writes its episodes into its own shard (a
:class:`~hud_pipelines.dataset.writer.LeRobotDatasetSink`) in a run-private directory; once the
instance ended, that shard replaces the instance's previous one under ``shards/<partition>``. So a
re-run of one instance replaces exactly its episodes, and the ``dataset`` asset can merge the
latest shard of every instance and publish the result atomically (the published path never holds
a half-written dataset). A shard whose writer failed is marked incomplete with the reason: its
instance's grades stand, and the dataset is not published until that instance runs again.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

from hud_pipelines.contract import Contract
from hud_pipelines.dataset.merge import Schema, find_parts, schema
from hud_pipelines.dataset.publish import publish_shards
from hud_pipelines.dataset.sources import dataset_robot_type
from hud_pipelines.dataset.summary import DatasetSummary, summarize_dataset
from hud_pipelines.dataset.writer import LeRobotDatasetSink
from hud_pipelines.errors import DatasetWriteError, EmptyDatasetError
from hud_pipelines.eval.outputs import EvalOutputs, write_atomically
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.dataset_options import CameraStorage, DatasetOptions
from hud_pipelines.spec.models import PipelineSpec

RUN_FILE = "run_id"
"""Beside a shard's parts: the run that wrote it."""
INCOMPLETE_FILE = "incomplete"
"""Beside a shard's parts, when its writer failed: why (it holds only the episodes written before)."""
SETTINGS_FILE = "settings.json"
"""Beside a shard's parts: the ``dataset:`` settings that decided what it holds (how many writers wrote it did not;
``video`` and ``codec`` only where the sim has cameras)."""
PUBLISHED_FROM = "meta/hud_published_from.json"
"""In a published dataset: the shards (instance -> the run that wrote it) and settings it was merged from."""


class ShardStore:
    """The shards of one pipeline under ``outputs/<name>/shards/``."""

    def __init__(self, outputs: EvalOutputs, spec: PipelineSpec, *, run_id: str, checkpoint: str | None = None) -> None:
        self._writing: dict[str, IO[str]] = {}
        """Instance -> the locked mark beside its staging dir, held while this store writes there (:func:`_written`)."""
        self.checkpoint = checkpoint
        """The label of the sweep's checkpoint ``spec`` is (its instances re-run as ``<label>|<instance>``)."""
        self.outputs = outputs
        self.spec = spec
        self.run_id = run_id
        self.options = spec.dataset.writer_options() if spec.dataset is not None else DatasetOptions()
        self._cameras: bool | None = None
        """Whether the sim has cameras (known once a sink was made): without, ``video`` and ``codec`` change nothing."""
        self.attempt = uuid.uuid4().hex[:8]
        """This store's writes: two attempts of one instance in one run (a retry while the worker taken for lost
        still runs) write apart, and the one that commits last leaves a whole shard, not a mix of the two."""

    def _pending(self, partition_key: str) -> Path:
        return self.outputs.shard(partition_key).with_name(f".{partition_key}.run-{self.run_id}.{self.attempt}")

    def sink(self, partition_key: str, contract: Contract) -> LeRobotDatasetSink:
        """A fresh shard sink for one instance of this run."""
        pending = self._pending(partition_key)
        shutil.rmtree(pending, ignore_errors=True)
        self._hold(partition_key)
        self._cameras = bool(contract.cameras)
        return LeRobotDatasetSink(
            contract,
            pending,
            options=self.options,
            repo_id=self.spec.dataset_repo_id,
            robot_type=dataset_robot_type(contract.robot_type, self.spec.sim.factory),
        )

    def commit(self, partition_key: str, *, failure: str | None = None) -> None:
        """Make this run's shard of ``partition_key`` the current one (call after its sink closed).

        The shard records the run that wrote it: a later run that writes none (its dataset disabled)
        leaves it in place, and it must not then be published beside that run's results. ``failure``:
        why its writer failed, which marks it incomplete (:meth:`publish` refuses it).
        """
        try:
            self._commit(partition_key, failure)
        finally:
            self._release(partition_key)

    def _commit(self, partition_key: str, failure: str | None) -> None:
        pending = self._pending(partition_key)
        if failure is not None:  # also a writer that failed before it wrote anything: the mark says so
            pending.mkdir(parents=True, exist_ok=True)
            (pending / INCOMPLETE_FILE).write_text(failure)
        if not pending.exists():
            return
        (pending / RUN_FILE).write_text(self.run_id)
        (pending / SETTINGS_FILE).write_text(json.dumps(self._settings(self._cameras), sort_keys=True))
        current = self.outputs.shard(partition_key)
        while not self._stands_over_ours(partition_key, failure):  # ends: only another attempt's commit loops
            retired = current.with_name(f".{partition_key}.old-{uuid.uuid4().hex[:8]}")
            with contextlib.suppress(FileNotFoundError):  # none yet, or another attempt retired it first
                current.rename(retired)
            try:
                pending.rename(current)
            except OSError:
                if not current.exists():
                    raise
                continue  # another attempt of this instance put its shard there in between: judged again
            else:
                self._clear_other_runs_staging(partition_key)
                return
            finally:
                shutil.rmtree(retired, ignore_errors=True)
        shutil.rmtree(pending, ignore_errors=True)

    def _stands_over_ours(self, partition_key: str, failure: str | None) -> bool:
        """Whether the shard in place stays over this attempt's: another attempt of this run wrote it (a retry, or
        the worker taken for lost, of the same episodes), and it is whole or ours is not."""
        shard = self.outputs.shard(partition_key)
        try:
            ours = (shard / RUN_FILE).read_text() == self.run_id
        except OSError:
            return False
        return ours and (failure is not None or not (shard / INCOMPLETE_FILE).exists())

    def _clear_other_runs_staging(self, partition_key: str) -> None:
        """Remove what attempts of earlier runs left of this instance uncommitted (a worker lost for good): this
        run's other attempts may still be writing theirs (a worker taken for lost that runs on), and so may another
        run of the instance under way at the same time (its mark is locked: :func:`_written`)."""
        mine = f".{partition_key}.run-{self.run_id}."
        for staging in self.outputs.shard(partition_key).parent.glob(f"{glob.escape(f'.{partition_key}.run-')}*"):
            if staging.suffix == _WRITING:  # cleared with its staging dir, or alone once its writer is gone
                if not staging.with_suffix("").exists() and not staging.name.startswith(mine):
                    _unlink_unheld(staging)
                continue
            if staging.name.startswith(mine) or _written(staging):
                continue
            shutil.rmtree(staging, ignore_errors=True)
            _mark(staging).unlink(missing_ok=True)

    def __del__(self) -> None:
        for handle in self._writing.values():  # its staging, uncommitted, is a gone writer's: a later commit clears it
            handle.close()

    def _hold(self, partition_key: str) -> None:
        """Lock the mark beside this store's staging dir of the instance until its commit: a live process holds it."""
        self._release(partition_key)
        mark = _mark(self._pending(partition_key))
        mark.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = mark.open("a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            except OSError:  # a file system without locks: its staging then counts as written (:func:`_written`)
                break
            if mark.exists() and os.stat(mark).st_ino == os.fstat(handle.fileno()).st_ino:
                break  # not cleared away between its creation and its lock
            handle.close()
        self._writing[partition_key] = handle

    def _release(self, partition_key: str) -> None:
        handle = self._writing.pop(partition_key, None)
        if handle is not None:
            _mark(self._pending(partition_key)).unlink(missing_ok=True)
            handle.close()

    def written_by(self, partition_key: str, run_id: str) -> bool:
        """Whether the instance's shard exists and is the one ``run_id`` wrote (a shard from before runs were
        recorded counts as its result's)."""
        shard = self.outputs.shard(partition_key)
        recorded = shard / RUN_FILE
        return shard.is_dir() and (not recorded.is_file() or recorded.read_text() == run_id)

    def discard_pending(self, keys: Iterable[str] | None = None) -> None:
        """Remove this run's shards of ``keys`` (default: every instance) that were never committed.

        An interrupted run leaves no staging dirs. A step that ran some instances of the run passes
        their keys: other steps of the same run (on other workers) may still be writing theirs.
        """
        for key in self.spec.partition_keys() if keys is None else keys:
            shutil.rmtree(self._pending(key), ignore_errors=True)
            self._release(key)

    def publish(self, target: Path, current: Mapping[str, InstanceResult]) -> bool:
        """Merge the shards of the ``current`` results' instances and swap the result in at ``target``; whether it
        was written (``False``: ``target`` holds a dataset of exactly these shards and settings already).

        ``current`` holds each instance whose latest result is current: a shard an earlier
        configuration wrote stays out, as its rows stay out of the grades (they say ``not_run``), and
        so does a shard of another run than its instance's result. A sweep publishes a dataset per
        checkpoint on every run; the checkpoints a run did not evaluate again keep theirs as they are.
        """
        written = {k: result.run_id for k, result in current.items() if self.written_by(k, result.run_id)}
        self._refuse_unheld(current, written)
        if not written:
            stale = sum(self.outputs.shard(k).is_dir() for k in self.spec.partition_keys())
            detail = f" ({stale} instance(s) have only the shard of another run or configuration)" if stale else ""
            raise EmptyDatasetError(
                f"{self.spec.name}: no instance of this configuration has run yet{detail}; run the rollouts first"
            )
        shards = [self.outputs.shard(k) for k in written]
        self._refuse_incomplete(written)
        self._refuse_other_schemas(written)
        if not find_parts(shards):
            raise EmptyDatasetError(
                f"{self.spec.name}: no episode to publish: every episode of the {len(shards)} instance(s) that ran "
                "errored, and errored episodes stay out of the dataset (`dataset.keep_errored: true` keeps them)"
            )
        made_of = {
            "shards": dict(sorted(written.items())),  # each instance's shard, named by the run that wrote it
            "repo_id": self.spec.dataset_repo_id,
            "dataset": None if self.spec.dataset is None else self.spec.dataset.model_dump(mode="json"),
        }
        record = target / PUBLISHED_FROM
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text()) == made_of:
                return False
        try:
            publish_shards(shards, target, repo_id=self.spec.dataset_repo_id)
        except OSError as exc:  # a folder that cannot be made there: the place said, not a bare errno
            raise DatasetWriteError(f"{self.spec.name}: cannot write the dataset at {target}: {exc}") from exc
        write_atomically(record, json.dumps(made_of, indent=1))  # after the swap: a crash before it publishes again
        return True

    def _settings(self, cameras: bool | None) -> dict[str, object]:
        """The settings a shard's content follows, by their YAML keys (``cameras``: whether the sim has any)."""
        o = self.options
        settings: dict[str, object] = {"state_features": o.state_features, "keep_errored": o.keep_errored}
        return (
            settings if cameras is False else settings | {"video": o.cameras is CameraStorage.VIDEO, "codec": o.codec}
        )

    def _refuse_unheld(self, current: Mapping[str, InstanceResult], written: Mapping[str, str]) -> None:
        """Refuse to publish a dataset without the graded episodes of a current result: its instance has no shard of
        that result's run (it ran with the dataset disabled), or one written under other dataset settings, which
        cannot be merged with the others (another feature set) or would not be what the section asks for."""
        unheld: dict[str, str] = {}
        kept = self.options.keep_errored
        for key, result in current.items():
            if key in written:  # merged, whatever it holds: of the settings asked for, or refused
                if (other := self._other_settings(key)) is not None:
                    unheld[key] = f"its shard was written with {other}"
            elif any(row.status is not EpisodeStatus.ERRORED or (kept and row.steps) for row in result.rows):
                unheld[key] = f"no shard of run {result.run_id} (its dataset was disabled, or the shard removed)"
                with contextlib.suppress(OSError):  # another run's shard stands beside its result
                    other = (self.outputs.shard(key) / RUN_FILE).read_text()
                    unheld[key] = (
                        f"no shard of run {result.run_id}, whose result stands beside run {other}'s shard (the dataset "
                        f"of run {result.run_id} was disabled, or both runs ran it at once)"
                    )
        self._refuse(unheld, "{n} instance(s) have episodes that no shard of theirs holds as the dataset asks now")

    def _other_settings(self, key: str) -> str | None:
        """How the settings a shard was written with differ from this run's (``None``: the same, or not recorded)."""
        try:
            recorded: dict[str, object] = json.loads((self.outputs.shard(key) / SETTINGS_FILE).read_text())
        except (OSError, ValueError):
            return None
        now = self._settings(cameras=True)
        differ = [
            f"{k}: {json.dumps(v)} (now {json.dumps(now.get(k))})" for k, v in recorded.items() if now.get(k) != v
        ]
        return ", ".join(differ) or None

    def _refuse_incomplete(self, keys: Iterable[str]) -> None:
        """Refuse to publish when a shard's writer failed: the dataset would lack its episodes without a word."""
        marks = {k: self.outputs.shard(k) / INCOMPLETE_FILE for k in keys}
        failed = {k: mark.read_text() for k, mark in marks.items() if mark.is_file()}
        self._refuse(
            failed, "the dataset writer of {n} instance(s) failed, so their shards hold only part of their episodes"
        )

    def _refuse_other_schemas(self, keys: Iterable[str]) -> None:
        """Refuse shards that hold other features than the latest one (lerobot's merge fails on them, naming no
        instance): written by an earlier version of this package (one that stored an integer feature inside
        ``observation.state``, say) or of the sim. The latest shard is the layout that a run writes now."""
        schemas = {k: found for k in keys if (found := schema(self.outputs.shard(k))) is not None}
        if len(schemas) < 2:
            return
        latest = max(schemas, key=lambda k: _written_at(self.outputs.shard(k)))
        other = {
            k: f"its shard holds {_schema_difference(found, schemas[latest])} than instance {latest}'s, the latest"
            for k, found in schemas.items()
            if found != schemas[latest]
        }
        self._refuse(other, "{n} instance(s) have shards written with other features, which cannot be merged")

    def _refuse(self, instances: Mapping[str, str], what: str) -> None:
        """Raise saying ``what`` of ``instances`` (``{n}``: how many), each with why, and the command that runs them
        again."""
        from hud_pipelines.eval.checks import rerun_command
        from hud_pipelines.eval.grades import one_line

        if not instances:
            return
        listed = "; ".join(f"{key}: {one_line(reason)}" for key, reason in sorted(instances.items()))
        command, order = self.outputs.run_command(self.spec), self.spec.partition_keys()
        keys = list(instances)
        if self.checkpoint is not None:  # a sweep's pairs run again only when asked to
            keys = [f"{self.checkpoint}|{key}" for key in keys]
            command, order = [*command, "--rerun"], [f"{self.checkpoint}|{key}" for key in order]
        raise DatasetWriteError(
            f"{self.spec.name}: {what.format(n=len(instances))} ({listed}); their grades stand, and the "
            f"published dataset is left as it was; run them again: {rerun_command(keys, command, order)}"
        )

    def summary(self, target: Path) -> DatasetSummary:
        """What the dataset published at ``target`` holds (it loads it with lerobot: seconds)."""
        return summarize_dataset(target, repo_id=self.spec.dataset_repo_id)


def _written_at(shard: Path) -> int:
    """When ``shard`` was committed (its run file's time); one from before shards named their run is the oldest."""
    try:
        return (shard / RUN_FILE).stat().st_mtime_ns
    except OSError:
        return -1


def _schema_difference(found: Schema, latest: Schema) -> str:
    """How a shard's :class:`~hud_pipelines.dataset.merge.Schema` differs from the latest's, in words."""
    differ = [
        f"{name} {getattr(found, name)!r} (not {getattr(latest, name)!r})"
        for name in ("fps", "robot_type")
        if getattr(found, name) != getattr(latest, name)
    ]
    for key in sorted(set(found.features) | set(latest.features)):
        if key not in latest.features:
            differ.append(f"{key} {found.described(key)}")
        elif key not in found.features:
            differ.append(f"no {key} ({latest.described(key)})")
        elif found.features[key] != latest.features[key]:
            was, now = found.described(key), latest.described(key)
            differ.append(f"{key} {was} (not {now})" if was != now else f"{key} with other names or fields")
    return f"other features ({', '.join(differ)})"


_WRITING = ".writing"


def _mark(staging: Path) -> Path:
    """The file beside a staging dir that its writing store holds locked (a lock dies with its process)."""
    return staging.with_name(staging.name + _WRITING)


def _unlink_unheld(mark: Path) -> None:
    """Remove a mark no store holds (its writer died before it made its staging dir), under its lock: a writer that
    locks it next finds it gone and makes another (:meth:`ShardStore._hold`), never a mark it holds removed."""
    with contextlib.suppress(OSError), mark.open("a") as handle:  # held (BlockingIOError), or no locks here: kept
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mark.unlink(missing_ok=True)


def _written(staging: Path) -> bool:
    """Whether a store, in this process or another, still writes into ``staging`` (its mark is locked)."""
    mark = _mark(staging)
    if not mark.exists():  # none: a staging dir of a store that is gone
        return False
    try:
        with mark.open("a") as handle:  # open for writing: NFS takes an exclusive lock only on such a file
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no locks here, or the mark went with its writer's commit: kept, never a live one cleared
        return mark.exists()
    return False
