"""Screenshot report pages in headless Chromium (Debian's, which scripts/setup installs): the README's pictures.

    .venv/bin/python scripts/screenshot.py outputs/pusht_act/report.html docs/images/pusht_report.png

Each page is opened from the file system, given time to load its videos and draw its plots, and
captured at a fixed viewport (the top of the page: summary, tables, the first episode cards).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

VIEWPORT = {"width": 1280, "height": 1100}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="a report.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--full", action="store_true", help="the whole page, not the first screen")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("chromium is not installed (scripts/setup installs it)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(args.page.resolve().as_uri())
        tab.wait_for_load_state("load")
        tab.wait_for_function("[...document.querySelectorAll('video')].every(v => v.readyState >= 2)", timeout=30_000)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(args.out), full_page=args.full)
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
