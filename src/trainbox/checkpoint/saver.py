"""Checkpoints written while training goes on: snapshot in the caller, write on a thread.

    saver = BackgroundSaver(hook=...)
    saver.submit(ckpt_dir, step, payload, then=lambda path: checkpoint.prune(...))
    ...                      # training continues while the thread writes
    saver.join()             # before the next save, at the end, before exiting

`submit` blocks only while it copies the payload's tensors (so the optimizer may change the
originals at once), then returns; the thread writes the copy with `checkpoint.save` (atomic,
fsync, checksum). One write runs at a time: a `submit` while one is in flight waits for it
first. A failed write is raised by the next `submit` or `join`, once.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainbox.checkpoint import files as checkpoint

Save = Callable[..., Path]


def snapshot(value: Any) -> Any:
    """A copy of a payload that training cannot change: every tensor copied to CPU memory.

    Dicts, lists and tuples are rebuilt with copied contents; other values are deep-copied.
    """
    if isinstance(value, torch.Tensor):
        # copy=True: a CPU tensor is copied too, not shared with the live parameter.
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((key, snapshot(item)) for key, item in value.items())
    if isinstance(value, list):
        return [snapshot(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(snapshot(item) for item in value)
    return copy.deepcopy(value)


class BackgroundSaver:
    """Writes one checkpoint at a time on a background thread; errors come back to the caller."""

    def __init__(self, *, hook: checkpoint.Hook | None = None, save: Save = checkpoint.save):
        # `save(directory, step, payload, hook=hook)` writes one checkpoint (tests replace it).
        self._save = save
        self._hook = hook
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None
        # Seconds the last submit blocked its caller (the snapshot), and the last write took.
        self.blocked_s = 0.0
        self.write_s = 0.0

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self,
        directory: Path,
        step: int,
        payload: dict[str, Any],
        *,
        then: Callable[[Path], None] | None = None,
    ) -> None:
        """Snapshot `payload` now and write it as `step` in the background.

        `then(path)` runs on the writer thread after the save succeeded (pruning, a log line).
        Raises the previous write's error, if it failed, before starting this one.
        """
        self.join()
        started = time.perf_counter()
        copied = snapshot(payload)
        self.blocked_s = time.perf_counter() - started
        self._path = None
        self._thread = threading.Thread(
            target=self._write,
            args=(Path(directory), step, copied, then),
            name=f"trainbox-checkpoint-{step}",
            # Not a daemon: interpreter exit waits for a write in flight rather than cut it.
            daemon=False,
        )
        self._thread.start()

    def join(self) -> Path | None:
        """Wait for the write in flight; its path, or None if none was submitted since.

        Raises the write's exception (once) if it failed.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        path, self._path = self._path, None
        return path

    def __enter__(self) -> BackgroundSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        # Always wait for the write; raise its error only when nothing else is being raised.
        if exc[0] is None:
            self.join()
        elif self._thread is not None:
            self._thread.join()

    def _write(
        self,
        directory: Path,
        step: int,
        payload: dict[str, Any],
        then: Callable[[Path], None] | None,
    ) -> None:
        started = time.perf_counter()
        try:
            path = self._save(directory, step, payload, hook=self._hook)
            if then is not None:
                then(path)
            self._path = path
        except BaseException as err:  # the caller's thread decides what it means
            self._error = err
        finally:
            self.write_s = time.perf_counter() - started
