"""The files a pipeline's targets read their code and weights from, and their digests.

A result's numbers depend on the code a pipeline names (its sim factory, scripted controller or
torch module, callable graders) and on the weights a policy loads, yet the YAML holds only their
names. Their digests are part of the environment fingerprint (:mod:`hud_pipelines.eval.provenance`):
after an edit of ``my_env.py`` or new weights under the same file name, the earlier results show
as another environment's (``not_run``) and a sweep evaluates its checkpoints again, instead of one
table holding results of two versions of the code.

Followed: each target's own file and every file of the project that its code imports, through
their own imports and relative ones (:func:`~hud_pipelines.targets.target_sources`), and the files a
spawned sim reads besides its code, as ``sim.data_files`` lists them (:mod:`hud_pipelines.spec.sim_files`);
not followed: the standard library and installed packages, and code only a sim's own interpreter can find (its
packages' versions are recorded instead). A sweep's checkpoints are identified by content already
(:attr:`PipelineSpec.checkpoint_hash`).
"""

from __future__ import annotations

import os
from pathlib import Path

from hud_pipelines.agent.checkpoint_files import files_by_name
from hud_pipelines.agent.checkpoints import Checkpoint
from hud_pipelines.errors import CheckpointError
from hud_pipelines.spec.agent import LeRobotPolicyConfig, PolicyConfig, ScriptedPolicyConfig, TorchPolicyConfig
from hud_pipelines.spec.grading import CallableGrader
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.sim_files import MAX_DATA_FILES, expand
from hud_pipelines.targets import CODE_DIGEST_CHARS, code_digest, target_sources

_WEIGHTS: dict[tuple[tuple[str, int, int], ...], str] = {}
"""Each file's (path, size, mtime) -> digest: a policy's weights are hashed once per version in a process."""


def digests(spec: PipelineSpec, outputs_root: Path | None = None) -> dict[str, str]:
    """Path -> short sha256 of every code file the pipeline's targets read, of a single policy's weights, and of the
    files ``sim.data_files`` lists (none below ``outputs_root``, where the runs write).

    Paths are relative to the pipeline's folder: the same project checked out or mounted elsewhere has
    the same sources (its results stay current there).
    """
    targets = [spec.factory] if spec.sim.spawned and spec.factory else []
    policy = spec.resolved_agent().policy
    if isinstance(policy, ScriptedPolicyConfig | TorchPolicyConfig):
        targets.append(policy.target)
    targets += [grader.target for grader in spec.resolved_graders() if isinstance(grader, CallableGrader)]
    found: dict[str, str] = {}
    for target in targets:
        for file in target_sources(target, spec.base_dir):
            found[_relative(file, spec)] = code_digest(file)
    weights = _weights_path(spec, policy)
    if weights is not None:
        found[_relative(weights, spec)] = _weights_digest(weights)
    return found | data_file_digests(spec, outputs_root)


def data_file_digests(spec: PipelineSpec, outputs_root: Path | None = None) -> dict[str, str]:
    """The digests of the files ``sim.data_files`` names now (none below ``outputs_root``); a module among them with
    the project's files it imports, as a target's (the sim imports it by name: no import of its code names it)."""
    found: dict[str, str] = {}
    for pattern in spec.sim.data_files if spec.sim.spawned else ():
        outside = Path(pattern).expanduser().is_absolute()  # named where it lies, wherever the project moves
        for file in expand([pattern], spec.base_dir, leaving_out=outputs_root)[:MAX_DATA_FILES]:
            read = target_sources(f"{file}:_", spec.base_dir) if file.suffix == ".py" else [file]
            for path in read or [file]:
                name = str(path) if outside else _relative(path, spec)
                found[name] = code_digest(path) if path.suffix == ".py" else _weights_digest(path)
    return found


def digested_again(recorded: dict[str, str], spec: PipelineSpec, outputs_root: Path | None = None) -> dict[str, str]:
    """The files of ``recorded`` (a run's :func:`digests`) digested as they are now: the very files that run read,
    those of a policy its run configuration named instead of the YAML's included (a file gone is ``unreadable``);
    and the files ``sim.data_files`` names now (one added to a listed folder, a link pointed elsewhere), as the
    next run would digest them."""
    found: dict[str, str] = {}
    for name in recorded:
        path = spec.base_dir.resolve() / name
        found[name] = code_digest(path) if path.suffix == ".py" else _weights_digest(path)
    return found | data_file_digests(spec, outputs_root)


def _relative(path: Path, spec: PipelineSpec) -> str:
    return os.path.relpath(path, spec.base_dir.resolve())


def _weights_path(spec: PipelineSpec, policy: PolicyConfig) -> Path | None:
    """A single policy's local weights (a sweep's members are hashed by the sweep itself)."""
    if spec.is_sweep or spec.checkpoint_hash is not None:
        return None
    where = policy.checkpoint if isinstance(policy, TorchPolicyConfig) else None
    if isinstance(policy, LeRobotPolicyConfig):
        where = policy.path
    path = None if where is None else Path(where)
    return path if path is not None and path.exists() else None


def _weights_digest(path: Path) -> str:
    try:
        key = tuple((str(file), (stat := file.stat()).st_size, stat.st_mtime_ns) for _, file in files_by_name(path))
        if key not in _WEIGHTS:
            _WEIGHTS[key] = Checkpoint(path.name, path).content_hash()[:CODE_DIGEST_CHARS]
    except (OSError, CheckpointError):
        return "unreadable"  # loading the policy reports it
    return _WEIGHTS[key]
