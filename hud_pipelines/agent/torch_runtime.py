"""Torch settings shared by the torch-backed policies; importing this module imports torch.

Sims step on the same cores as inference. With two intra-op threads on a loaded two-core machine a
small ACT forward swung between 119 ms and 1.3 s; one thread held it near 58 ms. So torch runs
single-threaded by default and a setting (``torch_threads``) overrides it. CUDA is used when
present unless a device is named.
"""

from __future__ import annotations

import logging

import torch

from hud_pipelines.agent.policy import PolicyError

log = logging.getLogger(__name__)
AUTO = "auto"


def configure_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count (``None`` leaves torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise PolicyError(f"torch_threads must be >= 1 or null, got {threads}")
    if torch.get_num_threads() != threads:
        log.debug("torch intra-op threads: %d -> %d", torch.get_num_threads(), threads)
        torch.set_num_threads(threads)


def resolve_device(spec: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; anything else must name an available device."""
    if spec == AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise PolicyError(f"unknown torch device {spec!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PolicyError(f"device {spec!r} was asked for, but CUDA is not available here; use 'auto' or 'cpu'")
    return device


def to_tensor(array: object, device: torch.device, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor on ``device`` from a numpy array; read-only or non-contiguous arrays are copied first."""
    import numpy as np

    values = np.asarray(array)
    if not values.flags.writeable or not values.flags.c_contiguous:
        values = np.ascontiguousarray(values).copy()
    tensor = torch.from_numpy(values)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor.to(device, non_blocking=True)
