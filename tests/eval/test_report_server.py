"""``report --serve``'s file server answers byte ranges, which browsers need to seek a video."""

from __future__ import annotations

import contextlib
import functools
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.cli.report_server import ReportRequestHandler

BODY = bytes(range(256)) * 4


class QuietHandler(ReportRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def serving(root: Path, handler: type[SimpleHTTPRequestHandler]) -> Iterator[str]:
    """``root`` served by ``handler`` on a free port, from a thread; the server's base URL."""
    with (
        ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root))) as server,
        ThreadPoolExecutor(1, thread_name_prefix="report-server") as pool,
    ):
        pool.submit(server.serve_forever)
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "episode.mp4").write_bytes(BODY)
    with serving(tmp_path, QuietHandler) as base:
        yield f"{base}/episode.mp4"


def _get(url: str, asked: str | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Range": asked} if asked else {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


@pytest.mark.parametrize(
    ("asked", "first", "last"),
    [("bytes=10-19", 10, 19), ("bytes=1000-", 1000, 1023), ("bytes=-24", 1000, 1023), ("bytes=1020-5000", 1020, 1023)],
)
def test_a_byte_range_is_answered_with_that_slice(served: str, asked: str, first: int, last: int) -> None:
    """Before, every request got the whole file and a 200: a served report's videos could not be seeked."""
    status, headers, body = _get(served, asked)
    assert status == 206
    assert body == BODY[first : last + 1]
    assert headers["Content-Range"] == f"bytes {first}-{last}/{len(BODY)}"
    assert headers["Content-Length"] == str(last - first + 1)
    assert headers["Content-Type"] == "video/mp4"
    assert headers["Accept-Ranges"] == "bytes"


def test_no_range_gets_the_whole_file_and_an_unsatisfiable_one_a_416(served: str) -> None:
    status, headers, body = _get(served)
    assert (status, body, headers["Accept-Ranges"]) == (200, BODY, "bytes")
    status, headers, body = _get(served, "bytes=5000-")
    assert (status, headers["Content-Range"], body) == (416, f"bytes */{len(BODY)}", b"")
    status, headers, body = _get(served, "bytes=10-19", method="HEAD")
    assert (status, headers["Content-Range"], body) == (206, f"bytes 10-19/{len(BODY)}", b"")
    status, _, body = _get(served, "bytes=0-1,5-6")  # several ranges: served whole, as before
    assert (status, body) == (200, BODY)
