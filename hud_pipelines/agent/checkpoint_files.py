"""Whether a checkpoint is completely written, and what its bytes are.

lerobot-train writes a checkpoint file by file; a sweep must not load half of one (a policy fails, or
loads weights beside processors of the wrong step). A folder counts as complete when every file a
policy loads is there, nothing under it changed for ``settle_s`` seconds, and no safetensors or zip
file is shorter than its own header says. Its content hash covers names and bytes, never the path.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
"""lerobot's ``POLICY_PREPROCESSOR_DEFAULT_NAME`` / ``POLICY_POSTPROCESSOR_DEFAULT_NAME`` as saved."""
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, *PROCESSOR_FILES)
"""What a lerobot checkpoint needs to load, besides the state files its processors name."""
HASH_CHUNK_BYTES = 1 << 20
ZIP_MAGIC = b"PK\x03\x04"
"""How a file ``torch.save`` writes (a zip archive) begins."""
PICKLE_PROTO = b"\x80"
"""How a legacy ``torch.save`` file (a pickle stream) begins."""

SETTLING = "still being written"
"""The reason of a checkpoint whose files are all there but changed within the settle time."""


def policy_folder_problem(path: Path) -> str | None:
    """Why ``path`` is no pretrained lerobot policy folder (what a policy's ``path`` names), naming the folder meant
    where it is a step folder or a whole run of ``lerobot-train``; ``None`` when it holds a config."""
    if (path / CONFIG_FILE).is_file():
        return None
    if (path / "pretrained_model" / CONFIG_FILE).is_file():
        return f"{path} is a lerobot-train step folder: name its policy, {path / 'pretrained_model'}"
    if (path / "checkpoints").is_dir():
        return (
            f"{path} is a lerobot-train run: name one checkpoint ({path / 'checkpoints'}/<step>/pretrained_model), "
            f"or evaluate every checkpoint with 'checkpoints: {path}' (a sweep)"
        )
    return f"{path} is not a pretrained LeRobot policy folder (no {CONFIG_FILE})"


def pending_reason(path: Path, settle_s: float) -> str | None:
    """Why the checkpoint at ``path`` cannot be evaluated yet, or ``None`` when it is complete."""
    try:
        if path.is_file():
            return _torch_file_reason(path, settle_s)
        return _folder_reason(path, settle_s)
    except OSError as exc:  # a file removed or rewritten while we looked: look again next time
        return f"cannot be read ({exc})"


def _folder_reason(path: Path, settle_s: float) -> str | None:
    """Missing files first, then recent changes (a writer at work), then files shorter than their headers say."""
    if not path.is_dir():
        return f"missing {path.name}/"
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    settling = _settling(path, settle_s)
    if settling is not None:
        return settling
    unreadable = _json_problem(path / CONFIG_FILE)
    if unreadable is not None:
        return unreadable
    state_files: list[str] = []
    for name in PROCESSOR_FILES:
        named = _processor_state_files(path / name)
        if isinstance(named, str):
            return named
        state_files += named
    missing = [name for name in state_files if not (path / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    for name in (WEIGHTS_FILE, *state_files):
        truncated = _safetensors_problem(path / name)
        if truncated is not None:
            return truncated
    return None


def _settling(path: Path, settle_s: float) -> str | None:
    """``still being written`` while the newest change under ``path`` (files and folders) is recent.

    Folders count too: a copy that keeps its source's mtimes (``cp -p``, ``shutil.copy2``) still touches
    the folder it adds files to.
    """
    if settle_s <= 0:
        return None
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    newest = max(entry.stat().st_mtime for entry in entries)
    age = time.time() - newest
    if age >= settle_s:
        return None
    return f"{SETTLING} (changed {max(age, 0.0):.1f} s ago; complete after {settle_s:g} s without change)"


def _torch_file_reason(path: Path, settle_s: float) -> str | None:
    if path.stat().st_size == 0:
        return f"{path.name} is empty"
    settling = _settling(path, settle_s)
    if settling is not None:
        return settling
    return _cut_short(path, _head(path))


def torch_file_problem(path: Path) -> str | None:
    """What makes ``path`` no file ``torch.save`` writes, seen from its bytes alone (no torch import): it is
    empty, a zip archive cut short, or neither a zip archive nor a legacy save (which begins with a pickle's
    protocol opcode). Torch's own reading may still refuse it (pickled objects, not tensors)."""
    if path.stat().st_size == 0:
        return f"{path.name} is empty"
    head = _head(path)
    if head != ZIP_MAGIC and head[:1] != PICKLE_PROTO:
        return f"{path.name} is not a file torch.save writes (neither a zip archive nor a legacy pickle)"
    return _cut_short(path, head)


def _head(path: Path) -> bytes:
    with path.open("rb") as stream:
        return stream.read(4)


def _cut_short(path: Path, head: bytes) -> str | None:
    if head == ZIP_MAGIC and not zipfile.is_zipfile(path):
        return f"{path.name} is truncated (its zip archive has no end record)"
    return None


def _json_problem(file: Path) -> str | None:
    """Why a JSON file of a checkpoint cannot be read (cut short, edited by hand), or ``None``: said here, named,
    instead of as the bare ``JSONDecodeError`` of loading the policy."""
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"{file.name} is not JSON ({exc})"
    return None


def _processor_state_files(processor: Path) -> list[str] | str:
    """The state files a processor's JSON names, or why the JSON cannot be read."""
    try:
        steps: Any = json.loads(processor.read_text(encoding="utf-8"))["steps"]
        return [str(step["state_file"]) for step in steps if "state_file" in step]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{processor.name} is not a processor pipeline ({type(exc).__name__}: {exc})"


def _safetensors_problem(file: Path) -> str | None:
    """Whether a safetensors file is shorter than its own header says (a writer that died mid-file)."""
    size = file.stat().st_size
    try:
        with file.open("rb") as stream:
            header_size = int.from_bytes(stream.read(8), "little")
            if 8 + header_size > size:
                return f"{file.name} is truncated ({size} bytes, its header alone takes {8 + header_size})"
            header: Any = json.loads(stream.read(header_size))
        tensors = [entry for key, entry in header.items() if key != "__metadata__"]
        expected = 8 + header_size + max((int(entry["data_offsets"][1]) for entry in tensors), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return f"{file.name} is not a safetensors file ({type(exc).__name__}: {exc})"
    if size < expected:
        return f"{file.name} is truncated ({size} of {expected} bytes)"
    return None


# -- hashing -----------------------------------------------------------------------------------------------


def files_by_name(path: Path) -> Iterator[tuple[str, Path]]:
    if path.is_file():
        yield "", path
        return
    if not path.is_dir():
        raise FileNotFoundError(f"no such folder or file: {path}")
    named = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
    yield from named


def file_digest(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        while chunk := stream.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
