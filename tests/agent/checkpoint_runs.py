"""Real training-run folders for the checkpoint and sweep tests, written by lerobot's own checkpoint code.

:func:`write_lerobot_run` calls lerobot-train's ``save_checkpoint`` and ``update_last_checkpoint`` (the
functions ``lerobot_train.py`` calls, with the same arguments) on a tiny ACT, so the folders are what a
real run leaves: ``config.json``, ``model.safetensors``, ``train_config.json``, both processors and their
state files, ``training_state/`` and the ``last`` link. Each step's weights come from its own seed, so
checkpoints differ in content. ACT reads state only (no image backbone to build or download); after the
lerobot import (a few seconds, once per process) a run of three checkpoints takes milliseconds.

torch and lerobot are imported inside the functions: tests that only need module files pay for torch alone.
A test module gets the session's run ``lerobot_run`` by importing its fixture function
(``from checkpoint_runs import lerobot_run_fixture``); a conftest that imports it shares one run among
all its modules.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

RUN_STEPS = (500, 1000, 1500)
"""The steps of the ``lerobot_run`` fixture."""
ENV_STATE_SIZE = 3
STATE_SIZE = 2
ACTION_SIZE = 2
TINY_ACT: dict[str, Any] = {
    "dim_model": 16,
    "n_heads": 2,
    "dim_feedforward": 32,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "chunk_size": 4,
    "n_action_steps": 2,
    "use_vae": False,
    "pretrained_backbone_weights": None,
    "push_to_hub": False,
    "device": "cpu",
}


@dataclass(frozen=True)
class LeRobotRun:
    """A run's output dir and, per step, the step folder lerobot-train wrote."""

    output_dir: Path
    step_dirs: dict[int, Path]

    @property
    def checkpoints_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def pretrained(self, step: int) -> Path:
        """The folder a policy of ``step`` loads from."""
        return self.step_dirs[step] / "pretrained_model"


@pytest.fixture(scope="session", name="lerobot_run")
def lerobot_run_fixture(tmp_path_factory: pytest.TempPathFactory) -> LeRobotRun:
    """One lerobot-train run at :data:`RUN_STEPS`, written once per session; copy it (:func:`copy_run`) to change it."""
    return write_lerobot_run(tmp_path_factory.mktemp("train") / "act_pusht", RUN_STEPS)


def copy_run(run: LeRobotRun, destination: Path) -> LeRobotRun:
    """``run`` copied under ``destination`` (links as links, mtimes kept)."""
    output_dir = destination / run.output_dir.name
    shutil.copytree(run.output_dir, output_dir, symlinks=True)
    steps = {step: output_dir / folder.relative_to(run.output_dir) for step, folder in run.step_dirs.items()}
    return LeRobotRun(output_dir, steps)


def tiny_act(seed: int) -> tuple[Any, Any, Any]:
    """An ACT policy with weights drawn from ``seed``, and its pre/post processors (normalising by fixed stats)."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import (
        get_policy_class,
        make_policy_config,  # pyright: ignore[reportUnknownVariableType]
        make_pre_post_processors,
    )
    from lerobot.utils.constants import ACTION, OBS_ENV_STATE, OBS_STATE

    config: Any = make_policy_config("act", **TINY_ACT)
    config.input_features = {
        OBS_STATE: PolicyFeature(type=FeatureType.STATE, shape=(STATE_SIZE,)),
        OBS_ENV_STATE: PolicyFeature(type=FeatureType.ENV, shape=(ENV_STATE_SIZE,)),
    }
    config.output_features = {ACTION: PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_SIZE,))}
    torch.manual_seed(seed)
    policy = get_policy_class("act")(config=config)
    sizes = {OBS_STATE: STATE_SIZE, OBS_ENV_STATE: ENV_STATE_SIZE, ACTION: ACTION_SIZE}
    stats = {key: {"mean": torch.full((n,), 0.5), "std": torch.full((n,), 2.0)} for key, n in sizes.items()}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    return policy, preprocessor, postprocessor


def write_lerobot_run(output_dir: Path, steps: Sequence[int], *, total_steps: int | None = None) -> LeRobotRun:
    """Checkpoint a tiny ACT at each of ``steps`` exactly as lerobot-train does (seeded by the step)."""
    import torch
    from lerobot.common.train_utils import (
        get_step_checkpoint_dir,
        save_checkpoint,  # pyright: ignore[reportUnknownVariableType]
        update_last_checkpoint,
    )
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig

    total = total_steps if total_steps is not None else max(steps)
    step_dirs: dict[int, Path] = {}
    for step in steps:
        policy, preprocessor, postprocessor = tiny_act(seed=step)
        train_config = TrainPipelineConfig(
            dataset=DatasetConfig(repo_id="local/tiny"),
            policy=policy.config,
            output_dir=output_dir,
            steps=total,
            save_freq=min(steps),
        )
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
        step_dir = get_step_checkpoint_dir(output_dir, total, step)
        save_checkpoint(
            checkpoint_dir=step_dir,
            step=step,
            cfg=train_config,
            policy=policy,
            optimizer=optimizer,
            preprocessor=preprocessor,
            postprocessor=postprocessor,
            num_processes=1,
            batch_size=train_config.batch_size,
        )
        update_last_checkpoint(step_dir)
        step_dirs[step] = step_dir
    return LeRobotRun(output_dir, step_dirs)


def write_torch_checkpoints(folder: Path, stems: Sequence[str], *, suffix: str = ".pt") -> list[Path]:
    """One ``torch.save``d state_dict of a small linear module per stem, each drawn from its own seed."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for seed, stem in enumerate(stems):
        torch.manual_seed(seed)
        file = folder / f"{stem}{suffix}"
        torch.save(torch.nn.Linear(3, 2).state_dict(), file)
        files.append(file)
    return files


def age(path: Path, seconds: float) -> None:
    """Move the mtimes of ``path`` and everything under it ``seconds`` into the past (a settled write)."""
    when = time.time() - seconds
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(entry, (when, when), follow_symlinks=False)
