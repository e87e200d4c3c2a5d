"""Torch settings shared by the torch-backed policies; importing this module imports torch.

Sims step on the same cores as inference. With two intra-op threads on a loaded two-core machine a
small ACT forward swung between 119 ms and 1.3 s; one thread held it near 58 ms. So torch runs
single-threaded by default and a setting (``torch_threads``) overrides it.

A forward that every sim waits on (a lockstep refill, see :class:`~hud_pipelines.agent.batching.BatchedModel`)
is different: no sim steps while it runs, so it may use the cores the waiting sims would step on
(``lockstep_threads``; ``auto`` takes one per waiting sim plus the agent's own, at most the CPUs
this process may use). On two cores a random-weight ACT forward of 8 PushT rows takes ~210 ms on
one thread and ~130 ms on two; changing the thread count around a forward costs nothing measurable.
When other jobs already fill every core, the extra thread makes those forwards ~15% slower instead
(``bench/agent.md``); ``lockstep_threads: null`` keeps one thread throughout.

CUDA is used when present unless a device is named.

A torch-backed policy that samples takes each row's draws from a CPU generator of its own
(:func:`row_generators`), seeded from the policy's seed and the row's random stream, so what a row
draws is the same alone or in any batch, on CPU or CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Generator
from contextlib import AbstractContextManager
from typing import Literal

import torch

from hud_pipelines.agent.policy import BasePolicy, PolicyBatch
from hud_pipelines.errors import PolicyError

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


LockstepThreads = int | Literal["auto"] | None
"""Torch threads for a forward every sim waits on: a count, ``auto``, or ``None`` (no change)."""


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def lockstep_thread_count(setting: LockstepThreads, idle_sims: int) -> int | None:
    """Threads for a forward that ``idle_sims`` sims wait on (``None``: keep the current count)."""
    if setting is None or idle_sims < 1:
        return None
    if setting == AUTO:
        return min(available_cpus(), idle_sims + 1)
    if setting < 1:
        raise PolicyError(f"lockstep_threads must be >= 1, 'auto' or null, got {setting}")
    return setting


@contextlib.contextmanager
def lockstep_forward(setting: LockstepThreads, idle_sims: int) -> Generator[None]:
    """Raise torch's thread count for the body while ``idle_sims`` sims wait on it; never lowers it."""
    wanted = lockstep_thread_count(setting, idle_sims)
    current = torch.get_num_threads()
    if wanted is None or wanted <= current:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(current)


class LockstepForwards(BasePolicy):
    """The ``lockstep`` member the torch-backed policies share (see the module docstring)."""

    lockstep_threads: LockstepThreads = AUTO

    def lockstep(self, idle_sims: int) -> AbstractContextManager[None]:
        """Run the forward inside on the cores of ``idle_sims`` waiting sims (``lockstep_threads``)."""
        return lockstep_forward(self.lockstep_threads, idle_sims)


SEED_BOUND = 2**63
"""Torch seeds are drawn below this (``manual_seed`` takes any 64-bit value; 63 bits leave no sign doubt)."""


def row_generators(batch: PolicyBatch, seed: int) -> list[torch.Generator]:
    """One CPU torch generator per row, seeded from the row's numpy generator (:meth:`PolicyBatch.generators`).

    CPU generators, because the same seed gives other numbers on a CUDA generator: drawing on the CPU
    and moving the noise keeps an eval's samples the same on every device, for the price of copying a
    few kilobytes per forward.
    """
    return [torch.Generator().manual_seed(int(rng.integers(SEED_BOUND))) for rng in batch.generators(seed)]


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
