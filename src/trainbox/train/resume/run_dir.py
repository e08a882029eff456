"""run_dir around a run: made, probed and locked by rank 0 before; its files besides checkpoints
(config.yaml and run.json, the manifest, and summary.json) written atomically by rank 0; left
tidy after.

One run at a time per run_dir: an advisory flock on run_dir/trainbox.lock, held by rank 0. The
kernel drops a flock when its holder dies, however it dies, so a lock is never stale after a
crash. The file names the holder (host, pid, start time) while it is held and is emptied on
release; it is left in place, because deleting a lock file races with the next run opening it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import psutil
import torch

from trainbox import atomic
from trainbox.affinity import processor
from trainbox.config import Config, fingerprint, to_yaml
from trainbox.distributed.consensus import Problem, raise_first
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext
from trainbox.process import provenance
from trainbox.process.provenance import Provenance
from trainbox.train.parallel.mesh import mesh_shape
from trainbox.train.resume.determinism import rank_seed
from trainbox.version import __version__

WRITABLE_HINT = "point run_dir at a writable directory (a mounted volume in containers)"


class RunDir:
    """Rank 0's hold on run_dir for one run; every rank learns whether it could take it."""

    def __init__(self, path: Path, *, rank0: bool) -> None:
        self.path = path
        self.rank0 = rank0
        self.lock: Lock | None = None
        # The directories this run made for run_dir, deepest first (removed again if unused).
        self.made: list[Path] = []

    def prepare(self) -> None:
        """Rank 0 makes run_dir and takes its lock; every rank stops together if it cannot."""
        problem: Problem | None = None
        if self.rank0:
            self.made = missing_dirs(self.path)
            problem = _make(self.path) or self._lock()
            if problem is None and (unwritable := writable_problem(self.path)):
                problem = Problem(text=unwritable, hint=WRITABLE_HINT)
        raise_first(problem)

    def take_over(self) -> None:
        """A spare that became rank 0 mid-run takes the lock its predecessor held (the kernel
        released it when that process died). Not collective: only rank 0 ever holds it."""
        problem = self._lock() if self.rank0 else None
        if problem is not None:
            raise UsageError(problem.text, hint=problem.hint)

    def release(self) -> None:
        """Give the lock back; a run_dir this run made and left empty goes too."""
        if self.lock is None:
            return
        self._remove_if_unused()
        self.lock.release()
        self.lock = None

    def _lock(self) -> Problem | None:
        try:
            taken = acquire_lock(self.path)
        except OSError as err:
            return Problem(
                text=f"run_dir={str(self.path)!r} cannot hold its lock file {LOCK_NAME}"
                f" ({err.strerror})",
                hint="point run_dir at a writable directory on a file system with file locking",
            )
        if isinstance(taken, Lock):
            self.lock = taken
            return None
        holder = taken.describe() if taken else "one that is starting"
        return Problem(
            text=f"run_dir={str(self.path)!r} is in use by another run ({holder})",
            hint="wait for that run to end (or stop it), or use another run_dir; the lock of a"
            " run that died is released by the kernel, so the holder is alive",
        )

    def _remove_if_unused(self) -> None:
        # Best effort, on the way out: an error here must not hide the one that ended the run.
        with contextlib.suppress(OSError):
            if not self.made or os.listdir(self.path) != [LOCK_NAME]:
                return
            (self.path / LOCK_NAME).unlink()
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
        text = f"run_dir={str(run_dir)!r} is not writable ({err.strerror})"
        return Problem(text=text, hint=WRITABLE_HINT)
    return None


LOCK_NAME = "trainbox.lock"
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
class LockHolder:
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


def acquire_lock(run_dir: Path) -> Lock | LockHolder | None:
    """Take run_dir's lock: the Lock, or the LockHolder that has it (None if it cannot be read).

    OSError if the lock file cannot be made (run_dir missing or not writable).
    """
    path = run_dir / LOCK_NAME
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


def read_holder(path: Path) -> LockHolder | None:
    """The holder the lock file names; None while it is being written or if it is unreadable."""
    try:
        record = json.loads(path.read_text())
        return LockHolder(
            host=str(record["host"]), pid=int(record["pid"]), started=record["started"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _still_named(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


SUMMARY = "summary.json"


def write_manifest(
    run_dir: Path,
    config: Config,
    *,
    context: LaunchContext,
    device: torch.device,
    user_code: Mapping[str, str],
    resumed_from: str | None,
    initialised_from: str | None,
    dataloader_workers: int,
) -> None:
    """config.yaml (what to rerun) and run.json (what it ran on, and where it started from)."""
    atomic.write_text(run_dir / "config.yaml", to_yaml(config))
    record = {
        **environment(),
        "launch": context.describe(),
        "device": str(device),
        # Rank 0's, as it trains. On CPU the intra-op count is part of what params_sha256
        # depends on (a matrix product split over more threads adds in another order), and
        # launchers that grant other CPU counts size it differently.
        "threads": {"intra_op": torch.get_num_threads(), "dataloader_workers": dataloader_workers},
        "backend": torch.distributed.get_backend(),
        # The device mesh the model is sharded over (null under ddp): fsdp's is 1 x world.
        "mesh": _mesh(config, context),
        "config_hash": fingerprint(config),
        "seed": config.seed,
        "rank_seeds": [rank_seed(config.seed, rank) for rank in range(context.world_size)],
        "resumed_from": resumed_from,
        "initialised_from": initialised_from,
        "user_code": dict(user_code),
        "started": time.time(),
    }
    atomic.write_json(run_dir / "run.json", record)


def _mesh(config: Config, context: LaunchContext) -> dict[str, int] | None:
    shape = mesh_shape(
        config.train, world_size=context.world_size, local_world_size=context.local_world_size
    )
    if shape is None:
        return None
    return {"replicate": 1 if len(shape) == 1 else shape[0], "shard": shape[-1]}


def environment() -> dict[str, Any]:
    """The software and machine behind a run's numbers (throughput and, on CPU, the bits)."""
    cpu = processor.read()
    return {
        "trainbox": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "image": image_record(os.environ, provenance.read()),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "host": {
            "name": platform.node(),
            "cpus_logical": psutil.cpu_count(logical=True),
            "cpus_physical": psutil.cpu_count(logical=False),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            # params_sha256 on CPU is comparable only between runs of one cpu_kind.
            "cpu_model": cpu.model,
            "cpu_kind": cpu.kind,
        },
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSummary:
    """What a finished run reports: `fit()` returns it and summary.json holds it."""

    # Optimizer steps taken in all (a resumed run counts its earlier steps too).
    steps: int
    # Processes that trained.
    world_size: int
    # The launcher that started them (torchrun, slurm, mpi, ...).
    launcher: str
    # Samples per optimizer step over all ranks.
    global_batch: int
    # The mean training loss of the last log line (NaN when none was logged).
    final_loss: float
    # The final validation metrics, `val_loss` and the like ({} without a validation set).
    val_metrics: dict[str, float]
    # Training samples per second over this call's loop (NaN when it took no step).
    samples_per_s: float
    # Seconds this call spent in the loop.
    train_seconds: float
    # SHA-256 of the final weights: the reproducibility fingerprint.
    params_sha256: str
    # Whether this call found the run already complete, trained nothing and left its files.
    already_complete: bool = False
    # Corrupt samples a sharded stream replaced over the whole run, all ranks and resumes
    # (data.args.on_corrupt=skip); None for other data.
    skipped_samples: int | None = None
    # Ranks replaced in place by their spares (dist.recovery=in_process) during this call.
    recoveries: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The summary as summary.json holds it (NaN written as null)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, already_complete: bool) -> TrainSummary:
        """A summary read back from summary.json (null floats as NaN; unknown keys ignored)."""

        def number(key: str) -> float:
            value = record.get(key)
            return float(value) if isinstance(value, int | float) else math.nan

        return cls(
            steps=int(record.get("steps", 0)),
            world_size=int(record.get("world_size", 0)),
            launcher=str(record.get("launcher", "")),
            global_batch=int(record.get("global_batch", 0)),
            final_loss=number("final_loss"),
            val_metrics=dict(record.get("val_metrics") or {}),
            samples_per_s=number("samples_per_s"),
            train_seconds=number("train_seconds"),
            params_sha256=str(record.get("params_sha256", "")),
            already_complete=already_complete,
            skipped_samples=_count(record.get("skipped_samples")),
            recoveries=int(record.get("recoveries") or 0),
        )


def _count(value: Any) -> int | None:
    """An int read back from summary.json, or None (absent, or not a whole number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def write_summary(run_dir: Path, summary: TrainSummary) -> None:
    """summary.json: written last, so its presence says the run finished."""
    atomic.write_json(run_dir / SUMMARY, summary.as_dict())


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A finished run's summary.json as written, or None (absent, unreadable, not an object)."""
    try:
        data = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return ".".join(map(str, torch.cuda.nccl.version()))


def image_record(env: Mapping[str, str], image: Provenance) -> dict[str, str | None]:
    """The image's build labels (the Dockerfile's TRAINBOX_IMAGE_* variables) and lock hash."""
    labels: dict[str, str | None] = {
        key.removeprefix("TRAINBOX_IMAGE_").lower(): value
        for key, value in env.items()
        if key.startswith("TRAINBOX_IMAGE_")
    }
    # The provenance file is the image's own word: it holds when a launcher drops the variables.
    if image.revision is not None:
        labels.setdefault("revision", image.revision)
    return {**labels, "lock_sha256": image.lock_sha256}
