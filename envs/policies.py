"""Tiny torch modules for the ``torch`` policy kind (tests and smoke pipelines).

Importing this module imports torch; nothing in the sim child imports it.
"""

from __future__ import annotations

import torch
from torch import nn


class LinearChunkPolicy(nn.Module):
    """A linear map from the ``state`` feature to a chunk of ``chunk_size`` actions, ``[B, T, A]``."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int = 1, key: str = "state") -> None:
        super().__init__()
        self.key = key
        self.chunk_size = chunk_size
        self.action_dim = action_dim
        self.linear = nn.Linear(state_dim, action_dim * chunk_size)

    def forward(self, observation: dict[str, torch.Tensor]) -> torch.Tensor:
        state = observation[self.key].reshape(observation[self.key].shape[0], -1)
        return self.linear(state).reshape(-1, self.chunk_size, self.action_dim)


class CartPoleTorchPD(nn.Module):
    """The CartPole PD law as a module whose gains are its weights (so a checkpoint changes behaviour)."""

    def __init__(self) -> None:
        super().__init__()
        self.gains = nn.Parameter(torch.zeros(4))

    def forward(self, observation: dict[str, torch.Tensor]) -> torch.Tensor:
        return (observation["state"] @ self.gains > 0).to(torch.float32)[:, None]
