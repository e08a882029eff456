"""The file a checkpoint lands in: the disk starts on each ~64 MB as soon as it is written.

Left alone, the kernel holds a whole checkpoint's dirty pages until the closing fsync, so the
disk idles while torch serialises and then the save waits for all of it. Here the disk writes
while the next records are produced, and the fsync finds little left; written pages leave the
page cache once clean, so a save neither relies on the cache nor crowds it.
"""

from __future__ import annotations

import contextlib
import os
from typing import IO, Any

# Bytes written between two writeback requests: few system calls, disk busy from the start.
WRITEBACK_BYTES = 64 << 20


class Writeback:
    """Writes to `handle`, asking the kernel every `every` bytes to write them to disk now."""

    def __init__(self, handle: IO[bytes], *, every: int | None = None) -> None:
        self._handle = handle
        self._every = WRITEBACK_BYTES if every is None else every
        self._fd = handle.fileno()
        self._written = 0
        # Bytes before this offset have been handed to the disk; the ones before `_clean`
        # had a whole chunk's time to get there and may leave the cache.
        self._handed = 0
        self._clean = 0

    def write(self, data: Any) -> int:
        written = self._handle.write(data) or 0
        self._written += written
        if self._written - self._handed >= self._every:
            self._hand_over()
        return written

    def flush(self) -> None:
        self._handle.flush()

    def _hand_over(self) -> None:
        self._handle.flush()  # what the kernel is asked to write must have reached it
        # On Linux DONTNEED starts writeback of the range's dirty pages without waiting for it,
        # and drops its clean ones: the chunk written just now goes to disk, the one before
        # (on disk by now) leaves the cache. Advice only: where refused, fsync does it all.
        advise = getattr(os, "posix_fadvise", None)
        if advise is not None:
            with contextlib.suppress(OSError):
                advise(self._fd, self._clean, self._written - self._clean, os.POSIX_FADV_DONTNEED)
        self._clean, self._handed = self._handed, self._written
