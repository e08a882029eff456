"""A small real tmpfs for disk-full tests (needs root; the tier is unavailable without it)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import tiers


@contextlib.contextmanager
def tmpfs(mount_point: Path, *, size_kib: int) -> Iterator[Path]:
    """Mount a tmpfs of `size_kib` KiB at `mount_point` (created) for the block's duration."""
    mount_point.mkdir()
    argv = ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount_point)]
    try:
        mounted = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        tiers.unavailable("no `mount` command: the disk-full tests mount a small tmpfs")
    if mounted.returncode != 0:
        tiers.unavailable(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
