"""The stop vote: a signal or the deadline on any rank stops every rank after one agreed step."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from trainbox.preempt import REASONS, Requests


class Vote:
    """Every rank's stop wish, combined by an all-reduce that overlaps the next training step.

    The vote cast after step k is read after step k+1 on every rank, so all ranks stop after
    the same step, and the wait hides behind a step's compute.
    """

    def __init__(self, requests: Requests, *, deadline_at: float | None, device: torch.device):
        self.requests = requests
        self.deadline_at = deadline_at
        self.device = device
        self._tensor: torch.Tensor | None = None
        self._work: dist.Work | None = None

    def local(self) -> int:
        """This rank's wish: a signal's code, 1 past the deadline, else 0."""
        late = self.deadline_at is not None and time.time() >= self.deadline_at
        return max(self.requests.code, 1 if late else 0)

    def cast(self) -> None:
        """Start the all-reduce of this rank's wish."""
        self._tensor = torch.tensor([self.local()], dtype=torch.int32, device=self.device)
        self._work = dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, async_op=True)

    def outcome(self) -> str:
        """The reason every rank agreed to stop for ('' to go on); waits for the pending vote."""
        if self._work is None or self._tensor is None:
            return ""
        self._work.wait()
        code = int(self._tensor.item())
        self._work = self._tensor = None
        return REASONS[code]

    def now(self) -> str:
        """A blocking vote: cast and read at once (before the loop, and after it ends)."""
        self.cast()
        return self.outcome()
