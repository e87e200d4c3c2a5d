"""Where an eval's files live: results per instance, traces per run, dataset shards, grades, report.

A sweep keeps each checkpoint's files as a whole eval of their own under
``<name>/checkpoints/<label>/`` (:meth:`EvalOutputs.member`), and the comparison across them beside
the sweep's grades and report.

Everything of pipeline ``<name>`` sits under ``<root>/<name>/``; the root is ``$HUD_PIPELINES_OUTPUTS``
or ``outputs/`` in the working directory (the project root when run through ``make``, the CLI or
``dagster dev``). Per-instance results are replaced atomically, so re-running one instance replaces
its slots and nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from hud_pipelines.spec.models import PipelineSpec

OUTPUTS_ENV = "HUD_PIPELINES_OUTPUTS"


def default_outputs_root() -> Path:
    configured = os.environ.get(OUTPUTS_ENV)
    return Path(configured).expanduser().resolve() if configured else (Path.cwd() / "outputs").resolve()


class _Entry:
    """A file (or folder) directly under a pipeline's folder: ``outputs.grades_csv`` is ``outputs.base / "grades.csv"``.

    The layout's files are a table of names; this keeps each to one line and the join in one place.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, outputs: None, owner: type[EvalOutputs]) -> _Entry: ...

    @overload
    def __get__(self, outputs: EvalOutputs, owner: type[EvalOutputs]) -> Path: ...

    def __get__(self, outputs: EvalOutputs | None, owner: type[EvalOutputs]) -> Path | _Entry:
        return self if outputs is None else outputs.base / self.name


@dataclass(frozen=True)
class EvalOutputs:
    """The file layout of one pipeline's outputs."""

    root: Path
    pipeline: str

    @property
    def base(self) -> Path:
        return self.root / self.pipeline

    contract = _Entry("contract.json")
    seed_check = _Entry("seed_check.json")
    """Whether the sim repeated an episode's start for the same seed, checked by the latest contract step."""
    served_sims = _Entry("served_sims")
    """``<run id>.json`` per run that met a served sim: what the sim that run holds its sims to says it is."""
    served_policies = _Entry("served_policies")
    """``<run id>.json`` per run of a remote policy: what its server said of the policy (``{"metadata": ...}``)."""

    def run_command(self, spec: PipelineSpec) -> list[str]:
        """``hud-pipelines run`` of ``spec`` (:func:`~hud_pipelines.spec.loader.run_argument`) writing here: with
        ``--outputs`` unless this is ``./outputs`` (the root without ``$HUD_PIPELINES_OUTPUTS``), so a command copied
        from a report or a check runs where the results it speaks of are, whatever the shell's environment."""
        from hud_pipelines.spec.loader import run_argument
        from hud_pipelines.spec.problems import display_path

        command = ["hud-pipelines", "run", run_argument(spec)]
        root = self.root.expanduser().resolve()
        plain = (Path.cwd() / "outputs").resolve()
        return command if root == plain else [*command, "--outputs", display_path(root)]

    def result(self, partition_key: str) -> Path:
        return self.base / "rollouts" / f"{partition_key}.json"

    def traces(self, run_id: str) -> Path:
        return self.base / "traces" / run_id

    def shard(self, partition_key: str) -> Path:
        return self.base / "shards" / partition_key

    @contextlib.contextmanager
    def instance_lock(self, partition_key: str) -> Generator[None]:
        """Held while an instance's result and its dataset shard are put in place (:func:`put_in_place`): two runs of
        one instance at once, on this machine or on workers sharing the outputs, then leave one run's result and
        shard, never one run's result beside the other's shard (which the dataset would refuse)."""
        lock = self.base / "locks" / f"{partition_key}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("a") as handle:
            with contextlib.suppress(OSError):  # a file system without locks (some NFS mounts): written unlocked
                fcntl.flock(handle, fcntl.LOCK_EX)
            yield  # released as the file closes

    grades_json = _Entry("grades.json")
    grades_csv = _Entry("grades.csv")
    configuration_json = _Entry("configuration.json")
    """The configuration of the latest run: its rollout hash and what it overrode of the YAML."""
    configurations = _Entry("configurations")
    """``<run id>.json`` per run: the configuration it recorded, which its own steps judge by."""
    checks_json = _Entry("checks.json")

    @property
    def dataset(self) -> Path:
        """Where the published LeRobot dataset goes unless ``dataset.root`` says otherwise."""
        return self.root / "datasets" / self.pipeline

    report_md = _Entry("report.md")
    report_png = _Entry("report.png")
    checkpoints = _Entry("checkpoints")
    """A sweep's folder of per-checkpoint outputs."""

    def member(self, label: str) -> EvalOutputs:
        """The outputs of one checkpoint of a sweep: the same layout, under ``checkpoints/<label>/``."""
        return EvalOutputs(self.root, f"{self.pipeline}/checkpoints/{label}")

    checkpoint_json = _Entry("checkpoint.json")
    """What a sweep member evaluated: its label, step, folder and content hash."""
    comparison_csv = _Entry("comparison.csv")
    comparison_json = _Entry("comparison.json")
    comparison_png = _Entry("comparison.png")
    perturbations_csv = _Entry("perturbations.csv")
    perturbations_json = _Entry("perturbations.json")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename: a reader sees the old file or the new one, never half.

    The file is written beside it under a name of this process and thread: two runs of one pipeline
    (two partitions of a backfill) writing the same file at once each rename their own whole file.
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
