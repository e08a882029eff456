"""The file a checkpoint is written through: it hashes bytes as they pass, off the writer's path.

torch.save hands each tensor's bytes to `write` straight from the tensor's memory. Where that
memory belongs to the payload being saved, which outlives the save, the hash of it is queued
and runs on a helper thread while torch goes on (its CRC32 of the next record, the writes, the
fsync); only `hexdigest` waits for it. Any other buffer is hashed before `write` returns.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import torch

# Smaller writes are copied into the queue (torch writes headers of a few bytes); larger ones
# of memory not the payload's are hashed beside their write.
_COPY_BELOW_BYTES = 1 << 20


class WritableFile(Protocol):
    """Where written bytes go: a binary file, or a wrapper around one."""

    def write(self, data: Any, /) -> int: ...

    def flush(self) -> None: ...


class PayloadMemory:
    """The address ranges of a payload's CPU tensors' storages, each with a view that owns it."""

    def __init__(self, payload: Any) -> None:
        found: dict[int, torch.UntypedStorage] = {}
        _storages(payload, found)
        ranges = sorted((start, storage) for start, storage in found.items() if storage.nbytes())
        self._starts = [start for start, _ in ranges]
        self._storages = [storage for _, storage in ranges]

    def view(self, buffer: memoryview) -> memoryview | None:
        """`buffer` as a view that keeps its tensor's storage alive, if the payload owns it."""
        if not self._starts or buffer.nbytes == 0:
            return None
        address = int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        storage, start = self._storages[index], self._starts[index]
        offset = address - start
        if offset + buffer.nbytes > storage.nbytes():
            return None
        whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        return whole.numpy().data[offset : offset + buffer.nbytes]


def _storages(value: Any, found: dict[int, torch.UntypedStorage]) -> None:
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and value.layout == torch.strided:
            storage = value.untyped_storage()
            found[storage.data_ptr()] = storage
    elif isinstance(value, dict):
        for item in value.values():
            _storages(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _storages(item, found)


class HashingWriter:
    """Writes to `handle` and hashes what it writes; announces the first bytes; keeps errors."""

    def __init__(
        self, handle: WritableFile, announce: Callable[[], None], *, payload: Any = None
    ) -> None:
        self._handle = handle
        self._announce: Callable[[], None] | None = announce
        self._memory = PayloadMemory(payload)
        self._sha256 = hashlib.sha256()
        # One worker: updates run in the order they were queued, as sha256 needs.
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainbox-sha256")
        self._last: Future[None] | None = None
        # The first OSError of a write or flush (ENOSPC...), which torch.save would mask.
        self.failure: OSError | None = None

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._helper.shutdown(wait=True)

    def hexdigest(self) -> str:
        """The SHA-256 of every byte written so far (waits for the queued hashing)."""
        if self._last is not None:
            self._last.result()
        return self._sha256.hexdigest()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        with self._keeping_failure():
            if view.nbytes < _COPY_BELOW_BYTES:
                self._queue(bytes(view))
                self._write_all(view)
            elif (owned := self._memory.view(view)) is not None:
                self._queue(owned)
                self._write_all(view)
            else:
                hashed = self._queue(view)
                try:
                    self._write_all(view)
                finally:
                    # Not the payload's memory: torch may free it once we return.
                    hashed.result()
            if self._announce is not None and view.nbytes:
                # Flushed first, so whoever looks at this point finds a torso in the file.
                self._handle.flush()
                announce, self._announce = self._announce, None
                announce()
        return view.nbytes

    def flush(self) -> None:
        with self._keeping_failure():
            self._handle.flush()

    def _queue(self, data: bytes | memoryview) -> Future[None]:
        self._last = self._helper.submit(self._sha256.update, data)
        return self._last

    def _write_all(self, view: memoryview) -> None:
        # A raw file may take part of a write; what is hashed must be what lands.
        done = 0
        while done < view.nbytes:
            done += self._handle.write(view[done:]) or 0

    @contextlib.contextmanager
    def _keeping_failure(self) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            self.failure = self.failure or err
            raise
