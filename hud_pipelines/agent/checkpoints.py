"""The checkpoints of training runs, found on disk for a sweep: which are complete, which are still coming, and why.

A sweep evaluates every checkpoint of a run as it appears, so discovery has to tell a finished checkpoint
from one that lerobot-train is still writing: a policy loaded from half a folder fails, or loads weights
beside processors of the wrong step. It reports both kinds, the pending ones with their reason, so a
sensor can log what it waits for and a CLI can say why a folder is not evaluated. Nothing here imports
torch or lerobot: a sensor polls this every few seconds.

What lerobot 0.6 writes (``lerobot/common/train_utils.py``: ``save_checkpoint``,
``get_step_checkpoint_dir``, ``update_last_checkpoint``; names from ``lerobot/utils/constants.py``):
``<output_dir>/checkpoints/<step>/pretrained_model/`` holds ``config.json``, ``model.safetensors``,
``train_config.json``, ``policy_preprocessor.json`` and ``policy_postprocessor.json`` (lerobot-train
always passes both processors) and one ``.safetensors`` state file per stateful processor step, named in
the processor's JSON under ``state_file``; ``<step>/training_state/`` beside it holds the optimizer and
RNG state (not needed to evaluate, so not required). ``<step>`` is zero-padded to at least six digits,
and ``checkpoints/last`` is a relative symlink to the newest step.

A source is a :class:`WatchedDirectory` (a run's output dir, its ``checkpoints/`` dir, a folder of
``save_pretrained`` folders, or with ``kind="torch"`` a folder of ``*.pt`` / ``*.pth`` module files) or
an :class:`ExplicitCheckpoint` (a label and a path). Paths are used as given: the caller resolves
relative ones against the pipeline file.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from hud_pipelines.agent.checkpoint_files import CONFIG_FILE, WEIGHTS_FILE, file_digest, files_by_name, pending_reason
from hud_pipelines.errors import CheckpointError
from hud_pipelines.spec.agent import label_problem, nested_label

CHECKPOINTS_DIR = "checkpoints"
"""lerobot's ``CHECKPOINTS_DIR``: the folder of step folders under a run's output dir."""
LAST_CHECKPOINT_LINK = "last"
"""lerobot's ``LAST_CHECKPOINT_LINK``: the symlink to the newest step folder."""
PRETRAINED_MODEL_DIR = "pretrained_model"
"""lerobot's ``PRETRAINED_MODEL_DIR``: the folder of a step that a policy loads from."""
TORCH_SUFFIXES = (".pt", ".pth")
DEFAULT_SETTLE_S = 5.0
"""How long a checkpoint's files must be unchanged before it counts as written (a sensor's default)."""
_DIGITS = re.compile(r"[0-9]+")
_TRAILING_DIGITS = re.compile(r"([0-9]+)$")


def label_named(asked: str, labels: Sequence[str]) -> str:
    """The label among ``labels`` that ``asked`` names: itself, or the one whose step is that number (``500`` is
    ``000500``, and ``100`` is ``step_00100``: a torch checkpoint's step ends its file name); else ``asked``."""
    numbered = _steps_named(asked, labels)
    return numbered[0] if len(numbered) == 1 else asked


def several_named(asked: str, labels: Sequence[str]) -> str:
    """`` ('2' is the step of several: r1/step_2, r2/step_2; give one's label)`` where the number ``asked`` is the
    step of several of ``labels`` (checkpoints of several runs), which is why it names none; else ``""``."""
    several = _steps_named(asked, labels)
    return f" ({asked!r} is the step of several: {', '.join(several)}; give one's label)" if len(several) > 1 else ""


def _steps_named(asked: str, labels: Sequence[str]) -> list[str]:
    if asked in labels or not asked.isdigit():
        return []
    return [label for label in labels if (step := _TRAILING_DIGITS.search(label)) and int(step[1]) == int(asked)]


CheckpointKind = Literal["lerobot", "torch"]
"""``lerobot``: ``save_pretrained`` folders; ``torch``: one module file (``torch.save``) per checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a sweep: what its results are filed under, and where its policy loads from.

    ``path`` is the folder a lerobot policy loads from (for lerobot-train's layout the ``pretrained_model``
    folder) or a torch module file; ``step`` the training step when the folder's name is numeric (a torch
    file's stem ends in a number); ``run`` the training run's name when the sweep watches several runs.
    """

    label: str
    path: Path
    step: int | None = None
    run: str | None = None

    def content_hash(self) -> str:
        """sha256 over the checkpoint's files (relative names and bytes, in sorted order).

        The same bytes give the same hash wherever the folder lives, so a copied or moved run is known
        to be the same checkpoint; a torch file hashes its bytes alone (its name is the label's business).
        """
        digest = hashlib.sha256()
        try:
            for name, file in files_by_name(self.path):
                digest.update(f"{name}\0{file_digest(file)}\n".encode())
        except OSError as exc:
            raise CheckpointError(f"cannot hash checkpoint {self.label!r} at {self.path}: {exc}") from exc
        return digest.hexdigest()


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint that is not evaluated yet, and why (``missing model.safetensors``, ``still being written``)."""

    checkpoint: Checkpoint
    reason: str


@dataclass(frozen=True)
class Discovery:
    """What the sources hold now, each tuple ordered by (run, step, label); unnumbered before numbered."""

    complete: tuple[Checkpoint, ...]
    pending: tuple[PendingCheckpoint, ...]


@dataclass(frozen=True)
class WatchedDirectory:
    """A directory whose checkpoints are found anew on every discovery (they appear while a run trains)."""

    path: Path
    kind: CheckpointKind = "lerobot"


@dataclass(frozen=True)
class ExplicitCheckpoint:
    """One checkpoint named by the user: a ``save_pretrained`` folder (or a step folder) or a torch file."""

    label: str
    path: Path


CheckpointSource = WatchedDirectory | ExplicitCheckpoint


@dataclass(frozen=True)
class _Found:
    checkpoint: Checkpoint
    via_symlink: bool


class NamedCheckpoint(Protocol):
    """A checkpoint named by hand in a pipeline file (``{label, path}``)."""

    @property
    def label(self) -> str: ...
    @property
    def path(self) -> str: ...


def sources_of(
    listed: str | Sequence[str | NamedCheckpoint], kind: CheckpointKind, resolve: Callable[[str], Path]
) -> list[CheckpointSource]:
    """The sources a pipeline's ``checkpoints:`` value names, paths made absolute by ``resolve``."""
    items = [listed] if isinstance(listed, str) else list(listed)
    return [
        WatchedDirectory(resolve(item), kind)
        if isinstance(item, str)
        else ExplicitCheckpoint(item.label, resolve(item.path))
        for item in items
    ]


def discover_checkpoints(sources: Sequence[CheckpointSource], *, settle_s: float = DEFAULT_SETTLE_S) -> Discovery:
    """The complete and the pending checkpoints of ``sources``, each once, ordered.

    A checkpoint is complete when every file it needs is there and none of its files or folders changed
    in the last ``settle_s`` seconds (0: as soon as the files are there). Raises :class:`CheckpointError`
    for a source that cannot hold checkpoints (see the module docstring); an empty watched folder is
    such an error, a folder still being written is not.
    """
    if not sources:
        raise CheckpointError("no checkpoint source: name a directory to watch or (label, path) entries")
    if settle_s < 0:
        raise CheckpointError(f"settle_s must be >= 0 seconds, got {settle_s}")
    watched = [s for s in sources if isinstance(s, WatchedDirectory)]
    runs = run_names(sources)
    found: list[_Found] = []
    for source, run in zip(watched, runs or [None] * len(watched), strict=True):
        found += [_in_run(f, run) for f in _listed(source)]
    found += [_explicit(s) for s in sources if isinstance(s, ExplicitCheckpoint)]
    checkpoints = sorted(_without_symlinked_duplicates(found), key=sweep_order(runs))
    _refuse_bad_labels(checkpoints)
    complete: list[Checkpoint] = []
    pending: list[PendingCheckpoint] = []
    for checkpoint in checkpoints:
        reason = pending_reason(checkpoint.path, settle_s)
        if reason is None:
            complete.append(checkpoint)
        else:
            pending.append(PendingCheckpoint(checkpoint, reason))
    return Discovery(tuple(complete), tuple(pending))


# -- listing -------------------------------------------------------------------------------------------


def _listed(source: WatchedDirectory) -> list[_Found]:
    path = source.path
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint directory {path} is not a directory (name a single checkpoint as a (label, path) entry)"
        )
    try:
        found = _torch_files(path) if source.kind == "torch" else _lerobot_folders(path)
    except OSError as exc:
        raise CheckpointError(f"cannot list checkpoint directory {path}: {exc}") from exc
    if not found:
        raise CheckpointError(_nothing_in(path, source.kind))
    return found


def _lerobot_folders(path: Path) -> list[_Found]:
    """Step folders of lerobot-train's layout, or else every child folder holding policy files."""
    if (path / PRETRAINED_MODEL_DIR).is_dir():  # one step folder: itself, named by its step (not its policy folder's)
        return [_found(path.name, path / PRETRAINED_MODEL_DIR, path)]
    steps = _steps_root(path)
    if steps is not None:
        return [_found(child.name, child / PRETRAINED_MODEL_DIR, child) for child in _child_dirs(steps)]
    return [_found(child.name, child, child) for child in _child_dirs(path) if _holds_policy_files(child)]


def _steps_root(path: Path) -> Path | None:
    """The folder of step folders when ``path`` is a run's output dir or its ``checkpoints/`` dir."""
    if (path / CHECKPOINTS_DIR).is_dir():
        return path / CHECKPOINTS_DIR
    if path.name == CHECKPOINTS_DIR or any((c / PRETRAINED_MODEL_DIR).is_dir() for c in _child_dirs(path)):
        return path
    return None


def _torch_files(path: Path) -> list[_Found]:
    files = [c for c in sorted(path.iterdir()) if _visible(c) and c.suffix.lower() in TORCH_SUFFIXES and c.is_file()]
    return [_found(file.stem, file, file) for file in files]


def _found(label: str, checkpoint_path: Path, entry: Path) -> _Found:
    """A checkpoint named after its folder or file ``entry``, noting whether ``entry`` is a symlink."""
    return _Found(Checkpoint(label, checkpoint_path, step=_step_of(entry)), via_symlink=entry.is_symlink())


def _child_dirs(path: Path) -> list[Path]:
    return [child for child in sorted(path.iterdir()) if _visible(child) and child.is_dir()]


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _holds_policy_files(folder: Path) -> bool:
    return (folder / CONFIG_FILE).exists() or (folder / WEIGHTS_FILE).exists()


def _step_of(entry: Path) -> int | None:
    """A folder's step when its whole name is a number; a file's when its stem ends in one."""
    if entry.is_file():
        match = _TRAILING_DIGITS.search(entry.stem)
        return int(match.group(1)) if match else None
    return int(entry.name) if _DIGITS.fullmatch(entry.name) else None


def _nothing_in(path: Path, kind: CheckpointKind) -> str:
    """Why ``path`` holds no checkpoint of ``kind``, naming the other kind where the folder holds its files."""
    if kind == "torch":
        message = f"no checkpoint in {path}: expected *.pt or *.pth module files (kind torch: one checkpoint per file)"
        if _lerobot_folders(path):
            message += " (it holds lerobot policy folders: a lerobot policy's checkpoints are `kind: lerobot`)"
        return message
    message = (
        f"no checkpoint in {path}: expected {path}/{CHECKPOINTS_DIR}/<step>/{PRETRAINED_MODEL_DIR}/ as lerobot-train "
        f"writes it, or folders holding {CONFIG_FILE} and {WEIGHTS_FILE}"
    )
    if _holds_policy_files(path):
        message += f" ({path} is itself a policy folder: name it as a (label, path) entry)"
    elif _torch_files(path):
        message += " (it holds *.pt / *.pth files: a torch module's state_dicts are `kind: torch`)"
    return message


def _explicit(entry: ExplicitCheckpoint) -> _Found:
    if not entry.path.exists():
        raise CheckpointError(
            f"checkpoint {entry.label!r}: {entry.path} does not exist (expected a folder holding {CONFIG_FILE} and "
            f"{WEIGHTS_FILE}, a lerobot-train step folder, or a *.pt / *.pth file)"
        )
    if (entry.path / PRETRAINED_MODEL_DIR).is_dir():
        return _Found(Checkpoint(entry.label, entry.path / PRETRAINED_MODEL_DIR, _step_of(entry.path)), False)
    named = entry.path.parent if entry.path.name == PRETRAINED_MODEL_DIR else entry.path
    return _Found(Checkpoint(entry.label, entry.path, _step_of(named)), via_symlink=False)


# -- several runs, duplicates, order ---------------------------------------------------------------------


def run_names(sources: Sequence[CheckpointSource]) -> list[str]:
    """The name of each watched training run, in the order the sources list them; ``[]`` for one run (its
    checkpoints carry no run). Runs of the same directory name take as many parent folders as tell them apart."""
    watched = [s for s in sources if isinstance(s, WatchedDirectory)]
    return _run_names(watched) if len(watched) > 1 else []


def sweep_order(runs: Sequence[str]) -> Callable[[_Stepped], tuple[int, str, bool, int, str]]:
    """The order of a sweep's checkpoints: by run as the YAML lists them, then by step, then by label.

    A checkpoint of no step (a ``best.pt`` or ``final.pt`` beside ``step_*.pt``) has no place in training
    order: it comes first, so that the run ends at its highest step, the candidate the checks judge. Runs the
    YAML no longer lists (results of earlier runs of the sweep) come first, by name, then checkpoints of no
    run (explicit entries, or the one run listed): the last run listed holds the candidate, never a run
    dropped from the YAML."""
    position = {run: index for index, run in enumerate(runs)}

    def key(checkpoint: _Stepped) -> tuple[int, str, bool, int, str]:
        run = checkpoint.run
        placed = -1 if run is None else position.get(run, -2)
        return (placed, run or "", checkpoint.step is not None, checkpoint.step or 0, checkpoint.label)

    return key


class _Stepped(Protocol):
    @property
    def label(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def run(self) -> str | None: ...


def _run_names(watched: Sequence[WatchedDirectory]) -> list[str]:
    directories = [_run_directory(source.path) for source in watched]
    for directory, count in Counter(directories).items():
        if count > 1:
            raise CheckpointError(f"the training run {directory} is watched twice")
    parts = [directory.parts[1:] for directory in directories]
    depth = [1] * len(parts)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth, strict=True)]
        clashes = {name for name, count in Counter(names).items() if count > 1}
        if not clashes:
            return names
        depth = [d + 1 if name in clashes else d for name, d in zip(names, depth, strict=True)]


def _run_directory(path: Path) -> Path:
    """The run a watched folder belongs to: its own output dir, or the parent of a ``checkpoints/`` dir."""
    path = path.resolve()
    if path.name == CHECKPOINTS_DIR and not (path / CHECKPOINTS_DIR).is_dir():
        return path.parent
    return path


def _in_run(found: _Found, run: str | None) -> _Found:
    if run is None:
        return found
    c = found.checkpoint
    return _Found(Checkpoint(f"{run}/{c.label}", c.path, c.step, run), found.via_symlink)


def _without_symlinked_duplicates(found: Sequence[_Found]) -> list[Checkpoint]:
    """Drop symlinks (``last``) that resolve to a checkpoint listed already: one checkpoint, one evaluation."""
    seen = {f.checkpoint.path.resolve() for f in found if not f.via_symlink}
    kept: list[Checkpoint] = []
    for f in found:
        if f.via_symlink:
            target = f.checkpoint.path.resolve()
            if target in seen:
                continue
            seen.add(target)
        kept.append(f.checkpoint)
    return kept


def _refuse_bad_labels(checkpoints: Sequence[Checkpoint]) -> None:
    """Results are filed under labels, so two checkpoints (or one named twice) under one label are refused, and so is
    a label that cannot be a folder of results (:func:`~hud_pipelines.spec.agent.label_problem`: a folder ``a|b``)."""
    by_label: dict[str, Path] = {}
    for checkpoint in checkpoints:
        if (problem := label_problem(checkpoint.label)) is not None:
            raise CheckpointError(f"{problem} (the checkpoint at {checkpoint.path})")
        if checkpoint.label in by_label:
            raise CheckpointError(
                f"checkpoint label {checkpoint.label!r} is given twice, for {by_label[checkpoint.label]} and "
                f"{checkpoint.path}: labels must be unique within a sweep"
            )
        by_label[checkpoint.label] = checkpoint.path
    if (nested := nested_label(by_label)) is not None:  # its results' folder would hold the other's
        raise CheckpointError(f"checkpoint label {nested[0]!r} is a folder above {nested[1]!r}: rename one of them")


# -- completeness ----------------------------------------------------------------------------------------
