"""Decisions every rank takes together, so that all go on or all stop with the same error."""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from trainbox import consensus
from trainbox.errors import UsageError

# A rank's reason to stop before training: (what is wrong, HINT).
Problem = tuple[str, str]


def all_ok(ok: bool, device: torch.device) -> bool:
    """Whether every rank passed `ok=True`: one 1-element all-reduce."""
    flag = torch.tensor([1 if ok else 0], device=device)
    torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN)
    return bool(flag.item())


def raise_any(problem: Problem | None) -> None:
    """Every rank raises the lowest rank's problem, if any rank has one: all exit 2 together.

    Only before training (run_dir, resume); rank 0 gathers and judges (trainbox.consensus).
    """
    first = consensus.decided_by_rank0(problem, _first_problem)
    if first is not None:
        rank, (message, hint) = first
        raise UsageError(message if rank == 0 else f"rank {rank}: {message}", hint=hint)


def _first_problem(everyone: list[Problem | None]) -> tuple[int, Problem] | None:
    return next(((rank, found) for rank, found in enumerate(everyone) if found), None)
