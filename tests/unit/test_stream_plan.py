"""The stream plan: equal steps on every rank, each sample at most once per epoch, the dropped
count exact, batch keys that name each epoch's plan from the first, and positions that resume
exactly, at the same or another world size."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.streams import plan as P

UNEVEN = (1, 97, 3, 40, 0, 12, 250)


def whole(counts: tuple[int, ...], *, world: int, batch: int, lanes: int = 1, window: int = 1):
    return P.first_plan(
        seed=7,
        epoch=0,
        total=sum(counts),
        world_size=world,
        batch_size=batch,
        lanes=lanes,
        window=window,
    )


def read_by_rank(plan: P.EpochPlan, start: int = 0) -> list[list[int]]:
    return [
        [i for batch in P.rank_batches(plan, rank, start) for i in batch]
        for rank in range(plan.world_size)
    ]


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize(("batch", "lanes", "window"), [(1, 1, 1), (4, 2, 1), (5, 3, 16)])
def test_every_rank_takes_the_same_steps_and_each_sample_at_most_once(
    world: int, batch: int, lanes: int, window: int
) -> None:
    plan = whole(UNEVEN, world=world, batch=batch, lanes=lanes, window=window)
    read = read_by_rank(plan)
    assert {len(samples) for samples in read} == {plan.per_rank * batch}
    everything = [i for samples in read for i in samples]
    assert len(everything) == len(set(everything))
    assert set(everything) <= set(range(sum(UNEVEN)))
    assert plan.dropped == sum(UNEVEN) - len(everything)
    assert plan.dropped < world * batch


def test_too_little_data_gives_zero_steps_everywhere() -> None:
    plan = whole((2, 1), world=4, batch=1)
    assert plan.per_rank == 0
    assert plan.dropped == 3
    assert read_by_rank(plan) == [[], [], [], []]


@pytest.mark.parametrize(("world", "done"), [(3, 0), (3, 31), (2, 5)])
def test_batch_keys_name_the_batches_advancing_reaches_epoch_after_epoch(
    world: int, done: int
) -> None:
    # A reader knows the run's first plan and is given keys: the plan each key names must be
    # the one the trainer's position is in, a re-split first plan (world 2) included.
    total = sum(UNEVEN)
    first = whole(UNEVEN, world=3, batch=4, lanes=2, window=8)
    start = P.advance(P.StreamPosition(plan=first, done=0), done, total=total)
    if world != 3:
        start = P.replan(start, world_size=world, batch_size=4, lanes=2)
    keys = list(itertools.islice(P.batch_keys(start, total=total), 120))
    assert len({epoch for epoch, _ in keys}) >= 3
    for taken, (epoch, batch) in enumerate(keys):
        at = P.advance(start, taken, total=total)
        assert (epoch, batch) == (at.epoch, at.done)
        assert P.plan_of_epoch(start.plan, epoch, total=total) == at.plan
    with pytest.raises(ValueError, match="comes before"):
        P.plan_of_epoch(P.advance(start, 120, total=total).plan, start.epoch, total=total)


def test_a_lane_reads_its_window_front_to_back() -> None:
    plan = whole((50, 50), world=2, batch=5, lanes=2, window=10)
    first = P.batch_indices(plan, 0, 0)
    window = P.window_of(plan, 0, first[0])
    assert window == sorted(window)
    assert len(window) == 10
    assert set(first) <= set(window)


def test_the_shuffle_permutes_within_windows_and_changes_with_the_epoch() -> None:
    plan = whole((40,), world=1, batch=10, window=10)
    batches = list(P.rank_batches(plan, 0))
    assert [sorted(b) for b in batches] == [list(range(i, i + 10)) for i in range(0, 40, 10)]
    assert batches[0] != list(range(10))
    later = list(
        P.rank_batches(P.advance(P.StreamPosition(plan=plan, done=0), 4, total=40).plan, 0)
    )
    assert later != batches


def test_the_shard_order_changes_with_the_epoch_and_covers_every_shard() -> None:
    orders = {tuple(P.shard_order(20, seed=3, epoch=e)) for e in range(5)}
    assert len(orders) == 5
    assert all(sorted(order) == list(range(20)) for order in orders)


def test_an_epoch_order_visits_every_member_of_every_shard_once() -> None:
    order = P.epoch_order(UNEVEN, seed=1, epoch=2)
    seen = Counter(order.locate(i) for i in range(sum(UNEVEN)))
    assert set(seen) == {(s, m) for s, n in enumerate(UNEVEN) for m in range(n)}
    assert set(seen.values()) == {1}
    with pytest.raises(IndexError):
        order.locate(sum(UNEVEN))


def test_advancing_past_an_epoch_starts_the_next_whole() -> None:
    plan = whole(UNEVEN, world=3, batch=4)
    moved = P.advance(P.StreamPosition(plan=plan, done=0), plan.per_rank + 2, total=sum(UNEVEN))
    assert (moved.plan.epoch, moved.done, moved.plan.total) == (1, 2, sum(UNEVEN))


def test_a_position_survives_its_checkpoint_form() -> None:
    plan = whole(UNEVEN, world=3, batch=4, lanes=2, window=9)
    position = P.replan(P.StreamPosition(plan=plan, done=5), world_size=2, batch_size=3, lanes=1)
    assert P.position_from_dict(position.to_dict(), total=sum(UNEVEN)) == position


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=9),
    world=st.integers(1, 8),
    new_world=st.integers(1, 8),
    batch=st.integers(1, 5),
    new_batch=st.integers(1, 5),
    lanes=st.integers(1, 4),
    window=st.integers(1, 7),
    fraction=st.floats(0, 1),
)
def test_a_resume_at_any_world_size_reads_each_sample_at_most_once_and_counts_the_rest(
    counts: list[int],
    world: int,
    new_world: int,
    batch: int,
    new_batch: int,
    lanes: int,
    window: int,
    fraction: float,
) -> None:
    plan = whole(tuple(counts), world=world, batch=batch, lanes=lanes, window=window)
    done = int(plan.per_rank * fraction)
    before = [
        i
        for rank in range(world)
        for b in itertools.islice(P.rank_batches(plan, rank), done)
        for i in b
    ]
    moved = P.replan(
        P.StreamPosition(plan=plan, done=done),
        world_size=new_world,
        batch_size=new_batch,
        lanes=lanes,
    )
    shares = read_by_rank(moved.plan, moved.done)
    after = [i for samples in shares for i in samples]
    assert len({len(share) for share in shares}) == 1
    assert len(before + after) == len(set(before + after))
    assert len(before) + len(after) + moved.plan.dropped == sum(counts)


@pytest.mark.parametrize("done", [0, 1, 3, 6])
def test_a_resume_at_the_same_world_size_continues_with_the_very_next_batch(done: int) -> None:
    plan = whole(UNEVEN, world=3, batch=4, lanes=2, window=6)
    position = P.replan(P.StreamPosition(plan=plan, done=done), world_size=3, batch_size=4, lanes=5)
    assert position == P.StreamPosition(plan=plan, done=done)
    for rank in range(3):
        assert list(P.rank_batches(plan, rank, done)) == list(P.rank_batches(plan, rank))[done:]


# (ranks, lanes, window) before a re-split over 3,000 ranks: the checkpoint's form stays a few
# integers per split, where the segments alone would take 0.65 MB at 4,096 x 8 (and ~10 MB
# with a 64-sample shuffle window).
@pytest.mark.parametrize(("world", "lanes", "window"), [(4096, 8, 1), (4096, 1, 1), (512, 8, 16)])
def test_a_re_split_position_saves_in_a_few_integers_at_thousands_of_ranks(
    world: int, lanes: int, window: int
) -> None:
    total = 10_000_000
    plan = P.first_plan(
        seed=1, epoch=3, total=total, world_size=world, batch_size=8, lanes=lanes, window=window
    )
    moved = P.replan(
        P.StreamPosition(plan=plan, done=plan.per_rank // 3 + 1),
        world_size=3000,
        batch_size=8,
        lanes=8,
    )
    assert len(moved.plan.segments) >= world  # scattered: each old lane leaves its own piece
    saved = json.dumps(moved.to_dict())
    assert len(saved) < 120
    assert P.position_from_dict(json.loads(saved), total=total) == moved


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=9),
    worlds=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=4),
    lanes=st.integers(1, 4),
    window=st.integers(1, 7),
    fractions=st.lists(st.floats(0, 1), min_size=4, max_size=4),
)
def test_a_position_re_split_again_and_again_keeps_four_integers_per_split(
    counts: list[int],
    worlds: list[tuple[int, int]],
    lanes: int,
    window: int,
    fractions: list[float],
) -> None:
    position = P.StreamPosition(
        plan=whole(tuple(counts), world=3, batch=2, lanes=lanes, window=window), done=0
    )
    for (world, batch), fraction in zip(worlds, fractions, strict=False):
        position = P.StreamPosition(plan=position.plan, done=int(position.plan.per_rank * fraction))
        position = P.replan(position, world_size=world, batch_size=batch, lanes=lanes)
    saved = position.to_dict()
    assert len(saved["splits"]) == len(position.plan.history) + 1 <= len(worlds) + 1
    assert all(len(split) == 4 for split in saved["splits"])
    assert P.position_from_dict(json.loads(json.dumps(saved)), total=sum(counts)) == position


@pytest.mark.parametrize(
    ("splits", "why"),
    [
        ([], "no split"),
        ([[0, 2, 1, 0]], "not a split"),
        ([[2, 2, 1, 99]], "99 micro-batches done of 10"),
        ([[2, 2, 1, 99], [3, 2, 1, 0]], "99 micro-batches done of 10"),
        ([[2, 2, 1, 1], [2, 2, 3, 0]], "repeats the one before"),
        ([[2, 2, 1]], "not enough values"),
    ],
)
def test_a_saved_position_that_cannot_be_one_is_refused(splits: list[list[int]], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        P.position_from_dict({"seed": 0, "epoch": 0, "window": 1, "splits": splits}, total=40)
