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

import os
from dataclasses import dataclass
from pathlib import Path

OUTPUTS_ENV = "HUD_PIPELINES_OUTPUTS"


def default_outputs_root() -> Path:
    configured = os.environ.get(OUTPUTS_ENV)
    return Path(configured).expanduser().resolve() if configured else (Path.cwd() / "outputs").resolve()


@dataclass(frozen=True)
class EvalOutputs:
    """The file layout of one pipeline's outputs."""

    root: Path
    pipeline: str

    @property
    def base(self) -> Path:
        return self.root / self.pipeline

    @property
    def contract(self) -> Path:
        return self.base / "contract.json"

    def result(self, partition_key: str) -> Path:
        return self.base / "rollouts" / f"{partition_key}.json"

    def traces(self, run_id: str) -> Path:
        return self.base / "traces" / run_id

    def shard(self, partition_key: str) -> Path:
        return self.base / "shards" / partition_key

    @property
    def grades_json(self) -> Path:
        return self.base / "grades.json"

    @property
    def grades_csv(self) -> Path:
        return self.base / "grades.csv"

    @property
    def configuration_json(self) -> Path:
        """The configuration of the latest run: its rollout hash and what it overrode of the YAML."""
        return self.base / "configuration.json"

    @property
    def checks_json(self) -> Path:
        return self.base / "checks.json"

    @property
    def dataset(self) -> Path:
        """Where the published LeRobot dataset goes unless ``dataset.root`` says otherwise."""
        return self.root / "datasets" / self.pipeline

    @property
    def report_md(self) -> Path:
        return self.base / "report.md"

    @property
    def report_png(self) -> Path:
        return self.base / "report.png"

    @property
    def checkpoints(self) -> Path:
        """A sweep's folder of per-checkpoint outputs."""
        return self.base / "checkpoints"

    def member(self, label: str) -> EvalOutputs:
        """The outputs of one checkpoint of a sweep: the same layout, under ``checkpoints/<label>/``."""
        return EvalOutputs(self.root, f"{self.pipeline}/checkpoints/{label}")

    @property
    def checkpoint_json(self) -> Path:
        """What a sweep member evaluated: its label, step, folder and content hash."""
        return self.base / "checkpoint.json"

    @property
    def comparison_csv(self) -> Path:
        return self.base / "comparison.csv"

    @property
    def comparison_json(self) -> Path:
        return self.base / "comparison.json"

    @property
    def comparison_png(self) -> Path:
        return self.base / "comparison.png"

    @property
    def perturbations_csv(self) -> Path:
        return self.base / "perturbations.csv"

    @property
    def perturbations_json(self) -> Path:
        return self.base / "perturbations.json"


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename: a reader sees the old file or the new one, never half."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    partial.replace(path)
