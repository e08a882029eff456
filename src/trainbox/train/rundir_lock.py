"""One run at a time per run_dir: an advisory flock on run_dir/trainbox.lock, held by rank 0.

The kernel drops a flock when its holder dies, however it dies, so a lock is never stale after
a crash. The file names the holder (host, pid, start time) while it is held and is emptied on
release; it is left in place, because deleting a lock file races with the next run opening it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

NAME = "trainbox.lock"
# Descriptors of the locks this process holds. A forked child (a DataLoader worker) closes its
# copies at once: a flock lives as long as any copy, so a worker that outlived a crashed rank 0
# would otherwise keep the run_dir locked against the restarted one.
_HELD: set[int] = set()


def _close_inherited() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited)


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """Who holds a run_dir's lock, as its lock file says."""

    # Host name of the holder's machine.
    host: str
    # The holder's process id on that host.
    pid: int
    # Epoch seconds when it took the lock.
    started: float

    def describe(self) -> str:
        """`host H, pid P, started T` for an error message."""
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {when}"


class Lock:
    """A held run_dir lock; `release()` (or the process's end) lets the next run in."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Empty the holder record and drop the lock (idempotent)."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        _HELD.discard(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock


def acquire(run_dir: Path) -> Lock | Holder | None:
    """Take run_dir's lock: the Lock, or the Holder that has it (None if it cannot be read).

    OSError if the lock file cannot be made (run_dir missing or not writable).
    """
    path = run_dir / NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return read_holder(path)
        except BaseException:
            os.close(fd)
            raise
        if _still_named(fd, path):
            break
        # Unlinked by a run that cleaned up the directory it had made: lock the new file.
        os.close(fd)
    record = {"host": platform.node(), "pid": os.getpid(), "started": time.time()}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(record).encode() + b"\n")
    _HELD.add(fd)
    return Lock(fd, path)


def read_holder(path: Path) -> Holder | None:
    """The holder the lock file names; None while it is being written or if it is unreadable."""
    try:
        record = json.loads(path.read_text())
        return Holder(host=str(record["host"]), pid=int(record["pid"]), started=record["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _still_named(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
