"""Checkpoints that survive crashes: temp file, fsync, checksum, rename; newest valid one wins."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import torch

from trainbox.logs import log

PATTERN = re.compile(r"step-(\d{8})\.pt")


def path_for(directory: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives."""
    return directory / f"step-{step:08d}.pt"


def save(directory: Path, step: int, payload: dict[str, Any]) -> Path:
    """Write atomically: readers see the previous state or the whole new file, never a torso."""
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, step)
    temp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        with temp.open("wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        # The checksum lands first: a checkpoint is never visible without the digest that checks it.
        _write_atomic(_sidecar(final), f"{_sha256(temp)}  {final.name}\n".encode())
        os.replace(temp, final)
        _fsync_dir(directory)
    finally:
        temp.unlink(missing_ok=True)
    return final


def load(path: Path) -> dict[str, Any]:
    """Load one checkpoint after checking its digest; ValueError says why it is unusable."""
    sidecar = _sidecar(path)
    if sidecar.exists():
        expected = sidecar.read_text().split()[0] if sidecar.read_text().strip() else ""
        if expected != _sha256(path):
            raise ValueError(f"{path.name} does not match its checksum (truncated or corrupted)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise ValueError(f"{path.name} cannot be loaded ({type(err).__name__}: {err})") from err
    if not isinstance(payload, dict) or "model" not in payload or "step" not in payload:
        raise ValueError(f"{path.name} is not a trainbox checkpoint")
    return payload


def existing(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = [path for path in directory.iterdir() if PATTERN.fullmatch(path.name)]
    return sorted(found, key=lambda path: path.name)


def newest_valid(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; damaged newer ones are skipped with a warning."""
    for path in reversed(existing(directory)):
        try:
            return path, load(path)
        except ValueError as err:
            log.warning("skipping damaged checkpoint", checkpoint=str(path), reason=str(err))
    return None


def prune(directory: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints, and leftovers of interrupted saves."""
    for path in existing(directory)[:-keep_last]:
        path.unlink(missing_ok=True)
        _sidecar(path).unlink(missing_ok=True)
    for leftover in directory.glob(".step-*.tmp"):
        leftover.unlink(missing_ok=True)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def _fsync_dir(directory: Path) -> None:
    # The rename itself is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
