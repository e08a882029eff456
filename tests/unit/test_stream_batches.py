"""StreamBatches with real DataLoader workers: equal batches on every rank, each sample at most
once per epoch, more workers than shards, and a resume that continues with the next batch."""

from __future__ import annotations

import functools
import io
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from trainbox.errors import UsageError
from trainbox.streams import plan
from trainbox.streams.dataset import ShardStream, StreamBatch
from trainbox.streams.shards import Shard, read_manifest, write_manifest, write_shard
from trainbox.train.data.seam import Loading
from trainbox.train.data.streams import StreamBatches


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
        shards.append(Shard(location=str(path), samples=size, size=path.stat().st_size))
        number += size
    return ShardStream(read_manifest(write_manifest(tmp_path, shards), key="k"), window=3)


def batches(
    stream: ShardStream,
    *,
    rank: int,
    world: int,
    workers: int,
    start: int,
    count: int,
    started: Path | None = None,
):
    """`count` batches from `start` on; each worker that starts leaves a file in `started`."""
    made = StreamBatches(
        stream,
        Loading(
            batch_size=2,
            rank=rank,
            world_size=world,
            seed=5,
            num_workers=workers,
            pin_memory=False,
            worker_init=None if started is None else functools.partial(mark_started, started),
        ),
    )
    taken = itertools.islice(made.batches_from(start), count)
    return made, [batch[0][:, 0].int().tolist() for batch in taken]


def mark_started(folder: Path, worker_id: int) -> None:
    (folder / f"{os.getpid()}-{worker_id}").touch()


def planned(stream: ShardStream, made: StreamBatches, rank: int, epoch: int = 0) -> list[list[int]]:
    """The batches the plan gives `rank` in `epoch`, as manifest indices (each input's value)."""
    epoch_plan = made.position(epoch * made.position(0).plan.per_rank).plan
    order = plan.epoch_order(stream.manifest.counts, seed=5, epoch=epoch)
    return [
        [stream.starts[shard] + member for shard, member in map(order.locate, batch)]
        for batch in plan.rank_batches(epoch_plan, rank)
    ]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # four workers on a small box
@pytest.mark.parametrize(("sizes", "world", "workers"), [((9, 1, 4), 3, 4), ((9, 1, 4, 7), 1, 3)])
def test_workers_give_a_rank_the_planned_batches_in_order_even_outnumbering_the_shards(
    tmp_path: Path, sizes: tuple[int, ...], world: int, workers: int
) -> None:
    stream = uneven(tmp_path, sizes)
    read = []
    for rank in range(world):
        # Nothing read yet: count=0 only makes the loader, for its plan.
        made, _ = batches(stream, rank=rank, world=world, workers=workers, start=0, count=0)
        per_rank = made.position(0).plan.per_rank
        assert per_rank == sum(sizes) // (world * 2)
        _, got = batches(stream, rank=rank, world=world, workers=workers, start=0, count=per_rank)
        assert got == planned(stream, made, rank)
        read += [i for batch in got for i in batch]
    assert len(read) == len(set(read)) == sum(sizes) - made.position(0).plan.dropped


def test_a_later_start_continues_with_the_very_next_batch_across_epochs(tmp_path: Path) -> None:
    stream = uneven(tmp_path, (9, 1, 4))
    started = [tmp_path / "whole", tmp_path / "later"]
    for folder in started:
        folder.mkdir()
    made, whole = batches(stream, rank=1, world=2, workers=2, start=0, count=7, started=started[0])
    _, later = batches(stream, rank=1, world=2, workers=2, start=2, count=5, started=started[1])
    assert later == whole[2:]
    # 3 batches an epoch: the 7 span three epochs, each the plan's, from the same 2 workers.
    assert whole == [b for epoch in range(3) for b in planned(stream, made, 1, epoch)][:7]
    assert [len(list(folder.iterdir())) for folder in started] == [2, 2]


def test_a_batch_larger_than_the_data_is_refused_at_start(tmp_path: Path) -> None:
    stream = uneven(tmp_path, (2, 1))
    with pytest.raises(UsageError) as caught:
        StreamBatches(
            stream,
            Loading(batch_size=2, rank=0, world_size=2, seed=0, num_workers=0, pin_memory=False),
        )
    assert "train.batch_size=2 on 2 ranks needs 4 samples per step" in caught.value.line()


@pytest.mark.parametrize(
    "saved",
    [
        {},
        {"epoch": "one"},
        {"seed": 0, "segments": "all"},
        {"seed": 0, "epoch": 0, "window": 1, "splits": [[1, 2, 1, 0]], "skipped": -1},
    ],
)
def test_a_checkpoints_position_that_cannot_be_read_is_one_line(
    tmp_path: Path, saved: dict[str, object]
) -> None:
    made = StreamBatches(
        uneven(tmp_path, (4, 4)),
        Loading(batch_size=2, rank=0, world_size=1, seed=0, num_workers=0, pin_memory=False),
    )
    with pytest.raises(UsageError) as caught:
        made.resume(saved, micro_batches_done=3)
    assert "the checkpoint's stream position is not one this trainbox reads" in caught.value.line()


def test_planning_at_ten_thousand_shards_reads_the_manifest_and_no_shard(tmp_path: Path) -> None:
    # None of the shards exists: opening one would fail, so planning must not.
    shards = [
        Shard(location=str(tmp_path / f"absent-{i}.tar"), samples=100 + i % 37, size=1)
        for i in range(10_000)
    ]
    stream = ShardStream(read_manifest(write_manifest(tmp_path, shards), key="k"), window=64)
    made = StreamBatches(
        stream,
        Loading(batch_size=32, rank=4095, world_size=4096, seed=1, num_workers=8, pin_memory=False),
    )
    epoch_plan = made.position(10**6).plan
    first = next(plan.rank_batches(epoch_plan, 4095))
    assert len(first) == 32
    assert epoch_plan.per_rank == stream.starts[-1] // (4096 * 32)


@pytest.mark.parametrize(("rank", "carried"), [(0, 5), (1, 0)])
def test_a_resume_gives_the_checkpoints_skipped_count_to_rank_0_alone(
    tmp_path: Path, rank: int, carried: int
) -> None:
    made = StreamBatches(
        uneven(tmp_path, (4, 4)),
        Loading(batch_size=2, rank=rank, world_size=2, seed=0, num_workers=0, pin_memory=False),
    )
    saved = {**made.position(1).to_dict(), "skipped": 5}
    made.resume(saved, micro_batches_done=1)
    assert made.skipped == carried


def test_a_streams_batch_is_a_tuple_a_pinning_loader_walks_into() -> None:
    # A DataLoader with pin_memory=True pins the tensors inside tuples (named ones included)
    # and hands other objects on as they are; pinning itself needs a GPU, so this checks the
    # shape that lets it happen.
    batch = StreamBatch(batch=(torch.zeros(2), torch.ones(2)), skipped=(), key=(0, 0))
    assert isinstance(batch, tuple)
    assert type(batch)(*batch) == batch
