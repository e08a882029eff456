"""dist.recovery=in_process, rank 0's records: one per lost rank, in the order the ranks died,
whatever order their spares happened to join the new group in."""

from __future__ import annotations

from typing import Any

from trainbox.train.recovery import in_order_of_death

BROKE_AT = 100.0


def test_the_rank_that_died_first_is_recorded_first() -> None:
    joined = [{"rank": 3, "died_at": 102.5}, {"rank": 2, "died_at": 101.0}]
    assert [news["rank"] for news in in_order_of_death(joined, BROKE_AT)] == [2, 3]


def test_a_rank_without_a_death_time_died_when_the_group_broke() -> None:
    joined: list[dict[str, Any]] = [{"rank": 1, "died_at": 100.5}, {"rank": 0}]
    assert [news["rank"] for news in in_order_of_death(joined, BROKE_AT)] == [0, 1]


def test_ranks_that_died_together_are_recorded_by_rank() -> None:
    joined = [{"rank": 5, "died_at": 101.0}, {"rank": 4, "died_at": 101.0}]
    assert [news["rank"] for news in in_order_of_death(joined, BROKE_AT)] == [4, 5]


def test_no_news_is_one_unnamed_lost_peer() -> None:
    assert in_order_of_death([], BROKE_AT) == [{}]
