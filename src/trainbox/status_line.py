"""The one terminal line a progress display owns, shared with the console log renderer so
log lines print above it instead of splicing into it (no trainbox imports: logs uses it)."""

from __future__ import annotations

import threading
from typing import TextIO

# Carriage return, then erase the whole line: the status line's old text disappears.
CLEAR = "\r\x1b[2K"


class StatusLine:
    """A terminal stream with at most one status line at its bottom."""

    def __init__(self) -> None:
        self.stream: TextIO | None = None
        self.status = ""
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether a status line is shown now."""
        return bool(self.status)

    def show(self, stream: TextIO, text: str) -> None:
        """Replace the status line with `text` (no newline: the line stays the bottom one)."""
        with self._lock:
            self.stream, self.status = stream, text
            stream.write(CLEAR + text)
            stream.flush()

    def release(self) -> None:
        """Leave the status line's last text as an ordinary line; later output starts below."""
        with self._lock:
            if self.stream is not None and self.status:
                self.stream.write(CLEAR + self.status + "\n")
                self.stream.flush()
            self.status = ""

    def write_above(self, stream: TextIO, text: str) -> None:
        """Write a log line; with a status line shown on `stream`, clear it and redraw it below."""
        with self._lock:
            # Always clear first: another rank on the same terminal may have a progress line
            # there (its next redraw brings it back); on an empty line it does nothing.
            text = CLEAR + text
            if self.status and stream is self.stream:
                text += self.status
            # One write() per line: ranks sharing a stream never splice two lines together.
            stream.write(text)
            stream.flush()


status_line = StatusLine()


class StatusLineWriter:
    """A file-like object for structlog's WriteLogger that writes through `status_line`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        status_line.write_above(self.stream, text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
