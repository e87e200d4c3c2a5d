"""hud-pipelines."""
