"""Checkpoints written while training goes on: snapshot in the caller, write on a thread.

    saver = BackgroundSaver(hook=...)
    saver.submit(ckpt_dir, step, payload, then=lambda path: checkpoint.prune(...))
    ...                      # training continues while the thread writes
    saver.join()             # before the next save, at the end, before exiting

`submit` blocks only while it copies the payload's tensors (so the optimizer may change the
originals at once), then returns; the thread writes the copy with `checkpoint.save` (atomic,
fsync, checksum). One write runs at a time: a `submit` while one is in flight waits for it
first. A failed write is raised by the next `submit` or `join`, once.

The saver keeps the last copy after its write and copies the next payload into it: copying
into memory already in use is ~10x faster than into fresh memory, at the price of holding one
payload's worth of CPU memory (pinned, for CUDA tensors) between saves.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch

from trainbox.checkpoint import files as checkpoint

Save = Callable[..., Path]


def snapshot(value: Any, *, into: Any = None) -> Any:
    """A copy of a payload that training cannot change: every tensor copied to CPU memory.

    Dicts, lists and tuples are rebuilt with copied contents; other values are deep-copied.
    `into`, an earlier snapshot, lends its tensors: where one matches, it is copied into.
    """
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value.detach(), into)
    if isinstance(value, dict):
        spare = into if isinstance(into, dict) else {}
        return type(value)(
            (key, snapshot(item, into=spare.get(key))) for key, item in value.items()
        )
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        spares = into if type(into) is type(value) and len(into) == len(value) else ()
        copied = [snapshot(item, into=spare) for item, spare in zip_longest(value, spares)]
        return copied if isinstance(value, list) else tuple(copied)
    return copy.deepcopy(value)


def _copy_tensor(source: torch.Tensor, spare: Any) -> torch.Tensor:
    # Writing into memory already faulted in runs at memory bandwidth; a fresh 1 GB buffer
    # costs ~10x that in page faults, in the training thread.
    if _fits(spare, source):
        return spare.copy_(source)
    if source.device.type == "cuda" and source.is_contiguous():
        # Pinned: the device copies straight into it, without a staging buffer.
        pinned = torch.empty_strided(
            source.shape, source.stride(), dtype=source.dtype, pin_memory=True
        )
        return pinned.copy_(source)
    # copy=True: a CPU tensor is copied too, not shared with the live parameter.
    return source.to("cpu", copy=True)


def _fits(spare: Any, source: torch.Tensor) -> bool:
    """Whether `spare` can hold a copy of `source` that saves and loads exactly as a fresh one."""
    return (
        isinstance(spare, torch.Tensor)
        and spare.device.type == "cpu"
        and spare.layout == source.layout == torch.strided
        and (spare.dtype, spare.shape, spare.stride())
        == (source.dtype, source.shape, source.stride())
    )


class BackgroundSaver:
    """Writes one checkpoint at a time on a background thread; errors come back to the caller."""

    def __init__(self, *, hook: checkpoint.Hook | None = None, save: Save = checkpoint.save):
        # `save(directory, step, payload, hook=hook)` writes one checkpoint (tests replace it).
        self._save = save
        self._hook = hook
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None
        # The last snapshot, once written: the next one copies into its tensors (see snapshot).
        self._spare: Any = None
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
        copied = snapshot(payload, into=self._spare)
        self._spare = copied
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
