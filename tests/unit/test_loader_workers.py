"""DataLoader workers are seen to start, and a worker stuck in its fork is replaced unseen.

The real fault (python/cpython#112275) is a child blocked inside os.fork on the interpreter's
lock, before any of its code runs; it strikes about one fork in a thousand and only on older
Pythons. Here a worker blocks instead before its first line of worker code, which its parent
cannot tell apart: no report comes, and SIGTERM does not end it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs
from torch.utils.data import DataLoader, Dataset, get_worker_info

from trainbox.errors import TrainboxError
from trainbox.train.data import workers
from trainbox.train.data.workers import CheckedLoader

QUICK_S = 2.0


class WorkerSeeds(Dataset[tuple[int, int]]):
    """Each sample: its index and the seed of the worker that loaded it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> tuple[int, int]:
        info = get_worker_info()
        return index, -1 if info is None else info.seed


class StuckFirst:
    """A worker_init_fn for the first `stuck` loaders made: their worker 0 never gets going."""

    def __init__(self, stuck: int) -> None:
        self.left = stuck

    def wrap(self, init: Callable[[int], None]) -> Callable[[int], None]:
        self.left -= 1
        return init if self.left < 0 else _Hang(init)


class _Hang:
    def __init__(self, then: Callable[[int], None]) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        while worker_id == 0:
            time.sleep(3600)
        self.then(worker_id)


def builder(
    generator: torch.Generator, *, workers_: int = 2, persistent: bool = False, hang: Any = None
) -> Callable[[Callable[[int], None]], DataLoader[Any]]:
    def build(init: Callable[[int], None]) -> DataLoader[Any]:
        return DataLoader(
            WorkerSeeds(),
            batch_size=3,
            num_workers=workers_,
            worker_init_fn=hang.wrap(init) if hang is not None else init,
            persistent_workers=persistent,
            generator=generator,
        )

    return build


def batches(loader: Any) -> list[list[int]]:
    return [[int(i) for i in index] + [int(s) for s in seed] for index, seed in loader]


def test_a_worker_stuck_in_its_fork_is_replaced_and_the_batches_do_not_change() -> None:
    plain = batches(CheckedLoader(builder(torch.Generator().manual_seed(5)), stuck_after_s=60))
    before = set(multiprocessing.active_children())
    stuck = CheckedLoader(
        builder(torch.Generator().manual_seed(5), hang=StuckFirst(1)), stuck_after_s=QUICK_S
    )
    assert batches(stuck) == plain
    # The worker seeds came from the same generator state: a retry draws nothing new.
    assert all(seed != -1 for row in plain for seed in row[3:])
    assert set(multiprocessing.active_children()) <= before


def test_the_stuck_worker_is_named_in_a_warning_and_killed() -> None:
    loader = CheckedLoader(
        builder(torch.Generator().manual_seed(0), hang=StuckFirst(1)), stuck_after_s=QUICK_S
    )
    with capture_logs() as logs:
        batches(loader)
    [warning] = [line for line in logs if line["log_level"] == "warning"]
    assert warning["event"] == "data loader worker stuck at start; making the loader again"
    [pid] = warning["pids"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_workers_stuck_three_times_in_a_row_stop_the_run_with_a_hint() -> None:
    loader = CheckedLoader(
        builder(torch.Generator().manual_seed(0), workers_=1, hang=StuckFirst(workers.TRIES)),
        stuck_after_s=0.5,
    )
    with pytest.raises(TrainboxError, match=r"stuck at start 3 times.*HINT: .*cpython#112275"):
        iter(loader)


def test_kept_workers_are_started_once_and_not_checked_again() -> None:
    loader = CheckedLoader(
        builder(torch.Generator().manual_seed(0), persistent=True), stuck_after_s=QUICK_S
    )
    first = batches(loader)
    alive = set(multiprocessing.active_children())
    assert batches(loader) == first
    assert set(multiprocessing.active_children()) == alive


def test_a_loader_without_workers_loads_in_this_process() -> None:
    loader = CheckedLoader(builder(torch.Generator().manual_seed(0), workers_=0), stuck_after_s=1)
    assert all(seed == -1 for row in batches(loader) for seed in row[3:])


@pytest.mark.parametrize(
    ("timeout_s", "stuck_after_s"), [(600.0, 30.0), (120.0, 30.0), (40.0, 10.0), (2.0, 0.5)]
)
def test_a_worker_counts_as_stuck_after_a_quarter_of_the_timeout_at_most_30_s(
    timeout_s: float, stuck_after_s: float
) -> None:
    assert workers.stuck_after(timeout_s) == stuck_after_s


def test_a_spawned_worker_writes_no_pid_to_a_file_it_does_not_have() -> None:
    # A spawned worker gets the loader pickled, not the parent's files: fd numbers name others.
    def build(init: Callable[[int], None]) -> DataLoader[Any]:
        return DataLoader(
            WorkerSeeds(), batch_size=6, num_workers=1, worker_init_fn=init,
            multiprocessing_context="spawn", generator=torch.Generator().manual_seed(0),
        )  # fmt: skip

    _loader, batches_ = workers.started(build, init=None, stuck_after_s=QUICK_S)
    assert [index.tolist() for index, _ in batches_] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
