"""What watches and stops the training loop besides training itself: the hang watchdog's marks, the
stop vote (signals, the Slurm deadline, a GPU fault) and test-only fault injection, behind one
RunControl.

The loop reaches these only through RunControl and its step hooks (train/step_hooks.py), so it
knows neither tests nor signals.

The stop vote: a signal or the deadline on any rank stops every rank after one agreed step.
Each rank runs a vote thread that, every `dist.vote_every_s` seconds of wall time (0.1 by
default), all-reduces this rank's wish together with the step its training loop is working on,
over a process group of its own: one 32-byte all-reduce per rank, O(1) at any scale, off the
training thread. Time, not a step count, paces the votes, so a stop lands within about that
period plus LEAD + 1 steps whatever the step time does (a resume, an eval, steps turning slow).

Stretching: each vote costs a few ms of CPU on busy cores, 4 % of a small model's CPU step at
ten a second, while the promise is only a stop within about max(0.5 s, 2 steps). So each vote
also carries the slowest rank's time per step since the last one, and every rank derives the
same next period from it (`vote_period`): while steps are fast the votes stretch up to
LONGEST_PERIOD_S apart, as far as the stop still lands within STOP_WITHIN_S. A rank that wishes
to stop does not wait the stretch out: it votes within `dist.vote_every_s`, and its peers join
when their period ends (a signal to the whole job, as a scheduler sends it, reaches them all).

Agreement: the vote's result names the stop step, the largest step any rank's thread sampled
into it. The loop never finishes the step its thread sampled while that vote is still in
flight (it waits there, at most one vote's latency), so no rank can have gone past the stop
step when it learns it. The threads vote independently of the loops, so a loop waiting here
never holds a vote up, and a rank stuck in a long checkpoint write still votes.

Look-ahead: the thread samples LEAD steps past the step the loop is in, so a vote's result is
usually back before the loop reaches the sampled step and the loop seldom waits (a vote takes
about a step on busy CPUs: benchmarks/README.md has the latencies). LEAD is fixed, never derived
from step times, so a stop lands at most LEAD steps later than without it, also right after a
long eval or checkpoint (an estimate taken from step times across one would let it grow).
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from trainbox.process import exit_grace
from trainbox.process.preempt import REASONS, StopRequests
from trainbox.testing.faults import Injector

# Steps past the one in progress that a vote samples (see the module docstring). At most 2:
# a stop asked for during an eval must land within three steps of it.
LEAD = 2
# `_sampled` while the thread is choosing the step (below any step: the loop takes the lock).
SAMPLING = -1
# Seconds past one vote period that leaving on an error waits for the vote in flight; a vote
# a peer still holds after that may take the group's whole timeout (see RunControl.close).
ABORT_WAIT_S = 5.0
# The contract: a stop lands within about max(STOP_WITHIN_S, 2 steps) of the signal.
STOP_WITHIN_S = 0.5
# The longest that fast steps stretch the period to: the rest of STOP_WITHIN_S is left for the
# vote's own exchange on a busy machine. At most 4 votes a second costs about 1 % of a 3 ms
# CPU step (benchmarks/README.md, feature costs).
LONGEST_PERIOD_S = 0.4
# A rank's time per step when it finished no step since the last vote (an eval, a save, the
# first vote): not known, so no stretch.
UNKNOWN_STEP_US = 1 << 40


@dataclass(frozen=True, kw_only=True, slots=True)
class VoteOutcome:
    """What one vote decided, the same on every rank."""

    # The agreed reason to stop (None: go on).
    reason: str | None
    # The step to stop after (meaningful when reason is set).
    stop_at: int
    # Whether every rank has left its training loop (the vote thread may end).
    all_done: bool
    # The slowest rank's seconds per step since the previous vote (inf: not known).
    step_s: float


def decide(reduced: list[int]) -> VoteOutcome:
    """The outcome of an all-reduced (max) [wish, step, not_done, µs per step] vote."""
    wish, step, not_done, step_us = reduced
    step_s = math.inf if step_us >= UNKNOWN_STEP_US else step_us / 1e6
    return VoteOutcome(
        reason=REASONS[wish] or None, stop_at=step, all_done=not_done == 0, step_s=step_s
    )


def vote_period(step_s: float, every_s: float) -> float:
    """Seconds to the next vote: `every_s`, stretched while steps of `step_s` are fast, as far
    as a stop (one period, then the look-ahead's LEAD + 1 steps) stays within STOP_WITHIN_S."""
    fits = STOP_WITHIN_S - (LEAD + 1) * step_s
    return max(every_s, min(LONGEST_PERIOD_S, fits))


def vote_group(timeout_s: float) -> torch_dist.ProcessGroup:
    """The vote's own gloo group (collective: every rank calls it once, in the same order).

    Its all-reduces never queue behind DDP's, and gloo runs on the host even when training
    runs on NCCL. At N ranks gloo connects a full mesh once, at start-up.
    """
    return torch_dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


class StopVote:
    """Every rank's stop wish, combined every `every_s` seconds by a thread of its own."""

    def __init__(
        self,
        requests: StopRequests,
        *,
        deadline_at: float | None,
        group: torch_dist.ProcessGroup | None,
        start_step: int,
        every_s: float,
        mark: Callable[[str, int], None] = lambda _op, _step: None,
    ) -> None:
        self.requests, self.deadline_at, self.group = requests, deadline_at, group
        self.every_s, self.mark = every_s, mark
        self._cond = threading.Condition()
        # The loop's last finished step, and whether it is inside the next one.
        self._finished, self._in_loop = start_step, False
        # The step sampled into the vote in flight (None: no vote in flight).
        self._sampled: int | None = None
        self._outcome: VoteOutcome | None = None
        self._votes = 0
        # The agreed seconds to the next vote, and when the last vote's result came.
        self._period_s, self._voted_at = every_s, 0.0
        # The loop's step and the time when this rank last measured its time per step.
        self._counted_step, self._counted_at = start_step, time.monotonic()
        self._done = self._aborted = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trainbox-stop-vote", daemon=True)

    def local(self) -> int:
        """This rank's wish: a signal's code, 1 past the deadline, else 0."""
        late = self.deadline_at is not None and time.time() >= self.deadline_at
        return max(self.requests.code, 1 if late else 0)

    def start(self) -> str | None:
        """Start voting; the first vote is waited for, so a stop asked for at start-up stops now."""
        self._thread.start()
        with self._cond:
            self._cond.wait_for(lambda: self._votes > 0 or self._error is not None)
            self._raise_error()
            return self._reason_at(self._finished)

    def after_step(self, step: int) -> str | None:
        """Called after every optimizer step: the agreed stop reason (None: go on)."""
        self._finished = step
        sampled = self._sampled
        if sampled is None or sampled > step:
            # No vote holds this step: no lock (this runs every step). The thread writes
            # SAMPLING before it reads _finished and its outcome before clearing _sampled, so
            # under the GIL a step it may sample, or its result, always takes the locked path.
            # Inline, not through _raise_error and _reason_at, while nothing is decided.
            outcome = self._outcome
            if self._error is None and (outcome is None or not outcome.reason):
                return None
            self._raise_error()
            return self._reason_at(step)
        with self._cond:
            if self._sampled is not None and self._sampled <= step:
                # This step is in the vote in flight: learn its outcome before going past it.
                self.mark("the stop vote", step)
                self._cond.wait_for(lambda: self._sampled is None or self._error is not None)
            self._raise_error()
            return self._reason_at(step)

    def finish(self, *, timeout_s: float) -> None:
        """Leave the vote: the thread ends once every rank has left (bounded by timeout_s)."""
        with self._cond:
            self._done = True
            self._in_loop = False
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        with self._cond:
            self._raise_error()

    def abort(self, *, timeout_s: float) -> bool:
        """Leaving on an error: stop voting after the vote in flight; whether the thread ended.

        A thread that comes back from gloo while the interpreter finalizes ends the process
        with SIGABRT instead of its exit code, so one still running must be dealt with.
        """
        with self._cond:
            self._aborted = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        """The thread that votes."""
        return self._thread

    @property
    def period_s(self) -> float:
        """The agreed seconds between the last vote and the next."""
        return self._period_s

    def _reason_at(self, step: int) -> str | None:
        outcome = self._outcome
        if outcome is None or not outcome.reason:
            return None
        if step > outcome.stop_at:
            # The wait in after_step makes this impossible; never stop on different steps.
            raise RuntimeError(f"stop vote: step {step} is past the agreed stop {outcome.stop_at}")
        return outcome.reason if step == outcome.stop_at else None

    def _sample(self) -> int:
        """The step this vote decides about: LEAD past the one the loop is in."""
        return self._finished + (1 + LEAD if self._in_loop else 0)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _wait_for_the_period(self) -> None:
        """Wait (holding the lock) until the agreed period ends or this rank leaves the loop; a
        wish to stop, looked for every `every_s`, cuts the period back to `every_s`."""
        due = self._voted_at + self._period_s
        while not (self._done or self._aborted):
            if self.local():
                due = min(due, self._voted_at + self.every_s)
            left = due - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(min(left, self.every_s))

    def _step_us(self) -> int:
        """This rank's µs per step since it last measured (UNKNOWN_STEP_US: no step finished)."""
        now, finished = time.monotonic(), self._finished
        steps, took_s = finished - self._counted_step, now - self._counted_at
        self._counted_step, self._counted_at = finished, now
        return min(int(took_s / steps * 1e6), UNKNOWN_STEP_US) if steps > 0 else UNKNOWN_STEP_US

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._votes:
                        self._wait_for_the_period()
                    if self._aborted:
                        return
                    # The loop reads _sampled without the lock: SAMPLING sends it to the lock
                    # until the sampled step is set (see after_step).
                    self._sampled = SAMPLING
                    step = self._sample()
                    self._sampled = step
                    wish = [self.local(), step, 0 if self._done else 1, self._step_us()]
                reduced = self._all_reduce(wish)
                with self._cond:
                    outcome = decide(reduced)
                    if self._outcome is None or not self._outcome.reason:
                        self._outcome = outcome
                    self._sampled = None
                    # From the first result on the loop is stepping: the next vote samples
                    # ahead. Set here, with the result, so no vote samples in between.
                    self._in_loop = not self._done
                    self._votes += 1
                    self._period_s = vote_period(outcome.step_s, self.every_s)
                    self._voted_at = time.monotonic()
                    self._cond.notify_all()
                if outcome.all_done:
                    return
        except BaseException as err:  # a dead peer: the training thread reports it
            with self._cond:
                self._error = err
                self._sampled = None
                self._cond.notify_all()

    def _all_reduce(self, wish: list[int]) -> list[int]:
        tensor = torch.tensor(wish, dtype=torch.int64)
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX, group=self.group)
        return [int(value) for value in tensor.tolist()]


# Tells the hang watchdog what the main thread is doing: (operation, step).
Mark = Callable[[str, int], None]


def _unwatched(what: str, step: int) -> None:
    del what, step


class RunControl:
    """The watchdog's marks, the stop vote and faults for one run; inert parts by default."""

    def __init__(
        self,
        *,
        requests: StopRequests | None = None,
        deadline_at: float | None = None,
        mark: Mark = _unwatched,
        faults: Injector | None = None,
    ) -> None:
        # Stop signals and this rank's GPU fault (the CLI or api.Trainer installs handlers).
        self.requests = requests or StopRequests()
        # Epoch seconds after which to stop and checkpoint (Slurm's end time less the margin).
        self.deadline_at = deadline_at
        self.mark: Mark = mark
        # Test faults (TRAINBOX_FAULT); the loop's StepHooks fires the per-step ones.
        self.faults = faults or Injector((), rank=0)
        self.vote: StopVote | None = None

    def start(self, step: int, *, timeout_s: float, every_s: float) -> str | None:
        """Start the stop vote, one every `every_s` (collective: its group is made here); a stop
        asked for during start-up is returned at once, before the first step."""
        self.vote = StopVote(
            self.requests,
            deadline_at=self.deadline_at,
            group=vote_group(timeout_s),
            start_step=step,
            every_s=every_s,
            mark=self.mark,
        )
        return self.vote.start()

    def stop_after(self, step: int) -> str | None:
        """Once step `step` is done (logged, evaluated, saved): the agreed reason to stop
        now, the same on every rank (None: go on)."""
        return self.vote.after_step(step) if self.vote is not None else None

    def at_save(self, point: str, step: int) -> None:
        """As the checkpoint of `step` passes `point` (faults.SAVE_POINTS)."""
        self.faults.at_save(point, step)

    def finish(self, *, timeout_s: float) -> None:
        """The loop ended normally: leave the vote once every rank has."""
        if self.vote is not None:
            self.vote.finish(timeout_s=timeout_s)

    def drop_vote(self) -> None:
        """The group broke and is re-formed: stop voting at once, without waiting for the vote in
        flight, which fails as its group is destroyed (a new vote starts with the new group)."""
        if self.vote is None:
            return
        if not self.vote.abort(timeout_s=0):
            exit_grace.strand(self.vote.thread)
        self.vote = None

    def close(self) -> None:
        """On the way out, also after an error: the vote thread ends, or is marked stranded."""
        if self.vote is None:
            return
        # The vote in flight ends once every peer has voted or left. Peers that stopped voting
        # but are still alive (naming the culprit, waiting on their own votes) can hold it until
        # gloo's timeout, so it is not waited for that long: the command leaves without
        # tearing the interpreter down under it (trainbox.process.exit_grace).
        if not self.vote.abort(timeout_s=self.vote.period_s + ABORT_WAIT_S):
            exit_grace.strand(self.vote.thread)
