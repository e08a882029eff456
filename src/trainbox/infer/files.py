"""Durable files: temp file, fsync, rename, directory fsync; a reader sees all or nothing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from trainbox.atomic import fsync_dir


def temp_for(path: Path) -> Path:
    """The hidden temp file a write of `path` goes through (one per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def leftovers(path: Path) -> list[Path]:
    """Temp files of `path` that killed writers left behind."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def write(
    path: Path, pieces: Iterable[bytes], *, after_piece: Callable[[int], None] | None = None
) -> None:
    """Stream `pieces` into `path` atomically; `after_piece(n)` runs after n pieces (tests)."""
    temp = temp_for(path)
    try:
        with temp.open("wb") as handle:
            for number, piece in enumerate(pieces, start=1):
                handle.write(piece)
                if after_piece is not None:
                    # Flushed first, so whoever looks at this point finds a torso in the file.
                    handle.flush()
                    after_piece(number)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        # Gone after the rename; after a failure a torso must not stay behind.
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
    fsync_dir(path.parent)
