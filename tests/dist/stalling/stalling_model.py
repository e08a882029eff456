"""A test model whose forward stops for good halfway through, on one rank, at one training step.

Used by tests/dist/test_fsdp_promises.py: under fsdp the other ranks then wait in the next
unit's all-gather, inside the forward, where DDP would wait in the gradient all-reduce.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class StallHere(torch.nn.Module):
    """Sleeps for ever in the `at`-th training forward on rank `rank`; otherwise passes through."""

    def __init__(self, *, rank: int, at: int) -> None:
        super().__init__()
        self.rank, self.at, self.calls = rank, at, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at and dist.get_rank() == self.rank:
                time.sleep(1e9)
        return inputs


def model(rank: int = 1, at: int = 10**9, hidden: int = 128) -> torch.nn.Module:
    """The built-in task's MLP (2 → hidden → hidden → 5) with the stall between its first two
    layers: three Linear units, so the stall comes after one all-gather and before the next."""
    return torch.nn.Sequential(
        torch.nn.Linear(2, hidden),
        StallHere(rank=rank, at=at),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 5),
    )
