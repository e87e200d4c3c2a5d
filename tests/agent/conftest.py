"""Fixtures of the agent tests; nothing here may reach a hub."""

from __future__ import annotations

import os

import pytest
from agent_helpers import RecordingSink

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
