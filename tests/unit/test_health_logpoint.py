"""The log point's protocol: one MAX that names a rank, and every participant's share cut back out."""

from __future__ import annotations

import pytest

from trainbox.health import logpoint
from trainbox.health.logpoint import LogPointShare


@pytest.mark.parametrize(
    ("entries", "winner"),
    [
        ([(0.010, 3), (0.020, 1), (0.015, 0)], (0.020, 1)),
        ([(0.010, 3), (0.010, 7)], (0.010, 7)),  # a tie goes to the higher rank
        ([(999.0, 4095), (0.5, 4094)], (999.0, 4095)),
        ([(0.0, 0)], (0.0, 0)),
    ],
)
def test_one_max_names_the_rank_with_the_longest_duration(
    entries: list[tuple[float, int]], winner: tuple[float, int]
) -> None:
    assert logpoint.unpack(max(logpoint.pack(t, rank) for t, rank in entries)) == winner


def test_no_rank_packs_to_zero_and_unpacks_to_none() -> None:
    assert logpoint.unpack(0.0) is None
    assert logpoint.pack(0.0, 0) > 0.0


def test_split_gives_each_part_its_own_share() -> None:
    a, b = (
        LogPointShare(sums=(1.0, 2.0), maxes=(3.0,)),
        LogPointShare(sums=(4.0,), maxes=(5.0, 6.0)),
    )
    whole = LogPointShare(sums=(1.0, 2.0, 4.0), maxes=(3.0, 5.0, 6.0))
    assert logpoint.split(whole, [a, b]) == [a, b]
