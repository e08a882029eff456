"""Data order: DistributedSampler shards, drop-last batches, and a position that can be resumed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from trainbox.errors import UsageError
from trainbox.train.data import batches
from trainbox.train.data.seam import Loading
from trainbox.train.data.workers import MOST_STUCK_AFTER_S, CheckedLoader


@dataclass(frozen=True, kw_only=True, slots=True)
class Position:
    """Where the next micro-batch comes from."""

    # Epoch number, the DistributedSampler's set_epoch argument.
    epoch: int
    # Micro-batches of this epoch already consumed.
    batch: int


class IndexSampler(Sampler[int]):
    """Yields a fixed list of indices (one epoch's shard from `batch` on)."""

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class EpochIndex(int):
    """An item index that also carries its epoch (`.epoch`), for datasets with set_epoch.

    It travels with the index to DataLoader workers, where a dataset.set_epoch made in the main
    process never arrives (persistent workers keep their copy of the dataset).
    """

    epoch: int

    def __new__(cls, index: int, epoch: int) -> EpochIndex:
        made = super().__new__(cls, index)
        made.epoch = epoch
        return made

    def __reduce__(self) -> tuple[type[EpochIndex], tuple[int, int]]:
        return EpochIndex, (int(self), self.epoch)


class EpochSampler(Sampler[int]):
    """One epoch of this rank's shard from a position on; `at` moves it before each epoch.

    The DataLoader keeps it (and, with workers, its worker processes) across epochs; the order
    is still DistributedSampler's for (seed, epoch), so a resume at any micro-batch is exact.
    """

    def __init__(self, shard: DistributedSampler[Any], *, batch_size: int, tag: bool) -> None:
        self.shard, self.batch_size, self.tag = shard, batch_size, tag
        self.epoch = 0
        self.indices: list[int] = []

    def at(self, position: Position) -> None:
        self.shard.set_epoch(position.epoch)
        self.epoch = position.epoch
        self.indices = list(self.shard)[position.batch * self.batch_size :]

    def __iter__(self) -> Iterator[int]:
        if not self.tag:
            return iter(self.indices)
        epoch = self.epoch
        # Made one by one as the loader asks: an epoch's worth at once would be a large list.
        return (EpochIndex(index, epoch) for index in self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class TrainBatches:
    """Endless micro-batches of a map-style dataset, in an order fixed by seed, rank, world size
    and position; the step count alone says where they resume."""

    def __init__(self, dataset: Any, loading: Loading) -> None:
        self.dataset, self.loading = dataset, loading
        self.batch_size, self.seed, self.rank = loading.batch_size, loading.seed, loading.rank
        # Map-style samples are never replaced: a bad one fails the run.
        self.skipped = 0
        world_size = loading.world_size
        # shuffle + padding: every rank gets the same number of samples, so the same steps.
        self.sampler: DistributedSampler[int] = DistributedSampler(
            dataset, num_replicas=world_size, rank=self.rank, shuffle=True, seed=self.seed,
            drop_last=False,
        )  # fmt: skip
        self.per_epoch = len(self.sampler) // self.batch_size
        if self.per_epoch == 0:
            raise UsageError(
                f"train.batch_size={self.batch_size} is larger than this rank's shard of"
                f" {len(self.sampler)} samples ({len(dataset)} samples over {world_size} ranks)",
                hint="lower train.batch_size or use fewer processes",
            )

    def agree(self) -> None:
        """Nothing to agree on: a map-style dataset is whole once it is built."""

    def resume(self, saved: Mapping[str, Any] | None, *, micro_batches_done: int) -> None:
        """Nothing to restore: the position follows from the step count (`position`)."""

    def saved_position(self, micro_batches_done: int) -> None:
        """None: a checkpoint's step count is the whole position."""
        del micro_batches_done

    def total_skipped(self, device: torch.device) -> None:
        """None: only a stream replaces samples, so there is nothing to add up."""
        del device

    def position(self, micro_batches_done: int) -> Position:
        """The position after `micro_batches_done` micro-batches since the start of training."""
        return Position(
            epoch=micro_batches_done // self.per_epoch, batch=micro_batches_done % self.per_epoch
        )

    def epoch_at(self, micro_batches_done: int) -> int:
        """The epoch of the position after `micro_batches_done` micro-batches."""
        return self.position(micro_batches_done).epoch

    def batches_from(self, micro_batches_done: int) -> Iterator[Any]:
        """Micro-batches from the position after `micro_batches_done` on."""
        return self.iterate(self.position(micro_batches_done))

    def iterate(self, start: Position) -> Iterator[Any]:
        """Micro-batches from `start` on, epoch after epoch, from one DataLoader (workers kept)."""
        loading, set_epoch = self.loading, getattr(self.dataset, "set_epoch", None)
        sampler = EpochSampler(self.sampler, batch_size=self.batch_size, tag=callable(set_epoch))
        # Starting an epoch draws the workers' base seed from the loader's generator, by default
        # torch's global one, which also feeds dropout: a resume would shift that stream. Our
        # own generator, reseeded per epoch, keeps the global stream the model's alone.
        generator = torch.Generator()
        loader = CheckedLoader(
            lambda init: DataLoader(
                self.dataset,
                batch_size=self.batch_size,
                sampler=sampler,
                drop_last=True,
                num_workers=loading.num_workers,
                pin_memory=loading.pin_memory,
                worker_init_fn=init,
                persistent_workers=loading.num_workers > 0,
                generator=generator,
            ),
            init=loading.worker_init,
            stuck_after_s=loading.stuck_after_s,
        )
        position = start
        while True:
            sampler.at(position)
            generator.manual_seed(epoch_seed(self.seed, rank=self.rank, epoch=position.epoch))
            if set_epoch is not None:
                # In-process loading sees it; workers read the epoch off each EpochIndex.
                set_epoch(position.epoch)
            yield from loader
            position = Position(epoch=position.epoch + 1, batch=0)


def epoch_seed(seed: int, *, rank: int, epoch: int) -> int:
    """The seed of one rank's loader generator in one epoch: the same on a resume."""
    return (seed * 1_000_003 + (rank + 1) * 7_919 + epoch) % 2**63


def eval_batches(size: int, *, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's validation batches: the set cut into batches in order, batch b to rank b % W.

    A batch holds the same samples at every world size, so its float sums have the same bits
    and the metrics do too (train/evaluate.py adds the batches in order). No padding: no sample
    counts twice, and a rank may get no batch at all.
    """
    starts = range(rank * batch_size, size, world_size * batch_size)
    return [list(range(start, min(start + batch_size, size))) for start in starts]


def eval_batch_count(size: int, *, batch_size: int, world_size: int) -> int:
    """The most validation batches any rank gets (rank 0's)."""
    return len(range(0, size, world_size * batch_size))


def eval_loader(
    dataset: Any,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    num_workers: int,
    stuck_after_s: float = MOST_STUCK_AFTER_S,
) -> CheckedLoader[Any]:
    """Batches of this rank's validation share (possibly none when ranks outnumber batches)."""
    shard = eval_batches(len(dataset), batch_size=batch_size, rank=rank, world_size=world_size)
    return CheckedLoader(
        lambda init: DataLoader(
            dataset,
            batch_sampler=shard,
            num_workers=num_workers,
            worker_init_fn=init,
            # Its own generator, so that an evaluation leaves torch's global RNG (dropout's)
            # alone.
            generator=torch.Generator().manual_seed(0),
            # Samples of any nesting, dataclasses too (a user's eval step takes them apart).
            collate_fn=batches.collate,
        ),
        stuck_after_s=stuck_after_s,
    )
