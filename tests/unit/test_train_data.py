"""Data order: resuming at any micro-batch continues exactly where the uninterrupted run was."""

from __future__ import annotations

import itertools
import os
import pickle

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from trainbox.errors import UsageError
from trainbox.train.data.map_style import (
    EpochIndex,
    Position,
    TrainBatches,
    eval_batch_count,
    eval_batches,
)
from trainbox.train.data.seam import Loading

DATASET = TensorDataset(torch.arange(50).float().unsqueeze(1), torch.arange(50))


def batches(rank: int = 0, world: int = 2, batch: int = 4, workers: int = 0) -> TrainBatches:
    return TrainBatches(
        DATASET,
        Loading(
            batch_size=batch,
            rank=rank,
            world_size=world,
            seed=3,
            num_workers=workers,
            pin_memory=False,
        ),
    )


def ids(stream: object, count: int) -> list[list[int]]:
    return [targets.tolist() for _, targets in itertools.islice(stream, count)]  # type: ignore[call-overload]


def test_each_epoch_has_whole_batches_of_this_ranks_shard() -> None:
    # 50 samples over 2 ranks: 25 each, 6 batches of 4, the last sample dropped.
    assert batches().per_epoch == 6


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("done", [0, 1, 5, 6, 7, 13])
def test_resuming_continues_the_same_sequence(done: int, workers: int) -> None:
    source = batches(workers=workers)
    uninterrupted = ids(source.iterate(Position(epoch=0, batch=0)), done + 5)
    resumed = ids(source.iterate(source.position(done)), 5)
    assert resumed == uninterrupted[done:]


def test_epochs_reshuffle() -> None:
    source = batches()
    first, second = (
        ids(source.iterate(Position(epoch=0, batch=0)), 12)[:6],
        ids(source.iterate(Position(epoch=1, batch=0)), 6),
    )
    assert first != second


def test_ranks_see_disjoint_samples() -> None:
    rank0 = {
        i for batch in ids(batches(rank=0).iterate(Position(epoch=0, batch=0)), 6) for i in batch
    }
    rank1 = {
        i for batch in ids(batches(rank=1).iterate(Position(epoch=0, batch=0)), 6) for i in batch
    }
    assert not rank0 & rank1


def test_batch_larger_than_the_shard_is_a_usage_error() -> None:
    with pytest.raises(
        UsageError, match=r"train.batch_size=26 is larger than this rank's shard of 25 samples"
    ):
        batches(batch=26)


@pytest.mark.parametrize(("size", "world"), [(10, 1), (10, 3), (7, 4), (2, 3), (11, 8)])
def test_eval_shards_cover_every_sample_exactly_once(size: int, world: int) -> None:
    shards = [
        eval_batches(size, batch_size=3, rank=rank, world_size=world) for rank in range(world)
    ]
    assert sorted(i for shard in shards for batch in shard for i in batch) == list(range(size))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_eval_batches_are_the_same_at_every_world_size(world: int) -> None:
    """Batch b is samples [3b, 3b + 3) on rank b % W, whatever W is: its float sums keep their bits."""
    shards = [eval_batches(11, batch_size=3, rank=rank, world_size=world) for rank in range(world)]
    for rank, shard in enumerate(shards):
        assert shard == [[i for i in range(3 * b, min(3 * b + 3, 11))]
                         for b in range(rank, 4, world)]  # fmt: skip
    assert max(len(shard) for shard in shards) == eval_batch_count(
        11, batch_size=3, world_size=world
    )


class Pids(Dataset[tuple[int, int]]):
    """Item i: (i, the id of the process that loaded it)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, os.getpid()


def test_workers_live_across_epochs() -> None:
    source = TrainBatches(
        Pids(), Loading(batch_size=4, rank=0, world_size=1, seed=0, num_workers=1, pin_memory=False)
    )
    # Three epochs of 4 batches: one worker process loaded them all (no fork per epoch).
    stream = itertools.islice(source.iterate(Position(epoch=0, batch=0)), 12)
    pids = {pid for _, loaded_by in stream for pid in loaded_by.tolist()}
    assert len(pids) == 1
    assert pids != {os.getpid()}


class Epochs(Dataset[tuple[int, int]]):
    """Item i: (i, the epoch its index carries; -1 without one). Has set_epoch: opts in."""

    def __len__(self) -> int:
        return 8

    def set_epoch(self, epoch: int) -> None:
        del epoch

    def __getitem__(self, index: int) -> tuple[int, int]:
        return int(index), getattr(index, "epoch", -1)


@pytest.mark.parametrize("workers", [0, 1])
def test_indices_carry_their_epoch_to_the_dataset(workers: int) -> None:
    source = TrainBatches(
        Epochs(),
        Loading(batch_size=4, rank=0, world_size=1, seed=0, num_workers=workers, pin_memory=False),
    )
    stream = itertools.islice(source.iterate(Position(epoch=2, batch=1)), 5)
    epochs = [carried.tolist() for _, carried in stream]
    # The rest of epoch 2 (one batch), then whole epochs 3 and 4.
    assert epochs == [[2] * 4, [3] * 4, [3] * 4, [4] * 4, [4] * 4]


def test_plain_datasets_get_plain_int_indices() -> None:
    seen: list[type] = []

    class Plain(Dataset[int]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> int:
            seen.append(type(index))
            return index

    source = TrainBatches(
        Plain(),
        Loading(batch_size=4, rank=0, world_size=1, seed=0, num_workers=0, pin_memory=False),
    )
    list(itertools.islice(source.iterate(Position(epoch=0, batch=0)), 4))
    assert set(seen) == {int}


def test_epoch_indices_survive_pickling() -> None:
    index = EpochIndex(7, epoch=3)
    copy = pickle.loads(pickle.dumps(index))
    assert (copy, copy.epoch, [10, 11, 12, 13, 14, 15, 16, 17][copy]) == (7, 3, 17)
