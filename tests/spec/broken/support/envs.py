"""A factory module named by broken pipelines through a file-relative target."""

from typing import Any


def make_env(size: int = 3) -> Any:
    """Build a CartPole env; ``size`` only exists so the signature has a build argument."""
    import gymnasium as gym

    return gym.make("CartPole-v1")
