"""Served CartPole sims for the tests of fleets: started as ``hud-pipelines serve`` would, stopped for sure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.dagster.support import REPO, SIMS

TOKEN = "fleet-test-token"


def serve_cartpole(*args: str, token: str = TOKEN, sims: Path = SIMS) -> tuple[subprocess.Popen[bytes], str]:
    """A served CartPole sim of 2 slots (its own process group) and its URL, once it listens."""
    return serve_sim(f"{sims}:cartpole", *args, token=token)


def serve_sim(factory: str, *args: str, token: str = TOKEN) -> tuple[subprocess.Popen[bytes], str]:
    """A served sim of 2 slots built by ``factory`` (its own process group) and its URL, once it listens."""
    command = [sys.executable, "-m", "hud_pipelines.sim", factory, "--num-envs", "2", "--token", token, *args]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, cwd=REPO
    )
    assert process.stdout is not None
    ready = json.loads(process.stdout.readline())
    return process, str(ready["url"])


def stop_served(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()
