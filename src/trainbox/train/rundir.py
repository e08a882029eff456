"""run_dir around a run: made, probed and locked by rank 0 before; left tidy after."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from trainbox.train import rundir_lock
from trainbox.train.agreement import Problem, raise_any

WRITABLE_HINT = "point run_dir at a writable directory (a mounted volume in containers)"


class RunDir:
    """Rank 0's hold on run_dir for one run; every rank learns whether it could take it."""

    def __init__(self, path: Path, *, rank0: bool) -> None:
        self.path = path
        self.rank0 = rank0
        self.lock: rundir_lock.Lock | None = None
        # The directories this run made for run_dir, deepest first (removed again if unused).
        self.made: list[Path] = []

    def prepare(self) -> None:
        """Rank 0 makes run_dir and takes its lock; every rank stops together if it cannot."""
        problem: Problem | None = None
        if self.rank0:
            self.made = missing_dirs(self.path)
            problem = _make(self.path) or self._lock()
            if problem is None and (unwritable := writable_problem(self.path)):
                problem = (unwritable, WRITABLE_HINT)
        raise_any(problem)

    def release(self) -> None:
        """Give the lock back; a run_dir this run made and left empty goes too."""
        if self.lock is None:
            return
        self._remove_if_unused()
        self.lock.release()
        self.lock = None

    def _lock(self) -> Problem | None:
        try:
            taken = rundir_lock.acquire(self.path)
        except OSError as err:
            return (
                f"run_dir={str(self.path)!r} cannot hold its lock file {rundir_lock.NAME}"
                f" ({err.strerror})",
                "point run_dir at a writable directory on a file system with file locking",
            )
        if isinstance(taken, rundir_lock.Lock):
            self.lock = taken
            return None
        holder = taken.describe() if taken else "one that is starting"
        return (
            f"run_dir={str(self.path)!r} is in use by another run ({holder})",
            "wait for that run to end (or stop it), or use another run_dir; the lock of a run"
            " that died is released by the kernel, so the holder is alive",
        )

    def _remove_if_unused(self) -> None:
        # Best effort, on the way out: an error here must not hide the one that ended the run.
        with contextlib.suppress(OSError):
            if not self.made or os.listdir(self.path) != [rundir_lock.NAME]:
                return
            (self.path / rundir_lock.NAME).unlink()
            for directory in self.made:
                directory.rmdir()


def missing_dirs(run_dir: Path) -> list[Path]:
    """run_dir and those of its parents that do not exist yet, deepest first."""
    missing = []
    for directory in (run_dir, *run_dir.parents):
        if directory.exists():
            break
        missing.append(directory)
    return missing


def writable_problem(run_dir: Path) -> str:
    """Why rank 0 cannot create a file in run_dir ('' when it can)."""
    try:
        probe = run_dir / f".write-probe-{time.time_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return f"run_dir={str(run_dir)!r} is not writable ({err.strerror})"
    return ""


def _make(run_dir: Path) -> Problem | None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"run_dir={str(run_dir)!r} is not writable ({err.strerror})", WRITABLE_HINT
    return None
