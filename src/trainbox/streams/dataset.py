"""The dataset a shard manifest gives: sized and indexable in manifest order (the fit probe,
validation), and read by plan during training (`PlannedReader`, a batch per key)."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch.utils.data import Dataset, default_collate

from trainbox.errors import UsageError
from trainbox.streams.decode import LAYOUT_HINT, LayoutError, decoded, pair
from trainbox.streams.plan import (
    EpochOrder,
    EpochPlan,
    batch_indices,
    epoch_order,
    plan_of_epoch,
    window_of,
)
from trainbox.streams.shards import HINT, Cursor, Manifest, ShardFault
from trainbox.streams.sources import kind_of

ON_CORRUPT = ("error", "skip")


class ShardStream(Dataset[Any]):
    """The samples of a manifest's shards; training reads them by plan, front to back."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        decode: Callable[[Mapping[str, Any]], Any] = pair,
        decode_name: str = "trainbox.streams.decode:pair",
        window: int = 1,
        lanes: int = 0,
        on_corrupt: str = "error",
    ) -> None:
        self.manifest, self.decode, self.decode_name = manifest, decode, decode_name
        # The shuffle buffer's size in samples, and the lanes per rank (0: one per worker).
        self.window, self.lanes = window, lanes
        self.on_corrupt = on_corrupt
        self.starts = list(itertools.accumulate(manifest.counts, initial=0))
        # (process id, cursor): a forked DataLoader worker must not share its parent's file.
        self._cursor = (os.getpid(), Cursor())

    def __len__(self) -> int:
        return self.starts[-1]

    def __repr__(self) -> str:
        shards = len(self.manifest.shards)
        return f"ShardStream({self.manifest.location}, shards={shards}, samples={len(self)})"

    def __getitem__(self, index: int) -> Any:
        """Sample `index` in manifest order (shards in turn, members in file order)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        try:
            return self.item(shard, index - self.starts[shard])
        except ShardFault as fault:
            raise UsageError(fault.line, hint=fault.hint) from None

    @property
    def probe_front(self) -> bool:
        """Whether a start-up check reads the first samples rather than a spread: a spread over
        URLs or commands would stream most of a shard per sample, on every rank."""
        return not all(kind_of(shard.location) == "path" for shard in self.manifest.shards)

    def __getstate__(self) -> dict[str, Any]:
        # A spawned DataLoader worker gets its own cursor, not the parent's open file.
        state = dict(self.__dict__)
        state["_cursor"] = (0, Cursor())
        return state

    def cursor(self) -> Cursor:
        """This process's cursor (a forked worker's copy of the parent's is left alone)."""
        if self._cursor[0] != os.getpid():
            self._cursor = (os.getpid(), Cursor())
        return self._cursor[1]

    def item(self, shard: int, member: int, cursor: Cursor | None = None) -> Any:
        """Sample `member` of manifest shard `shard`, decoded; ShardFault names it if it fails."""
        where = self.manifest.shards[shard]
        key, members = (cursor or self.cursor()).read(where, member)
        try:
            return self.decode(decoded(members))
        except Exception as err:  # the user's decode function may raise anything
            # A layout the decoder cannot read fails every sample alike: skipping is no way out.
            raise ShardFault(
                f"shard {where.location} sample {member} ({key}): {self.decode_name} failed"
                f" ({type(err).__name__}: {err})",
                hint=LAYOUT_HINT if isinstance(err, LayoutError) else HINT,
            ) from err


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadFailure:
    """What a worker yields instead of a batch when a sample cannot be read (no traceback)."""

    # The shard, the sample and what went wrong, on one line.
    line: str
    # What to do about it.
    hint: str = HINT


class StreamBatch(NamedTuple):
    """One micro-batch from a worker, with the samples it had to stand in for.

    A NamedTuple, not a dataclass: a DataLoader with pin_memory=True pins the tensors inside a
    NamedTuple, and would hand a dataclass on unpinned (its copy to the GPU then waits).
    """

    # The collated samples.
    batch: Any
    # One line per corrupt sample replaced by another of the batch (data.args.on_corrupt=skip).
    skipped: tuple[str, ...]
    # Its (epoch, micro-batch): the trainer checks that batches come in the plan's order.
    key: tuple[int, int]


class PlannedReader(Dataset[StreamBatch | ReadFailure]):
    """One rank's batches by (epoch, micro-batch) key, from a run's first plan on: a batch is a
    pure function of its key, so any worker (or this process) reads any batch, and DataLoader
    workers that live for the run take each epoch's keys in turn.

    A reader reads a shuffle window front to back and keeps it until its samples are taken, so
    the worker that is given a lane's batches in order reads that lane's shards front to back.
    """

    def __init__(self, stream: ShardStream, first: EpochPlan, *, rank: int) -> None:
        self.stream, self.first, self.rank = stream, first, rank
        # The epoch being read, its order of the shards, and the samples of its window read
        # and not yet taken, by epoch-order index: this process's, like the cursor.
        self._plan, self._order = first, self._order_of(first)
        self._window: dict[int, Any] = {}
        self._cursor = (os.getpid(), Cursor())

    def __getstate__(self) -> dict[str, Any]:
        # A spawned DataLoader worker gets its own cursor and window, not the parent's.
        state = dict(self.__dict__)
        state["_cursor"], state["_window"] = (0, Cursor()), {}
        return state

    def _order_of(self, plan: EpochPlan) -> EpochOrder:
        return epoch_order(self.stream.manifest.counts, seed=plan.seed, epoch=plan.epoch)

    def __getitem__(self, key: tuple[int, int]) -> StreamBatch | ReadFailure:
        """Micro-batch `batch` of epoch `epoch` (the key), or what stopped it being read."""
        epoch, batch = key
        if epoch != self._plan.epoch:
            self._plan = plan_of_epoch(self.first, epoch, total=len(self.stream))
            self._order, self._window = self._order_of(self._plan), {}
        cursor = self._own_cursor()
        try:
            items, skipped = self._batch(batch_indices(self._plan, self.rank, batch), cursor)
        except ShardFault as fault:
            return ReadFailure(line=fault.line, hint=fault.hint)
        finally:
            if batch + self._plan.lanes >= self._plan.per_rank:
                # Its lane's last batch: the shard need not stay open (a pipe: command would
                # wait on its output) until the next epoch's batches.
                cursor.close()
        return StreamBatch(batch=default_collate(items), skipped=tuple(skipped), key=key)

    def _own_cursor(self) -> Cursor:
        """This process's cursor (a forked worker's copy of the parent's is left alone)."""
        if self._cursor[0] != os.getpid():
            self._cursor, self._window = (os.getpid(), Cursor()), {}
        return self._cursor[1]

    def _batch(self, indices: list[int], cursor: Cursor) -> tuple[list[Any], list[str]]:
        items: list[Any] = []
        skipped: list[str] = []
        first: ShardFault | None = None
        for index in indices:
            if index not in self._window:
                self._load(index, cursor)
            item = self._window.pop(index)
            if isinstance(item, ShardFault):
                if self.stream.on_corrupt != "skip":
                    raise item
                first = first or item
                skipped.append(item.line)
                continue
            items.append(item)
        if first is not None and not items:
            raise ShardFault(f"every sample of a batch is corrupt: {first.line}", hint=first.hint)
        # A corrupt sample's place goes to the batch's first good one: the batch keeps its size.
        return items + items[:1] * len(skipped), skipped

    def _load(self, index: int, cursor: Cursor) -> None:
        """Read the shuffle window holding `index` front to back (errors kept per sample)."""
        window = self._window
        window.clear()
        for wanted in window_of(self._plan, self.rank, index):
            shard, member = self._order.locate(wanted)
            try:
                window[wanted] = self.stream.item(shard, member, cursor)
            except ShardFault as fault:
                window[wanted] = fault
