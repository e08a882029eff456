"""Data order: resuming at any micro-batch continues exactly where the uninterrupted run was."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from trainbox.errors import UsageError
from trainbox.train.data import Position, TrainBatches, eval_indices

DATASET = TensorDataset(torch.arange(50).float().unsqueeze(1), torch.arange(50))


def batches(rank: int = 0, world: int = 2, batch: int = 4) -> TrainBatches:
    return TrainBatches(
        DATASET,
        batch_size=batch,
        rank=rank,
        world_size=world,
        seed=3,
        num_workers=0,
        pin_memory=False,
    )


def ids(stream: object, count: int) -> list[list[int]]:
    return [targets.tolist() for _, targets in itertools.islice(stream, count)]  # type: ignore[call-overload]


def test_each_epoch_has_whole_batches_of_this_ranks_shard() -> None:
    # 50 samples over 2 ranks: 25 each, 6 batches of 4, the last sample dropped.
    assert batches().per_epoch == 6


@pytest.mark.parametrize("done", [0, 1, 5, 6, 7, 13])
def test_resuming_continues_the_same_sequence(done: int) -> None:
    source = batches()
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


@pytest.mark.parametrize(("size", "world"), [(10, 1), (10, 3), (7, 4), (2, 3)])
def test_eval_shards_cover_every_sample_exactly_once(size: int, world: int) -> None:
    shards = [eval_indices(size, rank=rank, world_size=world) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
