"""Fixtures shared by the eval tests: a headless Chromium for the report pages."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium, for one test only: Playwright's sync API holds the thread's event loop while it runs."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup installs Debian's chromium for the browser tests)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()
