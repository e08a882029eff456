"""The loop's one view of its data: the Batches protocol that map-style and streamed batches
both implement, and the Loading settings they share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainbox.train.data.workers import MOST_STUCK_AFTER_S


@dataclass(frozen=True, kw_only=True, slots=True)
class Loading:
    """How this rank loads its batches, the same for every kind of data."""

    # Samples per micro-batch on this rank.
    batch_size: int
    # This process's rank.
    rank: int
    # How many ranks share the data.
    world_size: int
    # The run seed: with rank, world size and position it fixes the order.
    seed: int
    # DataLoader worker processes (0: load in this process).
    num_workers: int
    # Pinned host memory, for a copy to a GPU that overlaps compute.
    pin_memory: bool
    # A starting worker silent this long is stuck in its fork (train/data/workers.py).
    stuck_after_s: float = MOST_STUCK_AFTER_S
    # Called in each worker as it starts (CPU pinning), or None.
    worker_init: Callable[[int], None] | None = None


class Batches(Protocol):
    """Endless micro-batches in an order fixed by seed, rank, world size and position."""

    # Samples this rank replaced so far (corrupt ones a stream skipped).
    skipped: int

    def agree(self) -> None:
        """Before anything is written: check with every rank that the data is whole. Collective."""

    def resume(self, saved: Mapping[str, Any] | None, *, micro_batches_done: int) -> None:
        """Continue from a checkpoint's data position (None: it holds none) or the step count."""

    def saved_position(self, micro_batches_done: int) -> Mapping[str, Any] | None:
        """What a checkpoint records of the position; None when the step count says it all."""

    def total_skipped(self, device: torch.device) -> int | None:
        """The whole run's replaced samples, all ranks together (collective where a kind can
        replace samples); None where it cannot."""

    def epoch_at(self, micro_batches_done: int) -> int:
        """The epoch of the position after `micro_batches_done` micro-batches."""

    def batches_from(self, micro_batches_done: int) -> Iterator[Any]:
        """Micro-batches from the position after `micro_batches_done` on."""
