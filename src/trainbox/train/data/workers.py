"""DataLoader worker processes that are seen to start: a worker stuck in its fork is replaced.

Python before 3.11.10 and 3.12.1 (Debian bookworm's 3.11.2, which the image runs, included) can
leave a forked child blocked for ever on the interpreter's thread-list lock, when another thread
held it at the moment of the fork (python/cpython#112275). In a rank that thread is one of
torch's: gloo's run loop taking the GIL to release a tensor that Python let go of. A DataLoader
worker caught so never runs, and its rank would wait on it until the hang watchdog ended the
run. So each worker reports its pid first thing; one silent for `stuck_after_s` is killed, and
the loader is made again with the same random state, so the batches do not change.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

import torch
from torch.utils.data import DataLoader

from trainbox.errors import TrainboxError
from trainbox.logs import log

T = TypeVar("T")
WorkerInit = Callable[[int], None]
# Makes the loader, passing the given worker_init_fn on to DataLoader.
Build = Callable[[WorkerInit], DataLoader[T]]

# A worker reports within milliseconds of its fork; a quarter of dist.timeout_s leaves the
# loader time to be made again before the hang watchdog would end the run.
MOST_STUCK_AFTER_S = 30.0
# Loaders made before giving up. Here about 1 fork in 1,000 got stuck (a native thread making
# thread states meanwhile): three in a row is something else.
TRIES = 3
# A stuck worker gets this long to be reaped once killed.
REAP_S = 10.0
_PID_BYTES = 4


def stuck_after(dist_timeout_s: float) -> float:
    """Seconds of silence after which a starting worker counts as stuck."""
    return min(MOST_STUCK_AFTER_S, dist_timeout_s / 4)


class Beacon:
    """A worker_init_fn that first writes this worker's pid to its parent's pipe."""

    def __init__(self, fd: int, then: WorkerInit | None) -> None:
        # The pipe's write end: a forked worker has the parent's file descriptors.
        self.fd = fd
        # The loader's own worker_init_fn, run after.
        self.then = then
        # Whether to write: only a forked worker has the pipe (a spawned one has other files).
        self.armed = False

    def __call__(self, worker_id: int) -> None:
        if self.armed:
            # Under PIPE_BUF bytes: one write, never interleaved with another worker's.
            os.write(self.fd, os.getpid().to_bytes(_PID_BYTES, "little"))
        if self.then is not None:
            self.then(worker_id)


class CheckedLoader(Generic[T]):
    """Iterates the DataLoader `build` makes, having seen each of its workers start."""

    def __init__(
        self, build: Build[T], *, init: WorkerInit | None = None, stuck_after_s: float
    ) -> None:
        self.build = build
        # The worker_init_fn the loader would have had.
        self.init = init
        self.stuck_after_s = stuck_after_s
        # A loader whose workers persist: later iterations fork nothing.
        self._kept: DataLoader[T] | None = None

    def __iter__(self) -> Iterator[T]:
        if self._kept is not None:
            return iter(self._kept)
        loader, batches = started(self.build, init=self.init, stuck_after_s=self.stuck_after_s)
        if loader.persistent_workers:
            self._kept = loader
        return batches


def started(
    build: Build[T], *, init: WorkerInit | None, stuck_after_s: float
) -> tuple[DataLoader[T], Iterator[T]]:
    """A loader from `build` and its iterator, every worker of which has started."""
    stuck_pids: list[int] = []
    for attempt in range(1, TRIES + 1):
        read_end, write_end = os.pipe()
        try:
            beacon = Beacon(write_end, init)
            loader = build(beacon)
            beacon.armed = _forks(loader)
            if not beacon.armed:
                return loader, iter(loader)
            state = _random_state(loader)
            before = set(multiprocessing.active_children())
            batches = iter(loader)
            workers = [p for p in multiprocessing.active_children() if p not in before]
            stuck = _silent(workers, read_end, until=time.monotonic() + stuck_after_s)
        finally:
            os.close(read_end)
            os.close(write_end)
        if not stuck:
            return loader, batches
        stuck_pids = [p.pid for p in stuck if p.pid is not None]
        log.warning(
            "data loader worker stuck at start; making the loader again",
            pids=stuck_pids,
            silent_s=stuck_after_s,
            attempt=attempt,
        )
        with _children_unwatched() as unwatched:
            if unwatched:
                # Killed first, so that the DataLoader's shutdown finds them gone and does not
                # wait its 5 s on each; no SIGCHLD handler sees them die.
                _kill(stuck)
            # Dropping the iterator shuts down the workers that started (the loader holds it
            # when workers persist) and forgets their pids.
            del batches, loader
        if not unwatched:
            _kill(stuck)
        _restore(state)
    raise TrainboxError(
        f"data loader workers stuck at start {TRIES} times in a row (last: pids {stuck_pids})",
        hint="a forked worker blocked before running any code; on Python older than 3.11.10"
        " this is a known fork deadlock (python/cpython#112275): use a newer Python, or set"
        " pinning.num_workers=0",
    )


@contextlib.contextmanager
def _children_unwatched() -> Iterator[bool]:
    """Whether SIGCHLD is left at its default meanwhile (in the main thread only).

    A DataLoader's SIGCHLD handler raises in the main thread when one of the workers it knows
    dies; only the iterator's shutdown makes it forget them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield True
    finally:
        # None: a handler set outside Python, which cannot be put back; the default stays.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL if previous is None else previous)


def _kill(stuck: list[BaseProcess]) -> None:
    for process in stuck:
        process.kill()
        process.join(REAP_S)


def _forks(loader: DataLoader[Any]) -> bool:
    """Whether iterating `loader` forks workers (the beacon's pipe needs fork)."""
    if loader.num_workers == 0:
        return False
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else None
    return (method or multiprocessing.get_start_method()) == "fork"


def _silent(workers: list[BaseProcess], fd: int, *, until: float) -> list[BaseProcess]:
    """The workers still alive that have not written their pid to `fd` by `until`."""
    waiting = {p.pid: p for p in workers}
    while waiting and (left := until - time.monotonic()) > 0:
        # Checked every second: a worker that died at start is the DataLoader's to report.
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            data = os.read(fd, 256 * _PID_BYTES)
            for at in range(0, len(data), _PID_BYTES):
                waiting.pop(int.from_bytes(data[at : at + _PID_BYTES], "little"), None)
        waiting = {pid: p for pid, p in waiting.items() if p.is_alive()}
    return list(waiting.values())


def _random_state(loader: DataLoader[Any]) -> tuple[torch.Generator | None, torch.Tensor]:
    """The generator that iterating `loader` draws its workers' seeds from, and its state."""
    generator = loader.generator
    if generator is None:
        return None, torch.random.get_rng_state()
    return generator, generator.get_state()


def _restore(state: tuple[torch.Generator | None, torch.Tensor]) -> None:
    generator, saved = state
    if generator is None:
        torch.random.set_rng_state(saved)
    else:
        generator.set_state(saved)
