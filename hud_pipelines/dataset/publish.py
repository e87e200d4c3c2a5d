"""Atomic publish: a new materialization is written beside the published one and swapped in.

Layout beside the published path ``<dir>/<name>``::

    <dir>/.<name>.staging-<id>/owner.json        who writes here (host, pid)
    <dir>/.<name>.staging-<id>/shards/<shard>/part-000 ...   one lerobot dataset per writer
    <dir>/.<name>.staging-<id>/dataset           the merged dataset, then swapped in

The published path only ever changes by one ``rename``: with Linux's ``renameat2(RENAME_EXCHANGE)``
the new and the old directory trade places atomically, so ``<dir>/<name>`` always holds a complete
dataset; elsewhere the old one is renamed aside first (a crash in between leaves it at
``.<name>.old-<id>``, which the next build restores). The old dataset is removed only after the
new one is in place. A build that fails or is cancelled leaves its staging directory (finalized,
loadable parts) until the next build of the same name clears it.

The API a Dagster asset needs::

    with DatasetBuild(target, contract, options=options) as build:
        for instance in instances:
            run_instance(..., sinks=[build.sink(instance.name)])
        published = build.publish()
    return MaterializeResult(metadata=summarize_dataset(published.path).dagster_metadata())

Shards written by other processes (one per partition run, each a closed ``LeRobotDatasetSink``)
are published with :func:`publish_shards`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from hud_pipelines.contract import Contract
from hud_pipelines.dataset.cancel import sigterm_interrupts
from hud_pipelines.dataset.merge import MergeResult, find_parts, merge_parts
from hud_pipelines.dataset.part import INFO_FILE
from hud_pipelines.dataset.writer import LeRobotDatasetSink, SinkReport, default_repo_id
from hud_pipelines.errors import DatasetWriteError
from hud_pipelines.spec.dataset_options import DatasetOptions

logger = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
OWNER_FILE = "owner.json"


@dataclass(frozen=True)
class PublishResult:
    """What was published, and what the sinks left out."""

    path: Path
    repo_id: str
    episodes: int
    frames: int
    sinks: dict[str, SinkReport] = field(default_factory=dict[str, SinkReport])
    skipped_parts: list[tuple[Path, str]] = field(default_factory=list[tuple[Path, str]])


def staging_prefix(target: Path) -> str:
    return f".{target.name}.staging-"


def _old_prefix(target: Path) -> str:
    return f".{target.name}.old-"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; ``False`` where the platform or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(code, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(code)}")


def _check_replaceable(target: Path) -> None:
    """Never replace something that is not a dataset (a typo in a path must not delete a home dir)."""
    if not target.exists():
        return
    if not target.is_dir() or not ((target / INFO_FILE).is_file() or not any(target.iterdir())):
        raise DatasetWriteError(f"{target} exists and is not a lerobot dataset; refusing to replace it")


def swap_in(new: Path, target: Path) -> None:
    """Make ``new`` the dataset at ``target``; the old one is removed only once the new is in place."""
    _check_replaceable(target)
    if not target.exists():
        new.rename(target)
        return
    if _exchange(new, target):
        shutil.rmtree(new)  # ``new`` now holds the old dataset
        return
    old = target.with_name(f"{_old_prefix(target)}{uuid.uuid4().hex[:8]}")
    target.rename(old)
    new.rename(target)
    shutil.rmtree(old)


def recover(target: Path) -> None:
    """Clear what earlier builds of ``target`` left: dead owners' staging, an old dataset renamed aside."""
    parent = target.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f"{_old_prefix(target)}*"), key=lambda p: p.stat().st_mtime)
    if olds and not target.exists():
        logger.warning("restoring %s from %s (a publish was interrupted between two renames)", target, olds[-1])
        olds.pop().rename(target)
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
    for staging in parent.glob(f"{staging_prefix(target)}*"):
        if not _owner_alive(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _owner_alive(staging: Path) -> bool:
    try:
        owner = json.loads((staging / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if owner.get("host") != socket.gethostname():
        return True  # another machine's build: not ours to judge
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish_parts(
    parts: Iterable[Path], target: Path, *, repo_id: str, staging: Path, consume: bool = False
) -> MergeResult:
    """Merge ``parts`` inside ``staging`` and swap the result in at ``target``.

    With ``consume`` a single part may be renamed instead of copied (parts inside ``staging``).
    """
    merged = merge_parts(list(parts), staging / "dataset", repo_id=repo_id, move_single=consume)
    swap_in(merged.root, target)
    return MergeResult(
        root=target, episodes=merged.episodes, frames=merged.frames, parts=merged.parts, skipped=merged.skipped
    )


def new_staging(target: Path) -> Path:
    """A fresh staging directory beside ``target``, marked with its owner (after clearing dead ones)."""
    _check_replaceable(target)
    recover(target)
    staging = target.parent / f"{staging_prefix(target)}{uuid.uuid4().hex[:12]}"
    staging.mkdir(parents=True)
    (staging / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    return staging


def publish_shards(shards: Iterable[Path], target: Path, *, repo_id: str | None = None) -> PublishResult:
    """Merge shards written elsewhere (e.g. one per Dagster partition run) and swap them in at ``target``.

    The shards are read, never moved or changed; they must be closed (finalized) already.
    """
    target = Path(target).absolute()
    repo_id = repo_id or default_repo_id(target.name)
    staging = new_staging(target)
    try:
        merged = publish_parts(find_parts(shards), target, repo_id=repo_id, staging=staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PublishResult(
        path=target, repo_id=repo_id, episodes=merged.episodes, frames=merged.frames, skipped_parts=merged.skipped
    )


class DatasetBuild:
    """One materialization of a dataset: shard sinks in a staging directory, then one atomic publish.

    While the build is open (as a context manager, from the main thread), SIGTERM raises
    :class:`~hud_pipelines.dataset.cancel.Terminated`, so every sink still finalizes its parts and
    the published dataset is left as it was.
    """

    def __init__(
        self,
        target: Path,
        contract: Contract | Mapping[str, Any],
        *,
        options: DatasetOptions | None = None,
        repo_id: str | None = None,
        fps: float | None = None,
        robot_type: str | None = None,
    ) -> None:
        self.target = Path(target).absolute()
        self.contract = contract
        self.options = options or DatasetOptions()
        self.repo_id = repo_id or default_repo_id(self.target.name)
        self._fps = fps
        self._robot_type = robot_type
        self.staging = new_staging(self.target)
        self._sinks: dict[str, LeRobotDatasetSink] = {}
        self._signals = contextlib.ExitStack()
        self.result: PublishResult | None = None

    @property
    def shards(self) -> Path:
        return self.staging / "shards"

    def sink(self, name: str | int) -> LeRobotDatasetSink:
        """A new shard sink (one per eval instance); the build closes it at publish or exit."""
        if self.result is not None:
            raise DatasetWriteError(f"{self.target}: already published")
        key = str(name)
        if key in self._sinks or not key or "/" in key or key.startswith("."):
            raise DatasetWriteError(f"shard name {key!r} is taken or not a plain directory name")
        sink = LeRobotDatasetSink(
            self.contract,
            self.shards / key,
            options=self.options,
            repo_id=self.repo_id,
            fps=self._fps,
            robot_type=self._robot_type,
        )
        self._sinks[key] = sink
        return sink

    def close_sinks(self) -> dict[str, SinkReport]:
        """Close every sink (each finalizes its parts); the first failure is raised after all closed."""
        failure: BaseException | None = None
        for sink in self._sinks.values():
            try:
                sink.close()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return {name: sink.report for name, sink in self._sinks.items()}

    def publish(self) -> PublishResult:
        """Close the sinks, merge their parts and swap the merged dataset in at ``target``."""
        if self.result is not None:
            return self.result
        reports = self.close_sinks()
        merged = publish_parts(
            find_parts([self.shards]), self.target, repo_id=self.repo_id, staging=self.staging, consume=True
        )
        shutil.rmtree(self.staging, ignore_errors=True)
        self.result = PublishResult(
            path=self.target,
            repo_id=self.repo_id,
            episodes=merged.episodes,
            frames=merged.frames,
            sinks=reports,
            skipped_parts=merged.skipped,
        )
        return self.result

    def __enter__(self) -> Self:
        self._signals.enter_context(sigterm_interrupts())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            try:
                self.close_sinks()
            except BaseException:
                if exc is None:
                    raise
                logger.exception("closing the sinks of %s after %r", self.target, exc)
            if self.result is None:
                logger.warning("%s was not published; its finalized shards stay in %s", self.target, self.staging)
        finally:
            self._signals.close()
