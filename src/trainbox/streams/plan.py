"""The pure plan of one epoch over sharded samples: who reads what, in which order, and where a
run stands in it.

An epoch's order lays the shards end to end in an order shuffled from (seed, epoch), each
shard's members in file order. A plan cuts the part of that order still to read (its segments)
into one contiguous chunk per rank, the same whole number of micro-batches for every rank, and
drops (and counts) the remainder. A rank's chunk is cut again into lanes, one per DataLoader
worker, so each worker reads a few shards front to back; a rank's batches come from the lanes
in turn, the order in which a DataLoader hands its workers batches to make. Within a lane a
seeded shuffle permutes windows of samples: a shuffle buffer that is a pure function of the plan.
A batch is named by its (epoch, micro-batch) key: every later epoch's plan follows from the
run's first, so workers that last the run read any epoch's batches from their keys.

A plan made by re-splitting a running epoch over another world size has scattered segments
(up to about a shuffle window's worth per old lane), so a position is saved as the splits that
made it, a few integers each, and the segments are made again from them on load.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Segment = tuple[int, int]
# An earlier split of the same epoch: (world_size, batch_size, lanes, micro-batches done).
Split = tuple[int, int, int, int]


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochPlan:
    """How one epoch's remaining samples are split over the ranks."""

    # The run's seed: with the epoch it orders the shards and shuffles the windows.
    seed: int
    # The epoch number.
    epoch: int
    # [start, end) ranges of the epoch's order still to read when this plan was made.
    segments: tuple[Segment, ...]
    # Ranks that share the segments.
    world_size: int
    # Samples in one micro-batch on one rank.
    batch_size: int
    # Contiguous runs of batches per rank, read by one DataLoader worker each.
    lanes: int
    # Samples the shuffle buffer permutes at a time (1: members in file order).
    window: int
    # The splits of this epoch that came before (a re-split appends one), oldest first: they
    # make the segments again from the whole epoch.
    history: tuple[Split, ...] = ()
    # Queue position of each segment's start, and the total: made from the segments.
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths = (end - start for start, end in self.segments)
        object.__setattr__(self, "starts", tuple(itertools.accumulate(lengths, initial=0)))

    @property
    def total(self) -> int:
        """Samples the segments hold."""
        return self.starts[-1]

    @property
    def per_rank(self) -> int:
        """Micro-batches every rank takes under this plan (the same on every rank)."""
        return self.total // (self.world_size * self.batch_size)

    @property
    def dropped(self) -> int:
        """Samples of the segments that no rank reads under this plan."""
        return self.total - self.per_rank * self.world_size * self.batch_size


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPosition:
    """Where a stream stands: a plan, and the micro-batches each rank has taken under it."""

    # The plan in force.
    plan: EpochPlan
    # Micro-batches each rank has consumed under it.
    done: int

    @property
    def epoch(self) -> int:
        """The epoch it is in."""
        return self.plan.epoch

    def to_dict(self) -> dict[str, Any]:
        """Plain types, for a checkpoint: four integers per split of the epoch, whatever the
        world size, lanes and shuffle window (the segments are made again on load)."""
        plan = self.plan
        now = (plan.world_size, plan.batch_size, plan.lanes, self.done)
        return {
            "seed": plan.seed,
            "epoch": plan.epoch,
            "window": plan.window,
            "splits": [list(split) for split in (*plan.history, now)],
        }


def position_from_dict(saved: Mapping[str, Any], *, total: int) -> StreamPosition:
    """The StreamPosition `to_dict` gave, for an epoch of `total` samples (KeyError, TypeError
    or ValueError when it is not one)."""
    splits = [_split(split) for split in saved["splits"]]
    if not splits:
        raise ValueError("a stream position with no split")
    (world_size, batch_size, lanes, done), *later = splits
    plan = first_plan(
        seed=int(saved["seed"]),
        epoch=int(saved["epoch"]),
        total=total,
        world_size=world_size,
        batch_size=batch_size,
        lanes=lanes,
        window=int(saved["window"]),
    )
    position = _within(StreamPosition(plan=plan, done=done))
    for world_size, batch_size, lanes, done in later:
        if (world_size, batch_size) == (position.plan.world_size, position.plan.batch_size):
            raise ValueError(f"a split of {world_size} x {batch_size} repeats the one before")
        moved = replan(position, world_size=world_size, batch_size=batch_size, lanes=lanes)
        position = _within(StreamPosition(plan=moved.plan, done=done))
    return position


def _within(position: StreamPosition) -> StreamPosition:
    """`position`, when its plan has the micro-batches it says are done (else ValueError)."""
    if position.done > position.plan.per_rank:
        raise ValueError(f"{position.done} micro-batches done of {position.plan.per_rank}")
    return position


def _split(saved: Any) -> Split:
    """One saved split: four integers, the world size, batch size and lanes at least 1."""
    world_size, batch_size, lanes, done = (int(value) for value in saved)
    if min(world_size, batch_size, lanes) < 1 or done < 0:
        raise ValueError(f"not a split: {list(saved)}")
    return world_size, batch_size, lanes, done


def first_plan(
    *, seed: int, epoch: int, total: int, world_size: int, batch_size: int, lanes: int, window: int
) -> EpochPlan:
    """The plan of a whole epoch of `total` samples."""
    return EpochPlan(
        seed=seed,
        epoch=epoch,
        segments=_whole(total),
        world_size=world_size,
        batch_size=batch_size,
        lanes=max(1, lanes),
        window=max(1, window),
    )


def advance(position: StreamPosition, micro_batches: int, *, total: int) -> StreamPosition:
    """`micro_batches` further on; a finished epoch starts the next with the same split.

    ValueError when a whole epoch makes no micro-batch on each rank.
    """
    if micro_batches < 0:
        raise ValueError(f"cannot go back {-micro_batches} micro-batches")
    plan, done = position.plan, position.done + micro_batches
    if done < plan.per_rank:
        return StreamPosition(plan=plan, done=done)
    whole = plan_of_epoch(plan, plan.epoch + 1, total=total)
    if whole.per_rank == 0:
        raise ValueError(
            f"{total} samples make no micro-batch of {plan.batch_size} for each of"
            f" {plan.world_size} ranks"
        )
    epochs, done = divmod(done - plan.per_rank, whole.per_rank)
    return StreamPosition(plan=replace(whole, epoch=whole.epoch + epochs), done=done)


def plan_of_epoch(running: EpochPlan, epoch: int, *, total: int) -> EpochPlan:
    """The plan of `epoch` for a run whose plan in force is `running`: `running` itself in its
    own epoch, and in a later one the whole epoch under the same split (as `advance` moves on).
    So a reader that knows the run's first plan knows every later one from its epoch number."""
    if epoch < running.epoch:
        raise ValueError(f"epoch {epoch} comes before the plan's epoch {running.epoch}")
    if epoch == running.epoch:
        return running
    return replace(running, epoch=epoch, segments=_whole(total), history=())


def batch_keys(start: StreamPosition, *, total: int) -> Iterator[tuple[int, int]]:
    """(epoch, micro-batch) of each of a rank's micro-batches from `start` on, epoch after
    epoch without end: what a reader that knows `start`'s plan is asked for, in order."""
    position = start
    while True:
        for batch in range(position.done, position.plan.per_rank):
            yield position.epoch, batch
        position = advance(position, position.plan.per_rank - position.done, total=total)


def replan(
    position: StreamPosition, *, world_size: int, batch_size: int, lanes: int
) -> StreamPosition:
    """The same point of the epoch, split over another world size or batch size.

    What any rank had read stays read; the rest, the old plan's dropped tail included, is split
    afresh (and the old dropped count no longer applies).
    """
    plan, done = position.plan, position.done
    if (plan.world_size, plan.batch_size) == (world_size, batch_size):
        return position
    rest: list[Segment] = []
    for rank in range(plan.world_size):
        for lane in range(plan.lanes):
            rest += _unread(plan, rank, lane, taken=len(range(lane, done, plan.lanes)))
    rest += _cut(plan, plan.world_size * plan.per_rank * plan.batch_size, plan.total)
    new = replace(
        plan,
        segments=_merged(rest),
        world_size=world_size,
        batch_size=batch_size,
        lanes=max(1, lanes),
        history=(*plan.history, (plan.world_size, plan.batch_size, plan.lanes, done)),
    )
    return StreamPosition(plan=new, done=0)


def rank_batches(plan: EpochPlan, rank: int, start: int = 0) -> Iterator[list[int]]:
    """Rank `rank`'s micro-batches from `start` on, each as indices into the epoch's order."""
    for batch in range(start, plan.per_rank):
        yield batch_indices(plan, rank, batch)


def batch_indices(plan: EpochPlan, rank: int, batch: int) -> list[int]:
    """Micro-batch `batch` of rank `rank`: its samples as indices into the epoch's order."""
    lane, offset = batch % plan.lanes, batch // plan.lanes
    lo, hi = _lane_range(plan, rank, lane)
    first = lo + offset * plan.batch_size
    return [
        _order_index(plan, _shuffled(plan, lo, hi, q))
        for q in range(first, first + plan.batch_size)
    ]


def window_of(plan: EpochPlan, rank: int, index: int) -> list[int]:
    """Every sample of the shuffle window holding epoch-order `index`, in epoch order: what a
    reader loads together, front to back."""
    q = _queue_index(plan, index)
    for lane in range(plan.lanes):
        lo, hi = _lane_range(plan, rank, lane)
        if lo <= q < hi:
            w_lo, w_hi = _window(plan, lo, hi, q)
            return [_order_index(plan, i) for i in range(w_lo, w_hi)]
    raise ValueError(f"sample {index} is not in rank {rank}'s share")


def _whole(total: int) -> tuple[Segment, ...]:
    """The one segment of a whole epoch (none when there are no samples)."""
    return ((0, total),) if total else ()


def _unread(plan: EpochPlan, rank: int, lane: int, *, taken: int) -> list[Segment]:
    """The epoch-order ranges of a lane not yet read when `taken` of its batches were."""
    lo, hi = _lane_range(plan, rank, lane)
    read_to = lo + taken * plan.batch_size
    if read_to >= hi:
        return []
    # The window being read: the shuffle scattered its read samples over it.
    w_lo, w_hi = _window(plan, lo, hi, read_to)
    read = {_shuffled(plan, lo, hi, q) for q in range(w_lo, read_to)}
    pieces = [(q, q + 1) for q in range(w_lo, w_hi) if q not in read] + [(w_hi, hi)]
    return [segment for a, b in pieces for segment in _cut(plan, a, b)]


def _lane_range(plan: EpochPlan, rank: int, lane: int) -> Segment:
    """[lo, hi) of a lane in the plan's queue (its segments laid end to end)."""
    whole, extra = divmod(plan.per_rank, plan.lanes)
    before = lane * whole + min(lane, extra)
    lo = (rank * plan.per_rank + before) * plan.batch_size
    return lo, lo + (whole + (lane < extra)) * plan.batch_size


def _window(plan: EpochPlan, lo: int, hi: int, q: int) -> Segment:
    """The shuffle window of lane [lo, hi) that holds queue position `q`."""
    start = lo + (q - lo) // plan.window * plan.window
    return start, min(start + plan.window, hi)


def _shuffled(plan: EpochPlan, lo: int, hi: int, q: int) -> int:
    """The queue position that lane position `q` emits: each window permuted by the seed."""
    if plan.window == 1:
        return q
    w_lo, w_hi = _window(plan, lo, hi, q)
    return (
        w_lo + _permutation(plan.seed, plan.epoch, _order_index(plan, w_lo), w_hi - w_lo)[q - w_lo]
    )


@functools.lru_cache(maxsize=64)
def _permutation(seed: int, epoch: int, start: int, size: int) -> list[int]:
    """A window's shuffle, keyed by where it starts in the epoch's order (never by rank)."""
    order = list(range(size))
    random.Random(f"{seed}/{epoch}/{start}/{size}").shuffle(order)
    return order


def _order_index(plan: EpochPlan, q: int) -> int:
    """The epoch-order index at queue position `q` (a bisection: a re-split plan can hold
    many segments)."""
    if not 0 <= q < plan.total:
        raise IndexError("a queue position past the plan's segments")
    at = bisect.bisect_right(plan.starts, q) - 1
    return plan.segments[at][0] + q - plan.starts[at]


def _queue_index(plan: EpochPlan, index: int) -> int:
    """The queue position of epoch-order `index` (the inverse of _order_index). The segments
    rise: a plan's are always merged and sorted."""
    at = bisect.bisect_right(plan.segments, (index, math.inf)) - 1
    if at < 0 or not plan.segments[at][0] <= index < plan.segments[at][1]:
        raise IndexError(f"sample {index} is not in the plan's segments")
    return plan.starts[at] + index - plan.segments[at][0]


def _cut(plan: EpochPlan, lo: int, hi: int) -> list[Segment]:
    """The epoch-order ranges of the plan's queue positions [lo, hi)."""
    found = []
    at = max(0, bisect.bisect_right(plan.starts, lo) - 1)
    while at < len(plan.segments) and plan.starts[at] < hi:
        (start, end), q = plan.segments[at], plan.starts[at]
        a, b = max(lo, q), min(hi, q + end - start)
        if a < b:
            found.append((start + a - q, start + b - q))
        at += 1
    return found


def _merged(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Sorted, with touching ranges joined."""
    out: list[Segment] = []
    for start, end in sorted(segments):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        elif end > start:
            out.append((start, end))
    return tuple(out)


def shard_order(shards: int, *, seed: int, epoch: int) -> list[int]:
    """The epoch's order of the shards (manifest indices), shuffled from (seed, epoch)."""
    order = list(range(shards))
    random.Random(f"shards/{seed}/{epoch}").shuffle(order)
    return order


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochOrder:
    """Where each index of an epoch's order lies: the shards end to end in a shuffled order."""

    # Manifest indices of the shards, in this epoch's order.
    shards: tuple[int, ...]
    # The epoch-order index of each of those shards' first member, and the total at the end.
    starts: tuple[int, ...]

    def locate(self, index: int) -> tuple[int, int]:
        """(manifest index of the shard, member index in it) of epoch-order `index`."""
        if not 0 <= index < self.starts[-1]:
            raise IndexError(f"sample {index} is outside the epoch's {self.starts[-1]}")
        at = bisect.bisect_right(self.starts, index) - 1
        return self.shards[at], index - self.starts[at]


def epoch_order(counts: Sequence[int], *, seed: int, epoch: int) -> EpochOrder:
    """The epoch's order of shards with `counts` samples each (manifest order)."""
    shards = shard_order(len(counts), seed=seed, epoch=epoch)
    starts = tuple(itertools.accumulate((counts[i] for i in shards), initial=0))
    return EpochOrder(shards=tuple(shards), starts=starts)
