"""The one atomic writer: temp file, fsync, rename, directory fsync; readers see all or nothing."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO


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

    def fill(handle: BinaryIO) -> None:
        for number, piece in enumerate(pieces, start=1):
            handle.write(piece)
            if after_piece is not None:
                # Flushed first, so whoever looks at this point finds a torso in the file.
                handle.flush()
                after_piece(number)

    write_with(path, fill)


def write_with(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """`fill(handle)` writes the file's bytes; `path` then appears whole, atomically and durably."""
    temp = temp_for(path)
    try:
        with temp.open("wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        # Gone after the rename; after a failure a torso must not stay behind.
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) atomically and durably."""
    write(path, [text.encode()])


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically and durably, so a reader never sees half a file.

    A value that is not finite (a NaN loss) is written as null: strict JSON has no NaN.
    """
    write_text(path, json.dumps(finite(data), indent=2, default=str, allow_nan=False) + "\n")


def finite(data: Any) -> Any:
    """`data` with every NaN or infinite float replaced by None, in nested dicts and lists."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite(value) for value in data]
    return data


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable: a rename is on disk only with its directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
