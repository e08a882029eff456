"""StreamBatches with real DataLoader workers: equal batches on every rank, each sample at most
once per epoch, more workers than shards, and a resume that continues with the next batch."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import pytest

from trainbox.errors import UsageError
from trainbox.streams.dataset import ShardStream
from trainbox.streams.shards import Shard, read_manifest, write_manifest, write_shard
from trainbox.train.streams import StreamBatches


def npy(value: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([value], np.float32))
    return buffer.getvalue()


def uneven(tmp_path: Path, sizes: tuple[int, ...]) -> ShardStream:
    """Shards of `sizes` samples; sample i's input is [i]."""
    shards, number = [], 0
    for index, size in enumerate(sizes):
        path = tmp_path / f"shard-{index}.tar"
        samples = [(f"k{number + i}", {"npy": npy(number + i), "cls": b"0"}) for i in range(size)]
        write_shard(path, samples)
        shards.append(Shard(path=path, samples=size, size=path.stat().st_size))
        number += size
    return ShardStream(read_manifest(write_manifest(tmp_path, shards), key="k"), window=3)


def batches(stream: ShardStream, *, rank: int, world: int, workers: int, start: int, count: int):
    made = StreamBatches(
        stream,
        batch_size=2,
        rank=rank,
        world_size=world,
        seed=5,
        num_workers=workers,
        pin_memory=False,
    )
    taken = itertools.islice(made.batches_from(start), count)
    return made, [batch[0][:, 0].int().tolist() for batch in taken]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # four workers on a small box
def test_more_workers_than_shards_gives_every_rank_its_batches(tmp_path: Path) -> None:
    stream = uneven(tmp_path, (9, 1, 4))
    per_rank = 14 // (3 * 2)
    read = []
    for rank in range(3):
        made, got = batches(stream, rank=rank, world=3, workers=4, start=0, count=per_rank)
        assert made.position(0).plan.per_rank == per_rank
        assert len(got) == per_rank
        read += [i for batch in got for i in batch]
    assert len(read) == len(set(read)) == 12
    assert made.position(0).plan.dropped == 2


def test_a_later_start_continues_with_the_very_next_batch_across_epochs(tmp_path: Path) -> None:
    stream = uneven(tmp_path, (9, 1, 4))
    _, whole = batches(stream, rank=1, world=2, workers=2, start=0, count=7)
    _, later = batches(stream, rank=1, world=2, workers=2, start=2, count=5)
    assert later == whole[2:]


def test_a_batch_larger_than_the_data_is_refused_at_start(tmp_path: Path) -> None:
    stream = uneven(tmp_path, (2, 1))
    with pytest.raises(UsageError) as caught:
        StreamBatches(
            stream, batch_size=2, rank=0, world_size=2, seed=0, num_workers=0, pin_memory=False
        )
    assert "train.batch_size=2 on 2 ranks needs 4 samples per step" in caught.value.line()
