"""A callable grader named by the valid example pipelines."""

from typing import Any


def long_enough(episode: dict[str, Any]) -> dict[str, Any]:
    """Success when the episode lasted at least 100 steps; the score is the number of steps."""
    steps = int(episode["steps"])
    return {"score": float(steps), "success": steps >= 100}
