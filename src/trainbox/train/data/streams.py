"""Training batches from a sharded stream: the plan's batches of this rank, from one DataLoader
whose workers last the run, and the position that checkpoints hold and resumes (at any world
size) continue."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader, Sampler

from trainbox.distributed import consensus
from trainbox.errors import UsageError
from trainbox.logs import log
from trainbox.streams import plan
from trainbox.streams.dataset import PlannedReader, ReadFailure, ShardStream, StreamBatch
from trainbox.streams.shards import HINT, missing_or_short
from trainbox.train.data.map_style import epoch_seed
from trainbox.train.data.seam import Loading
from trainbox.train.data.workers import CheckedLoader


class StreamBatches:
    """Endless micro-batches of a ShardStream: every rank the same number per epoch."""

    def __init__(self, stream: ShardStream, loading: Loading) -> None:
        self.stream, self.loading = stream, loading
        self.rank, self.world_size = loading.rank, loading.world_size
        self.seed, self.total = loading.seed, len(stream)
        # Lanes per rank: data.args.lanes, else this process's workers, until the ranks agree.
        self.lanes = stream.lanes or max(1, loading.num_workers)
        batch_size, world_size = loading.batch_size, loading.world_size
        first = self._first_plan(batch_size)
        if first.per_rank == 0:
            raise UsageError(
                f"train.batch_size={batch_size} on {world_size} ranks needs"
                f" {batch_size * world_size} samples per step; {stream.manifest.location} holds"
                f" {self.total}",
                hint="lower train.batch_size or use fewer processes",
            )
        # Where the run's first micro-batch comes from, and how many micro-batches precede it.
        self.base, self.base_micro = plan.StreamPosition(plan=first, done=0), 0
        # Corrupt samples this rank stood in for (data.args.on_corrupt=skip); rank 0's count
        # also holds those of the run before a resume.
        self.skipped = 0

    def _first_plan(self, batch_size: int) -> plan.EpochPlan:
        return plan.first_plan(
            seed=self.seed,
            epoch=0,
            total=self.total,
            world_size=self.world_size,
            batch_size=batch_size,
            lanes=self.lanes,
            window=self.stream.window,
        )

    def agree(self) -> None:
        """Before anything is written, every rank: size its share of the shards (one stat or
        request per shard in the job; a pipe: shard is not sized) and stop with exit 2 together
        if any is missing or shorter than written; then take rank 0's lanes, which the
        checkpoint records. Collective."""
        mine = self.stream.manifest.shards[self.rank :: self.world_size]
        found = [consensus.Problem(text=line, hint=HINT) for line in missing_or_short(mine)]
        consensus.raise_together(found)
        self.lanes = int(consensus.from_rank0(self.lanes))
        self.base = plan.StreamPosition(plan=self._first_plan(self.base.plan.batch_size), done=0)

    def resume(self, saved: Mapping[str, Any] | None, *, micro_batches_done: int) -> None:
        """Continue from a checkpoint's stream position (re-split if the world changed), or
        from `micro_batches_done` of the plan when the checkpoint holds none."""
        if saved is None:
            self.base = plan.advance(self.base, micro_batches_done, total=self.total)
        else:
            try:
                at = plan.position_from_dict(saved, total=self.total)
                carried = int(saved.get("skipped", 0))
                if carried < 0:
                    raise ValueError(f"{carried} samples skipped")
            except (KeyError, TypeError, ValueError) as err:
                raise UsageError(
                    f"the checkpoint's stream position is not one this trainbox reads ({err!r})",
                    hint="resume with the trainbox version that wrote it, or start a new run_dir",
                ) from err
            # Counted once in the job: rank 0 carries the earlier run's total.
            self.skipped = carried if self.rank == 0 else 0
            moved = plan.replan(
                at,
                world_size=self.world_size,
                batch_size=self.base.plan.batch_size,
                lanes=self.lanes,
            )
            if moved is not at and self.rank == 0:
                log.warning(
                    "stream re-split over a new world size",
                    epoch=moved.plan.epoch,
                    from_world_size=at.plan.world_size,
                    to_world_size=self.world_size,
                    remaining=moved.plan.total,
                )
            self.base = plan.advance(moved, 0, total=self.total)
        self.base_micro = micro_batches_done

    def total_skipped(self, device: torch.device) -> int:
        """The replaced samples of the whole run, all ranks together (one all-reduce)."""
        count = torch.tensor([self.skipped], dtype=torch.int64, device=device)
        if torch_dist.is_initialized():
            torch_dist.all_reduce(count)
        return int(count.item())

    def saved_position(self, micro_batches_done: int) -> Mapping[str, Any]:
        """The stream position a checkpoint records, which a resume at any world size reads."""
        return self.position(micro_batches_done).to_dict()

    def position(self, micro_batches_done: int) -> plan.StreamPosition:
        """The position after `micro_batches_done` micro-batches since the start of training."""
        return plan.advance(self.base, micro_batches_done - self.base_micro, total=self.total)

    def epoch_at(self, micro_batches_done: int) -> int:
        """The epoch of the position after `micro_batches_done` micro-batches."""
        return self.position(micro_batches_done).epoch

    def batches_from(self, micro_batches_done: int) -> Iterator[Any]:
        """Micro-batches from the position after `micro_batches_done` on."""
        return self.iterate(self.position(micro_batches_done))

    def iterate(self, start: plan.StreamPosition) -> Iterator[Any]:
        """Micro-batches from `start` on, from one DataLoader whose workers live for the run:
        they take the batches' keys epoch after epoch, each worker a lane front to back, and
        read ahead across an epoch's end as within an epoch."""
        batches = iter(self._loader(start))
        position = start
        while True:
            epoch_plan = position.plan
            if self.rank == 0:
                log.info(
                    "stream epoch",
                    epoch=epoch_plan.epoch,
                    steps=epoch_plan.per_rank,
                    start=position.done,
                    dropped=epoch_plan.dropped,
                    samples=epoch_plan.total,
                )
            for batch in range(position.done, epoch_plan.per_rank):
                yield self._taken(next(batches), (epoch_plan.epoch, batch))
            position = plan.advance(position, epoch_plan.per_rank - position.done, total=self.total)

    def _loader(self, start: plan.StreamPosition) -> CheckedLoader[StreamBatch | ReadFailure]:
        """One pass over every batch key from `start` on, read by `start`'s plan."""
        reader = PlannedReader(self.stream, start.plan, rank=self.rank)
        # The workers' seeds are drawn from it, not from torch's global generator, whose stream
        # is the model's (dropout): a resume would shift it.
        generator = torch.Generator()
        generator.manual_seed(epoch_seed(self.seed, rank=self.rank, epoch=start.epoch))
        return CheckedLoader(
            lambda init: DataLoader(
                reader,
                batch_size=None,
                sampler=BatchKeys(start, total=self.total),
                collate_fn=as_read,
                num_workers=self.loading.num_workers,
                pin_memory=self.loading.pin_memory,
                worker_init_fn=init,
                # One endless pass: its workers last as long as it does.
                persistent_workers=False,
                generator=generator,
            ),
            init=self.loading.worker_init,
            stuck_after_s=self.loading.stuck_after_s,
        )

    def _taken(self, item: StreamBatch | ReadFailure, key: tuple[int, int]) -> Any:
        """The batch of `item`, which must be the plan's `key`; its replaced samples counted."""
        if isinstance(item, ReadFailure):
            raise UsageError(item.line, hint=item.hint)
        if item.key != key:
            # Every rank takes the plan's batches, in its order: anything else could leave a
            # rank short of steps, and the others waiting on it.
            raise RuntimeError(f"the stream gave batch {item.key}, not {key}")
        for line in item.skipped:
            self.skipped += 1
            log.warning("corrupt sample replaced", sample=line, skipped=self.skipped)
        return item.batch


class BatchKeys(Sampler[tuple[int, int]]):
    """The (epoch, micro-batch) keys of a rank's batches from a position on, without end."""

    def __init__(self, start: plan.StreamPosition, *, total: int) -> None:
        self.start, self.total = start, total

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return plan.batch_keys(self.start, total=self.total)


def as_read(item: Any) -> Any:
    """The loader's collate_fn, given one StreamBatch or ReadFailure at a time (batch_size=None,
    which torch's annotation of a list does not cover): the reader collates its batches itself,
    and torch's default here (default_convert) would turn a StreamBatch's tuples into lists."""
    return item
