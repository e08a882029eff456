"""The stop vote: time-paced votes on a thread, and the step every rank stops after.

A real gloo group of one rank (a HashStore) carries the votes, except where a test needs to
hold a vote in flight: there the all-reduce is replaced by one the test releases by hand.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import tinyloop
from trainbox.process import exit_grace
from trainbox.process.preempt import REASONS, StopRequests
from trainbox.train.watch import control

USR1 = REASONS.index("SIGUSR1")


@pytest.fixture(autouse=True)
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def outcome(
    reason: str | None, stop_at: int, *, all_done: bool = False, step_s: float = 0.002
) -> control.VoteOutcome:
    return control.VoteOutcome(reason=reason, stop_at=stop_at, all_done=all_done, step_s=step_s)


UNKNOWN = control.UNKNOWN_STEP_US


@pytest.mark.parametrize(
    ("reduced", "decided"),
    [
        ([0, 7, 1, 2000], outcome(None, 7)),
        ([USR1, 7, 1, 2000], outcome("SIGUSR1", 7)),
        ([1, 12, 0, 2000], outcome("deadline", 12, all_done=True)),
        ([3, 0, 1, 2000], outcome("SIGTERM", 0)),
        # Some rank finished no step since the last vote: its step time is not known.
        ([0, 7, 1, UNKNOWN], outcome(None, 7, step_s=math.inf)),
    ],
)
def test_decide(reduced: list[int], decided: control.VoteOutcome) -> None:
    assert control.decide(reduced) == decided


FITS = control.STOP_WITHIN_S - (control.LEAD + 1) * 0.05


@pytest.mark.parametrize(
    ("step_s", "every_s", "period_s"),
    [
        # Fast steps: the votes stretch to the longest period, and a stop still lands in time.
        (0.001, 0.1, control.LONGEST_PERIOD_S),
        # The period leaves room for the look-ahead's LEAD + 1 steps within STOP_WITHIN_S.
        (0.05, 0.1, FITS),
        # Steps too slow for any stretch, or not known: as often as dist.vote_every_s says.
        (0.2, 0.1, 0.1),
        (math.inf, 0.1, 0.1),
        # A longer dist.vote_every_s is the user's choice, kept whatever the steps do.
        (0.001, 60.0, 60.0),
    ],
)
def test_the_vote_period_stretches_only_as_far_as_a_stop_stays_prompt(
    step_s: float, every_s: float, period_s: float
) -> None:
    assert control.vote_period(step_s, every_s) == pytest.approx(period_s)
    assert control.LONGEST_PERIOD_S < control.STOP_WITHIN_S


def vote(
    requests: StopRequests, *, start_step: int = 0, every_s: float = 0.01, **kw: object
) -> control.StopVote:
    return control.StopVote(
        requests, deadline_at=None, group=None, start_step=start_step, every_s=every_s, **kw
    )  # type: ignore[arg-type]


def test_a_stop_asked_for_at_start_up_stops_before_the_first_step() -> None:
    requests = StopRequests()
    requests.code = USR1
    started = vote(requests, start_step=40)
    assert started.start() == "SIGUSR1"
    started.finish(timeout_s=5)


def run_steps(
    running: control.StopVote,
    *,
    step_s: float,
    for_s: float,
    wish_at_step: int = 0,
    requests: StopRequests | None = None,
) -> tuple[str | None, float]:
    """Step the loop every `step_s` until it stops or `for_s` passes: the reason, and the seconds
    from the wish (made after `wish_at_step`) to the stop."""
    step, reason, wished_at = 0, None, 0.0
    ends = time.perf_counter() + for_s
    while reason is None and time.perf_counter() < ends:
        step += 1
        time.sleep(step_s)
        if requests is not None and step == wish_at_step:
            requests.code, wished_at = USR1, time.perf_counter()
        reason = running.after_step(step)
    return reason, time.perf_counter() - wished_at


def test_fast_steps_vote_less_often_than_dist_vote_every_s() -> None:
    running = vote(StopRequests(), every_s=0.01)
    assert running.start() is None
    reason, _ = run_steps(running, step_s=0.001, for_s=0.6)
    running.finish(timeout_s=5)
    assert reason is None
    # Every 10 ms would be about 60 votes; stretched to LONGEST_PERIOD_S, 4 at most (the one
    # at start-up, the first in the loop, then one per period), and the one that leaves.
    assert running._votes <= 5, running._votes


def test_a_rank_asked_to_stop_votes_at_once_not_after_a_stretched_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stretch of 30 s: a stop that waited the period out would miss the bound below.
    monkeypatch.setattr(control, "LONGEST_PERIOD_S", 30.0)
    monkeypatch.setattr(control, "STOP_WITHIN_S", 60.0)
    requests = StopRequests()
    running = vote(requests, every_s=0.01)
    assert running.start() is None
    reason, took_s = run_steps(running, step_s=0.001, for_s=20, wish_at_step=200,
                               requests=requests)  # fmt: skip
    running.finish(timeout_s=5)
    assert reason == "SIGUSR1"
    assert took_s < 5, took_s


def test_a_passed_deadline_is_a_stop_wish() -> None:
    late = control.StopVote(StopRequests(), deadline_at=0.0, group=None, start_step=0, every_s=0.1)
    assert late.start() == "deadline"
    late.finish(timeout_s=5)


def test_a_wish_stops_the_loop_within_a_vote_and_a_step() -> None:
    requests = StopRequests()
    running = vote(requests)
    assert running.start() is None
    reason, took_s = run_steps(running, step_s=0.001, for_s=100, wish_at_step=20,
                               requests=requests)  # fmt: skip
    running.finish(timeout_s=5)
    assert reason == "SIGUSR1"
    # every_s is 10 ms: the stop comes a vote (plus this machine's scheduling noise) later.
    assert took_s < 0.5


def test_the_loop_does_not_pass_a_step_whose_vote_is_in_flight() -> None:
    released, sampled = threading.Event(), threading.Event()
    steps: list[int] = []

    class Held(control.StopVote):
        def _all_reduce(self, wish: list[int]) -> list[int]:
            if self._votes == 1:  # the first vote in the loop: hold it until the test says
                steps.append(wish[1])
                sampled.set()
                released.wait(5)
                return [USR1, *wish[1:]]
            return wish

    held = Held(StopRequests(), deadline_at=None, group=None, start_step=0, every_s=0.001)
    assert held.start() is None
    assert sampled.wait(5)
    # The loop is in step 1; the vote samples LEAD steps past it. The steps before the sampled
    # one go on at once; finishing the sampled one must wait for the outcome.
    assert steps == [1 + control.LEAD]
    for before in range(1, 1 + control.LEAD):
        assert held.after_step(before) is None
    result: list[str] = []
    finisher = threading.Thread(target=lambda: result.append(held.after_step(1 + control.LEAD)))
    finisher.start()
    finisher.join(0.2)
    assert finisher.is_alive()
    released.set()
    finisher.join(5)
    assert result == ["SIGUSR1"]  # stopped after exactly the sampled step
    held.finish(timeout_s=5)


def test_a_step_the_vote_is_choosing_is_not_passed_unlocked() -> None:
    # after_step takes no lock when no vote holds its step. The thread reads the loop's step
    # and publishes the sampled one in two moves: here it is held between them (having read
    # step 0), while the loop runs on. The loop must not finish the step about to be sampled.
    choosing, chosen = threading.Event(), threading.Event()

    class Slow(control.StopVote):
        def _sample(self) -> int:
            step = super()._sample()
            if self._votes == 1:  # the first vote in the loop
                choosing.set()
                chosen.wait(5)
            return step

        def _all_reduce(self, wish: list[int]) -> list[int]:
            return [USR1, *wish[1:]] if self._votes == 1 else wish

    slow = Slow(StopRequests(), deadline_at=None, group=None, start_step=0, every_s=0.001)
    assert slow.start() is None
    assert choosing.wait(5)
    stops: list[tuple[int, str]] = []

    def loop() -> None:
        for step in range(1, 20):
            reason = slow.after_step(step)
            if reason:
                stops.append((step, reason))
                return

    runner = threading.Thread(target=loop)
    runner.start()
    runner.join(0.2)
    assert runner.is_alive()  # held at step 1, before the step being sampled
    chosen.set()
    runner.join(5)
    assert stops == [(1 + control.LEAD, "SIGUSR1")]
    slow.finish(timeout_s=5)


def test_a_stop_wished_during_a_long_step_lands_at_most_lead_steps_after_it() -> None:
    # A slow eval after step 200: the loop sits in step 201 for many votes. However fast the
    # steps before it were, the stop names step 201 + LEAD, never more (issue 15's bound).
    requests = StopRequests()
    running = vote(requests, start_step=0)
    assert running.start() is None
    for step in range(1, 201):
        assert running.after_step(step) is None
    requests.code = USR1
    with running._cond:  # a long eval inside step 201: two votes go by, the second saw the wish
        seen = running._votes
        assert running._cond.wait_for(lambda: running._votes >= seen + 2, 5)
    reasons = {step: running.after_step(step) for step in range(201, 201 + control.LEAD + 1)}
    running.finish(timeout_s=5)
    stop_at = 201 + control.LEAD
    assert reasons == {step: "SIGUSR1" if step == stop_at else None for step in reasons}
    # test_stop_latency allows three steps after an eval: the look-ahead must stay within it.
    assert control.LEAD <= 2


def test_finish_ends_the_vote_thread() -> None:
    running = vote(StopRequests())
    running.start()
    running.after_step(1)
    running.finish(timeout_s=5)
    assert not running._thread.is_alive()


def test_a_failed_vote_reaches_the_training_thread() -> None:
    class Broken(control.StopVote):
        def _all_reduce(self, wish: list[int]) -> list[int]:
            raise RuntimeError(f"Connection reset by peer (voting {wish})")

    broken = Broken(StopRequests(), deadline_at=None, group=None, start_step=0, every_s=0.1)
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        broken.start()


def test_the_loop_votes_as_often_as_dist_vote_every_s_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    periods: list[float] = []
    made = control.StopVote.__init__

    def recorded(self: control.StopVote, *args: Any, **kwargs: Any) -> None:
        periods.append(kwargs["every_s"])
        made(self, *args, **kwargs)

    monkeypatch.setattr(control.StopVote, "__init__", recorded)
    # The autouse fixture's world of one is the loop's process group.
    loop = tinyloop.tiny_loop(tmp_path, steps=2, overrides=["dist.vote_every_s=0.37"])
    try:
        loop.fit()
    finally:
        loop.close()
    assert periods == [0.37]


def test_leaving_on_an_error_strands_a_vote_a_peer_still_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer that stopped voting but lingers holds this rank's vote until it exits, or until
    the group's timeout. Leaving does not wait that long: the thread is marked stranded, so the
    command ends without the interpreter's teardown, which it would abort (SIGABRT)."""
    in_flight, peer_gone = threading.Event(), threading.Event()

    class Held(control.StopVote):
        def _all_reduce(self, wish: list[int]) -> list[int]:
            if self._votes == 0:
                return [0, wish[1], 1, wish[3]]
            in_flight.set()
            peer_gone.wait()
            raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(control, "StopVote", Held)
    monkeypatch.setattr(control, "ABORT_WAIT_S", 0.2)
    monkeypatch.setattr("trainbox.process.clean_exit._stranded", [])
    run = control.RunControl()
    run.start(0, timeout_s=30, every_s=0.01)
    assert in_flight.wait(10)
    run.close()
    assert exit_grace.stranded()
    peer_gone.set()
    assert run.vote is not None
    run.vote.thread.join(10)
    assert not exit_grace.stranded()


def test_leaving_after_the_vote_in_flight_ends_strands_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trainbox.process.clean_exit._stranded", [])
    run = control.RunControl()
    run.start(0, timeout_s=30, every_s=0.01)
    run.close()
    assert run.vote is not None
    assert not run.vote.thread.is_alive()
    assert not exit_grace.stranded()
