"""Policies that misbehave on purpose, for the fault matrix (scripted targets ``tests.eval.faulty_policies:*``).

Each targets the rows of one seed: the third entry of ``FaultyEnv``'s observation is its slot's seed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt


class Faulty:
    """Zero actions, except for rows of ``seed``: ``raise``, ``nan`` (a non-finite row) or ``sleep``."""

    def __init__(self, mode: str, seed: int, seconds: float = 0.0) -> None:
        self.mode = mode
        self.seed = seed
        self.seconds = seconds

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        state = observation["state"]
        actions = np.zeros((state.shape[0], 1), dtype=np.float32)
        hit = state[:, 2] == self.seed
        if hit.any():
            match self.mode:
                case "raise":
                    raise RuntimeError(f"the policy failed on purpose for seed {self.seed}")
                case "nan":
                    actions[hit] = np.nan
                case "sleep":
                    time.sleep(self.seconds)
                case _:
                    raise ValueError(self.mode)
        return actions


class RefusesToBuild:
    """A policy whose constructor raises (a missing file of its own, a bad argument)."""

    def __init__(self) -> None:
        raise FileNotFoundError("the policy's own weights are missing")


class AlwaysRaises:
    """A policy whose every forward raises: every episode errors, so the eval has no answer at all."""

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        del observation
        raise RuntimeError("the policy failed on purpose in every forward")


class Sleepy:
    """Zero actions after sleeping ``seconds`` in every forward (a policy that hangs)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        time.sleep(self.seconds)
        rows = next(iter(observation.values())).shape[0]
        return np.zeros((rows, 1), dtype=np.float32)


def nan_for_seed_3(episode: dict[str, Any]) -> dict[str, Any]:
    """A callable grader whose score is NaN for the episode of seed 3 (the return, success from 5, otherwise)."""
    score = float("nan") if episode["seed"] == 3 else float(episode["total_reward"])
    return {"score": score, "success": episode["total_reward"] >= 5}


def even_seed(episode: dict[str, Any]) -> bool:
    """A callable grader: the episodes of even seeds succeed."""
    return episode["seed"] % 2 == 0


class RaisesInReset:
    """Zero actions, but its ``reset`` (before each instance's episodes) raises."""

    def reset(self) -> None:
        raise RuntimeError("the policy's reset failed on purpose")

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        rows = next(iter(observation.values())).shape[0]
        return np.zeros((rows, 1), dtype=np.float32)


class ExitsToBuild:
    """A policy whose constructor calls ``sys.exit()``, as a script that finds no weights does."""

    def __init__(self) -> None:
        raise SystemExit(2)  # what sys.exit(2) raises
