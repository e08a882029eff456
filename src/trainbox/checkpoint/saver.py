"""Checkpoints written while training goes on: snapshot, then write on a thread.

    saver = BackgroundSaver(hook=...)
    saver.submit(ckpt_dir, step, payload, then=..., stable=stable_storages(model, optimizer))
    ...                      # the next forward and backward run while the thread copies
    saver.settle()           # right before optimizer.step(): the stable tensors are copied
    ...                      # training continues while the thread writes
    saver.join()             # before the next save, at the end, before exiting

`submit` copies at once every tensor of the payload but the `stable` ones (tensors whose
storage is named in it: parameters and optimizer state, which only `optimizer.step()`
changes), and everything that is not a tensor. Buffers (BatchNorm's forward and DDP change
them), RNG states and the like are thus fixed before `submit` returns. The thread copies the
stable tensors first, then writes the copy with `files.save` (atomic, fsync, checksum).
`settle` waits until that copy is made: the caller must call it before anything changes a
stable tensor, and may change them as soon as it returns. So the copy overlaps the next
forward and backward instead of stalling training. One write runs at a time: a `submit`
while one is in flight waits for it first. A failed copy or write is raised by the next
`submit` or `join`, once (a failed copy writes nothing; `settle` still returns).

The saver keeps the last copy after its write and copies the next payload into it: copying
into memory already in use is much faster than into fresh memory, which is mostly page faults
(benchmarks/README.md, "The background stall"), at the price of holding one payload's worth of
CPU memory (pinned, for CUDA tensors) between saves.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from trainbox.checkpoint import files

Save = Callable[..., Path]


def snapshot(value: Any, *, into: Any = None) -> Any:
    """A copy of a payload that training cannot change: every tensor copied to CPU memory.

    Dicts, lists and tuples are rebuilt with copied contents; other values are deep-copied.
    `into`, an earlier snapshot, lends its tensors: where one matches, it is copied into.
    """
    return _snapshot(value, into, frozenset(), [])


def stable_storages(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> frozenset[int]:
    """The storages only `optimizer.step()` changes: the parameters and the optimizer's state."""
    tensors = [
        *module.parameters(),
        *(v for state in optimizer.state.values() for v in state.values() if _is_tensor(v)),
    ]
    return frozenset(ptr for tensor in tensors if (ptr := _storage(tensor)))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Later:
    """A stable tensor of a snapshot, copied on the writer thread."""

    # The live tensor (detached), unchanged until the caller's settle().
    source: torch.Tensor
    # The earlier snapshot's tensor at the same place, to copy into if it fits.
    spare: Any


def _snapshot(value: Any, into: Any, stable: Collection[int], later: list[_Later]) -> Any:
    """`snapshot`, leaving a `_Later` (appended to `later`) where a tensor's storage is stable."""
    if isinstance(value, torch.Tensor):
        if stable and (ptr := _storage(value)) and ptr in stable:
            later.append(_Later(source=value.detach(), spare=into))
            return later[-1]
        return _copy_tensor(value.detach(), into)
    if isinstance(value, dict):
        spare = into if isinstance(into, dict) else {}
        return type(value)(
            (key, _snapshot(item, spare.get(key), stable, later)) for key, item in value.items()
        )
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        spares = into if type(into) is type(value) and len(into) == len(value) else ()
        copied = [
            _snapshot(item, spare, stable, later) for item, spare in zip_longest(value, spares)
        ]
        return copied if isinstance(value, list) else tuple(copied)
    return copy.deepcopy(value)


def _fill(value: Any) -> Any:
    """A snapshot from `_snapshot` with its `_Later` tensors copied (on the writer thread).

    A CUDA source is copied to pinned memory by a blocking copy_ on the default stream: it
    runs after the optimizer step that made the value (enqueued before submit), and it is
    done before settle() returns, so before the next step's kernels can change the source.
    """
    if isinstance(value, _Later):
        return _copy_tensor(value.source, value.spare)
    if isinstance(value, dict):
        return type(value)((key, _fill(item)) for key, item in value.items())
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        filled = [_fill(item) for item in value]
        return filled if isinstance(value, list) else tuple(filled)
    return value


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _storage(tensor: torch.Tensor) -> int:
    """The address of a tensor's storage; 0 (never stable) if empty or not strided (sparse
    tensors have no single storage)."""
    if tensor.layout != torch.strided:
        return 0
    return int(tensor.untyped_storage().data_ptr())


def _copy_tensor(source: torch.Tensor, spare: Any) -> torch.Tensor:
    # Writing into memory already faulted in runs at memory bandwidth; a fresh buffer costs
    # several times that in page faults, in the training thread for tensors not stable
    # (benchmarks/README.md, "The background stall").
    if _fits(spare, source):
        return spare.copy_(source)
    # A DTensor (one rank's shard) keeps its sharding: `to` copies its local part only.
    if source.device.type == "cuda" and source.is_contiguous() and not isinstance(source, DTensor):
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

    def __init__(self, *, hook: files.Hook | None = None, save: Save = files.save):
        # `save(directory, step, payload, hook=hook)` writes one checkpoint (tests replace it).
        self._save = save
        self._hook = hook
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None
        # Set by the writer once the stable tensors are copied; None when none are pending.
        self._copying: threading.Event | None = None
        # The last snapshot, once written: the next one copies into its tensors (see snapshot).
        self._spare: Any = None
        # Seconds the last submit blocked its caller (the snapshot of the tensors not stable),
        # the caller then waited in settle() for the stable ones, the writer copied those, and
        # the last write took.
        self.blocked_s = 0.0
        self.settle_s = 0.0
        self.copy_s = 0.0
        self.write_s = 0.0

    @property
    def busy(self) -> bool:
        """Whether a copy or write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self,
        directory: Path,
        step: int,
        payload: dict[str, Any],
        *,
        then: Callable[[Path], None] | None = None,
        stable: Collection[int] = frozenset(),
    ) -> None:
        """Snapshot `payload` and write it as `step` in the background.

        Tensors whose storage address is in `stable` (see stable_storages) are copied on the
        writer thread: they must not change until settle() returns. The rest is copied now.
        `then(path)` runs on the writer thread after the save succeeded (pruning, a log line).
        Raises the previous copy's or write's error, if it failed, before starting this one.
        """
        self.join()
        started = time.perf_counter()
        later: list[_Later] = []
        taken = _snapshot(payload, self._spare, stable, later)
        # Deferred copies may land in the spare: until they are made it is nobody's to lend.
        self._spare = None if later else taken
        self._copying = threading.Event() if later else None
        self.blocked_s = time.perf_counter() - started
        self.settle_s = self.copy_s = 0.0
        self._path = None
        self._thread = threading.Thread(
            target=self._write,
            args=(Path(directory), step, taken, then, self._copying),
            name=f"trainbox-checkpoint-{step}",
            # Not a daemon: interpreter exit waits for a write in flight rather than cut it.
            daemon=False,
        )
        self._thread.start()

    def settle(self) -> None:
        """Wait until the stable tensors of the last submit are copied; then they may change.

        Returns at once if none are pending. A failed copy is raised by join, not here.
        """
        copying = self._copying
        if copying is None:
            return
        started = time.perf_counter()
        copying.wait()
        self.settle_s = time.perf_counter() - started
        self._copying = None

    def join(self) -> Path | None:
        """Wait for the copy and write in flight; its path, or None if none was submitted since.

        Raises the copy's or write's exception (once) if it failed.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._copying = None
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
        taken: dict[str, Any],
        then: Callable[[Path], None] | None,
        copying: threading.Event | None,
    ) -> None:
        try:
            payload = taken if copying is None else self._copy(taken, copying)
            started = time.perf_counter()
            try:
                path = self._save(directory, step, payload, hook=self._hook)
                if then is not None:
                    then(path)
                self._path = path
            finally:
                self.write_s = time.perf_counter() - started
        except BaseException as err:  # the caller's thread decides what it means
            self._error = err

    def _copy(self, taken: dict[str, Any], copying: threading.Event) -> dict[str, Any]:
        """The deferred copies, made; the caller's settle() is released even if they fail."""
        started = time.perf_counter()
        try:
            payload: dict[str, Any] = _fill(taken)
        finally:
            self.copy_s = time.perf_counter() - started
            copying.set()
        self._spare = payload
        return payload
