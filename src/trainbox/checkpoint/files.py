"""Checkpoints that survive crashes: temp file, fsync, checksum, rename; newest valid one wins.

`checkpoints/latest` is a relative symlink to the newest durable checkpoint, swapped atomically.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import mmap
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch

from trainbox.atomic import fsync_dir, temp_for
from trainbox.checkpoint import records
from trainbox.checkpoint.hashing import HashingWriter
from trainbox.checkpoint.writeback import Writeback
from trainbox.errors import StorageError
from trainbox.logs import log

# Called with the name of each point a save passes (see faults.SAVE_POINTS).
Hook = Callable[[str], None]
PATTERN = re.compile(r"step-(\d{8})\.pt")
LATEST = "latest"
# Where damaged checkpoints go when a run moves past them (never deleted).
DAMAGED = "damaged"
# What an interrupted save can leave behind: payload and sidecar temps, a half-made link.
LEFTOVERS = (".step-*.tmp", f".{LATEST}.*.tmp")
# Bytes hashed per call when checking a file: bounds how much one update holds in flight.
_HASH_CHUNK_BYTES = 64 << 20


def path_for(directory: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives."""
    return directory / f"step-{step:08d}.pt"


def save(directory: Path, step: int, payload: dict[str, Any], *, hook: Hook | None = None) -> Path:
    """Write atomically: readers see the previous state or the whole new file, never a torso.

    `hook(point)` runs at each of faults.SAVE_POINTS up to `latest`; OSError → StorageError.
    """
    announce = hook or _ignore
    final = path_for(directory, step)
    sidecar = _sidecar(final)
    temp, sidecar_temp = temp_for(final), temp_for(sidecar)
    sidecar_placed = renamed = False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with (
            temp.open("wb") as handle,
            HashingWriter(Writeback(handle), lambda: announce("write"), payload=payload) as writer,
        ):
            announce("open")
            try:
                records.write(payload, writer)
            except Exception:
                # torch hides a failed write behind its own RuntimeError ("unexpected pos").
                if writer.failure is not None:
                    raise writer.failure from None
                raise
            handle.flush()
            announce("fsync")
            os.fsync(handle.fileno())
        # The checksum lands first: a checkpoint is never visible without the digest that checks it.
        _write_durably(sidecar_temp, f"{writer.hexdigest()}  {final.name}\n".encode())
        os.replace(sidecar_temp, sidecar)
        sidecar_placed = True
        announce("sidecar")
        os.replace(temp, final)
        renamed = True
        announce("rename")
        fsync_dir(directory)
        # Only now that the checkpoint is durable may `latest` name it.
        point_latest(directory, final)
        announce("latest")
    except BaseException as err:
        # A sidecar without its checkpoint would be an orphan; after the rename it is needed.
        _discard(temp, sidecar_temp, temp_for(directory / LATEST))
        if sidecar_placed and not renamed:
            _discard(sidecar)
        if isinstance(err, OSError):
            problem = (
                f"saved {final} but could not make it durable and {LATEST}"
                if renamed
                else f"could not save checkpoint {final}"
            )
            raise _storage_error(problem, err, directory) from err
        raise
    return final


def load(path: Path) -> dict[str, Any]:
    """Load one checkpoint (or `latest`) after checking its digest; ValueError says why not."""
    # Read the link once: `latest` may move on while we read, its old target stays consistent.
    target = _target(path)
    name = target.name if target == path else f"{path.name} ({target.name})"
    expected = _expected_digest(target)
    try:
        payload = _load_checked(target, name, expected)
    except OSError as err:  # gone (pruned meanwhile), unreadable, not a file
        raise ValueError(f"{name} cannot be loaded ({type(err).__name__}: {err})") from err
    if not isinstance(payload, dict) or "model" not in payload or "step" not in payload:
        raise ValueError(f"{name} is not a trainbox checkpoint")
    return payload


def _load_checked(target: Path, name: str, expected: str | None) -> Any:
    # One pass over the disk: the digest reads the mapped file, torch copies from the same pages.
    with _mapped(target) as view:
        if expected is not None and expected != _sha256_of(view):
            raise ValueError(f"{name} does not match its checksum (truncated or corrupted)")
        try:
            # From the mapping, not torch's mmap=True: its tensors would pin the file (and its
            # disk space, once pruned) for as long as they live.
            mapped = cast(IO[bytes], _MappedFile(view))  # torch.load only reads, seeks and tells
            return torch.load(mapped, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for a damaged file
            raise ValueError(f"{name} cannot be loaded ({type(err).__name__}: {err})") from err


def existing(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = [path for path in directory.iterdir() if PATTERN.fullmatch(path.name)]
    return sorted(found, key=lambda path: path.name)


def newest_valid(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; damaged newer ones are skipped with a warning."""
    return scan(directory).found


@dataclass(frozen=True, kw_only=True, slots=True)
class Scan:
    """What resuming found in a checkpoint directory, newest first."""

    # The newest checkpoint that loads, and its payload; None if none does.
    found: tuple[Path, dict[str, Any]] | None
    # Damaged checkpoints newer than `found` (all of them if it is None), each with the reason.
    damaged: list[tuple[Path, str]]


def scan(directory: Path) -> Scan:
    """Load checkpoints newest first until one loads; damaged ones are logged and listed."""
    damaged: list[tuple[Path, str]] = []
    for path in reversed(existing(directory)):
        try:
            return Scan(found=(path, load(path)), damaged=damaged)
        except ValueError as err:
            log.warning("skipping damaged checkpoint", checkpoint=str(path), reason=str(err))
            damaged.append((path, str(err)))
    return Scan(found=None, damaged=damaged)


def move_aside(paths: list[Path]) -> list[Path]:
    """Move damaged checkpoints (and sidecars) into `damaged/` beside them, never deleting one.

    Out of the way of pruning and of a new save of the same step. Returns the new paths.
    """
    moved = []
    for path in paths:
        aside = path.parent / DAMAGED
        aside.mkdir(exist_ok=True)
        target = aside / path.name
        count = 0
        while target.exists():
            # Damaged before, at the same step: keep both.
            count += 1
            target = aside / f"{path.name}.{count}"
        sidecar = _sidecar(path)
        if sidecar.exists():
            os.replace(sidecar, target.with_name(target.name + ".sha256"))
        os.replace(path, target)
        if latest_name(path.parent) == path.name:
            (path.parent / LATEST).unlink()
        moved.append(target)
    if paths:
        fsync_dir(paths[0].parent)
    return moved


def prune(directory: Path, keep_last: int, *, hook: Hook | None = None) -> None:
    """Delete all but the newest `keep_last` checkpoints and `latest`'s target, and leftovers."""
    announce = hook or _ignore
    announced = False
    try:
        pinned = latest_name(directory)
        for path in existing(directory)[:-keep_last]:
            if path.name == pinned:
                continue
            # The checkpoint goes before its sidecar: it never exists without its digest.
            path.unlink(missing_ok=True)
            if not announced:
                announced = True
                announce("prune")
            _sidecar(path).unlink(missing_ok=True)
        # Sidecars whose checkpoint is gone: of a prune or a save that was cut short.
        # Only the writer (rank 0) saves and prunes, so no save is in flight here.
        kept = {path.name for path in existing(directory)}
        for sidecar in directory.glob("step-*.pt.sha256"):
            if sidecar.name.removesuffix(".sha256") not in kept:
                sidecar.unlink(missing_ok=True)
        for pattern in LEFTOVERS:
            for leftover in directory.glob(pattern):
                leftover.unlink(missing_ok=True)
    except OSError as err:
        problem = f"could not delete old checkpoint files ({err.filename or directory})"
        raise _storage_error(problem, err, directory) from err
    if not announced:
        announce("prune")


def _ignore(point: str) -> None:
    del point


def _storage_error(problem: str, err: OSError, directory: Path) -> StorageError:
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        remedy = "free space on that volume, or point run_dir at a bigger one"
    elif err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        remedy = "make run_dir writable for this user, or point it at a writable volume"
    else:
        remedy = "check the volume behind run_dir, or point run_dir at another one"
    kept = latest_name(directory) or next((p.name for p in reversed(existing(directory))), None)
    remains = (
        f"{directory / kept} is the newest intact checkpoint; a rerun resumes from it"
        if kept
        else "no earlier checkpoint exists; a rerun starts from step 0"
    )
    return StorageError(f"{problem}: {reason}", hint=f"{remedy}. {remains}")


def point_latest(directory: Path, final: Path) -> None:
    """Point `latest` at `final` (a file or a sharded checkpoint's folder), atomically."""
    link = directory / LATEST
    temp = temp_for(link)
    # A killed save of a process with this (recycled) pid may have left one behind.
    temp.unlink(missing_ok=True)
    # Relative, so the run directory can be moved or mounted elsewhere.
    os.symlink(final.name, temp)
    os.replace(temp, link)
    fsync_dir(directory)


def latest_name(directory: Path) -> str | None:
    """The name `latest` points at, or None."""
    try:
        return Path(os.readlink(directory / LATEST)).name
    except OSError:  # absent, or not a link
        return None


def _target(path: Path) -> Path:
    # One level is enough: `latest` names a checkpoint in its own directory.
    return path.parent / os.readlink(path) if path.is_symlink() else path


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _discard(*paths: Path) -> None:
    for path in paths:
        # Best effort: the error that brought us here is the one worth reporting.
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def digest(path: Path) -> str:
    """A checkpoint file's SHA-256: its sidecar's (what `load` checks against), else computed."""
    sidecar = _sidecar(path)
    if sidecar.is_file() and (text := sidecar.read_text().split()):
        return text[0]
    return _sha256(path)


def _expected_digest(path: Path) -> str | None:
    """The digest `path`'s sidecar records ("" if it is empty), or None without one."""
    sidecar = _sidecar(path)
    if not sidecar.exists():
        return None
    text = sidecar.read_text().split()
    return text[0] if text else ""


def _sha256(path: Path) -> str:
    with _mapped(path) as view:
        return _sha256_of(view)


def _sha256_of(view: memoryview) -> str:
    digest = hashlib.sha256()
    for start in range(0, len(view), _HASH_CHUNK_BYTES):
        with view[start : start + _HASH_CHUNK_BYTES] as chunk:
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """The file's bytes, mapped read-only: read from disk once, as they are first touched."""
    with path.open("rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            yield memoryview(b"")  # an empty file cannot be mapped
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
            mapping.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapping)
            try:
                yield view
            finally:
                view.release()  # the mapping cannot close while a view is out


class _MappedFile(io.RawIOBase):
    """A read-only, seekable file over mapped bytes: torch.load copies out of the pages."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        # Views released at once: a slice left alive would keep the mapping from closing.
        with (
            memoryview(buffer) as given,
            given.cast("B") as target,
            self._view[self._at : self._at + len(target)] as chunk,
        ):
            target[: len(chunk)] = chunk
            self._at += len(chunk)
            return len(chunk)


def _write_durably(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
