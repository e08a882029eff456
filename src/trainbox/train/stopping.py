"""The stop vote: a signal or the deadline on any rank stops every rank after one agreed step."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from trainbox.preempt import REASONS, Requests

# Aim for one vote per this many seconds of training: a stop waits at most about this long,
# and a per-step all-reduce (tens of microseconds of gloo round trip, more on a busy CPU) is
# paid once per many small steps instead of on every one.
EVERY_S = 0.1
MAX_PERIOD = 1000


def period_for(seconds_per_step: float, *, every_s: float = EVERY_S) -> int:
    """Steps between votes for a step of this length: ~every_s apart, at least every step."""
    if not math.isfinite(seconds_per_step) or seconds_per_step <= 0:
        return 1
    return max(1, min(MAX_PERIOD, round(every_s / seconds_per_step)))


class Vote:
    """Every rank's stop wish, combined by an all-reduce that overlaps the next training step.

    A vote cast after step k is read after step k+1 on every rank, so all ranks stop after the
    same step and the wait hides behind a step's compute. The vote also carries each rank's
    proposal for how many steps to the next vote (about EVERY_S of training); the maximum is
    agreed, so every rank casts the next vote after the same step too.
    """

    def __init__(self, requests: Requests, *, deadline_at: float | None, device: torch.device):
        self.requests = requests
        self.deadline_at = deadline_at
        self.device = device
        self._tensor: torch.Tensor | None = None
        self._work: dist.Work | None = None
        self._cast_at = 0
        self._next_cast = 0
        self._clock = (time.perf_counter(), 0)

    def local(self) -> int:
        """This rank's wish: a signal's code, 1 past the deadline, else 0."""
        late = self.deadline_at is not None and time.time() >= self.deadline_at
        return max(self.requests.code, 1 if late else 0)

    def after_step(self, step: int) -> str:
        """Called after every optimizer step: the agreed stop reason ('' to go on)."""
        if self._work is not None and step > self._cast_at:
            reason = self.outcome()
            if reason:
                return reason
        if self._work is None and step >= self._next_cast:
            self.cast(step)
        return ""

    def cast(self, step: int = 0) -> None:
        """Start the all-reduce of this rank's wish (and its proposed vote period)."""
        started, at_step = self._clock
        now = time.perf_counter()
        proposal = period_for((now - started) / (step - at_step)) if step > at_step else 1
        self._clock = (now, step)
        self._cast_at = step
        wish = [self.local(), proposal]
        self._tensor = torch.tensor(wish, dtype=torch.int64, device=self.device)
        self._work = dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, async_op=True)

    def outcome(self) -> str:
        """The reason every rank agreed to stop for ('' to go on); waits for the pending vote."""
        if self._work is None or self._tensor is None:
            return ""
        self._work.wait()
        code, period = (int(value) for value in self._tensor.tolist())
        self._work = self._tensor = None
        self._next_cast = self._cast_at + max(1, period)
        return REASONS[code]

    def now(self, step: int = 0) -> str:
        """A blocking vote: cast and read at once (before the loop)."""
        self.cast(step)
        return self.outcome()
