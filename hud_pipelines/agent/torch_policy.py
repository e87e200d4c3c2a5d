"""A ``torch.nn.Module`` behind the policy seam (importing this module imports torch).

The module is called as ``module(observation)`` where ``observation`` maps every contract
observation feature to a float32 tensor ``[B, ...]`` on the policy's device (cameras keep their
``HWC`` layout and 0-255 range: the module decides how to read them). It returns ``[B, T, A]`` or
``[B, A]`` actions in contract order.
"""

from __future__ import annotations

import inspect
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from hud_pipelines.agent.checkpoint_files import torch_file_problem
from hud_pipelines.agent.policy import Actions, PolicyBatch, as_chunks
from hud_pipelines.agent.torch_runtime import (
    LockstepForwards,
    resolve_device,
    to_tensor,
)
from hud_pipelines.contract import Contract
from hud_pipelines.errors import PolicyError
from hud_pipelines.spec.agent import TorchPolicyConfig
from hud_pipelines.targets import load_target


class TorchModulePolicy(LockstepForwards):
    """Runs a module in inference mode and returns its actions as numpy chunks."""

    def __init__(self, module: torch.nn.Module, contract: Contract, *, device: torch.device, name: str = "") -> None:
        self.module = module.to(device).eval()
        self.device = device
        self.width = contract.action.size
        self.name = name or type(module).__qualname__
        declared = getattr(module, "horizon", None)
        self.horizon: int | None = declared if isinstance(declared, int) and declared >= 1 else None

    @classmethod
    def from_config(
        cls,
        config: TorchPolicyConfig,
        contract: Contract,
        *,
        base_dir: Path,
    ) -> TorchModulePolicy:
        device = resolve_device(config.device)
        target = load_target(config.target, base_dir=base_dir, error=PolicyError)
        if not (inspect.isclass(target) and issubclass(target, torch.nn.Module)):
            raise PolicyError(f"torch policy target {config.target!r} is not a torch.nn.Module class")
        try:
            module = target(**config.args)
        except TypeError as exc:
            raise PolicyError(f"torch policy {config.target!r} cannot be built with args {config.args}: {exc}") from exc
        if config.checkpoint is not None:
            load_checkpoint(module, _resolve(config.checkpoint, base_dir), device)
        return cls(module, contract, device=device, name=config.target)

    def infer(self, batch: PolicyBatch) -> Actions:
        inputs = {k: to_tensor(v, self.device, dtype=torch.float32) for k, v in batch.observation.items()}
        with torch.inference_mode():
            output: Any = self.module(inputs)
        if not isinstance(output, torch.Tensor):
            raise PolicyError(f"torch policy {self.name} returned a {type(output).__name__}, expected a tensor")
        actions = cast(npt.NDArray[np.float32], output.detach().to("cpu", torch.float32).numpy())
        return as_chunks(actions, batch.size, self.width, source=f"torch policy {self.name}")


WEIGHTS_UNPICKLER = "WeightsUnpickler error:"
"""Where torch's refusal of a file that is no plain ``state_dict`` says why."""
UNSUPPORTED_GLOBAL = "Unsupported global"
"""torch's cause when the file pickles objects (a whole module), whichever format it was saved in."""


def _resolve(path_text: str, base_dir: Path) -> Path:
    path = Path(path_text)
    return path if path.is_absolute() else base_dir / path


def _load_error(exc: Exception) -> str:
    """torch's reason in a line: a weights-only refusal is a page of advice around one line of cause."""
    text = str(exc)
    cause = text.split(WEIGHTS_UNPICKLER, 1)[1].strip().split("\n\n", 1)[0] if WEIGHTS_UNPICKLER in text else ""
    if not cause:
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if UNSUPPORTED_GLOBAL in cause:  # pickled objects: a whole module saved, not its state_dict
        named = cause.split(" Please ", 1)[0].strip()  # torch's advice to allow the class is not ours to give
        return f"{named} It holds pickled objects, not only tensors: save module.state_dict() instead"
    return f"torch.load (weights only): {cause.strip()}"


def load_checkpoint(module: torch.nn.Module, path: Path, device: torch.device) -> None:
    """Load a ``state_dict`` saved with ``torch.save``; tensors only (no pickled code runs)."""
    if not path.is_file():
        raise PolicyError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:
        why = _load_error(exc)
        seen = torch_file_problem(path)  # empty, cut short, or of neither format: what validate says too
        if UNSUPPORTED_GLOBAL in why:  # a save of a whole module: its pickled objects are the cause
            pass
        elif seen is not None:
            why = seen
        elif not zipfile.is_zipfile(path):
            why = f"it is not a file torch.save writes (no zip archive, nor a legacy one torch reads: {why})"
        raise PolicyError(f"checkpoint {path} cannot be read as a state_dict: {why}") from exc
    if not isinstance(state, dict):
        raise PolicyError(f"checkpoint {path} holds a {type(state).__name__}, expected a state_dict")
    try:
        module.load_state_dict(state)  # pyright: ignore[reportUnknownArgumentType]
    except RuntimeError as exc:  # torch says which tensors on lines of their own: one line, so every summary has them
        mismatches = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise PolicyError(f"checkpoint {path} does not fit {type(module).__qualname__}: {mismatches}") from exc
