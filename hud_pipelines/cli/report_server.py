"""The file server behind ``hud-pipelines report --serve``: the standard library's, with byte ranges.

A browser seeks a video (the report's episode players, its cursor that follows playback) by asking for a
byte range of the file. ``SimpleHTTPRequestHandler`` answers every request with the whole file and a
``200``, so a served report's videos played but could not be scrubbed. This handler answers a single
``Range: bytes=first-last`` (or ``first-``, or ``-suffix``) with ``206`` and that slice, an unsatisfiable
one with ``416``, and says ``Accept-Ranges: bytes`` on every reply; anything else is served whole, as
before.
"""

from __future__ import annotations

import os
import re
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler
from typing import Any, BinaryIO

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class ReportRequestHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` that serves single byte ranges of files."""

    _remaining: int | None = None
    """Bytes of the file left to send for a range reply (``None``: the whole file)."""

    def end_headers(self) -> None:
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def send_head(self) -> Any:
        self._remaining = None
        asked = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        path = self.translate_path(self.path)
        if asked is None or not (asked[1] or asked[2]) or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        if asked[1]:
            first, last = int(asked[1]), min(int(asked[2]) if asked[2] else size - 1, size - 1)
        else:
            first, last = max(0, size - int(asked[2])), size - 1
        if first >= size or first > last:
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        source = open(path, "rb")  # noqa: SIM115 -- closed by do_GET / do_HEAD, as the base class's is
        try:
            source.seek(first)
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
            self.end_headers()
        except BaseException:
            source.close()
            raise
        self._remaining = last - first + 1
        return source

    def copyfile(self, source: Any, outputfile: Any) -> None:
        if self._remaining is None:
            super().copyfile(source, outputfile)
            return
        _copy_bytes(source, outputfile, self._remaining)


def _copy_bytes(source: BinaryIO, target: BinaryIO, count: int) -> None:
    """``count`` bytes of ``source`` into ``target``, a block at a time."""
    while count > 0:
        block = source.read(min(count, 64 * 1024))
        if not block:
            return
        target.write(block)
        count -= len(block)
