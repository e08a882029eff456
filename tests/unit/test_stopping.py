"""The stop vote's schedule: how often it is cast, and when a stop wish becomes the verdict.

One real gloo process group of one rank (a HashStore): the all-reduce is real, the clock is not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from trainbox.preempt import REASONS, Requests
from trainbox.train import stopping


@pytest.mark.parametrize(
    ("seconds_per_step", "period"),
    [
        (1.0, 1),
        (0.1, 1),
        (0.01, 10),
        (0.001, 100),
        (1e-6, stopping.MAX_PERIOD),
        (0.0, 1),
        (math.nan, 1),
    ],
)
def test_votes_come_about_every_tenth_of_a_second(seconds_per_step: float, period: int) -> None:
    assert stopping.period_for(seconds_per_step) == period


@pytest.fixture(autouse=True)
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    vote: stopping.Vote,
    clock: Clock,
    *,
    steps: int,
    step_s: float,
    stop_wish_at: int | None = None,
    requests: Requests | None = None,
) -> tuple[list[int], int | None, str]:
    """Train `steps` fake steps; the steps after which a vote was cast, and where it stopped."""
    casts: list[int] = []
    original = vote.cast

    def counting_cast(step: int = 0) -> None:
        casts.append(step)
        original(step)

    vote.cast = counting_cast  # type: ignore[method-assign]
    vote.now(0)
    for step in range(1, steps + 1):
        clock.now += step_s
        if stop_wish_at == step and requests is not None:
            requests.code = REASONS.index("SIGUSR1")
        reason = vote.after_step(step)
        if reason:
            return casts, step, reason
    return casts, None, ""


def test_short_steps_are_voted_on_every_so_many(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stopping.time, "perf_counter", clock)
    vote = stopping.Vote(Requests(), deadline_at=None, device=torch.device("cpu"))
    casts, stopped, _ = run(vote, clock, steps=100, step_s=0.01)
    assert stopped is None
    # The first casts know no step time yet; then one vote per 10 steps of 10 ms.
    assert casts[:3] == [0, 1, 11]
    assert all(b - a == 10 for a, b in itertools.pairwise(casts[2:]))


def test_a_wish_is_agreed_one_step_after_the_next_cast(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stopping.time, "perf_counter", clock)
    requests = Requests()
    vote = stopping.Vote(requests, deadline_at=None, device=torch.device("cpu"))
    _, stopped, reason = run(
        vote, clock, steps=100, step_s=0.01, stop_wish_at=45, requests=requests
    )
    # Votes after steps 41 and 51: the wish of step 45 rides the second, read after step 52.
    assert (stopped, reason) == (52, "SIGUSR1")


def test_long_steps_are_voted_on_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stopping.time, "perf_counter", clock)
    requests = Requests()
    vote = stopping.Vote(requests, deadline_at=None, device=torch.device("cpu"))
    _, stopped, _ = run(vote, clock, steps=100, step_s=0.5, stop_wish_at=30, requests=requests)
    assert stopped == 31


def test_a_passed_deadline_is_a_stop_wish() -> None:
    vote = stopping.Vote(Requests(), deadline_at=0.0, device=torch.device("cpu"))
    assert vote.now(0) == "deadline"
