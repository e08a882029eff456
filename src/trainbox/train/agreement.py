"""Decisions every rank takes together, so that all go on or all stop with the same error."""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from trainbox.errors import UsageError

# A rank's reason to stop before training: (what is wrong, HINT).
Problem = tuple[str, str]


def all_ok(ok: bool, device: torch.device) -> bool:
    """Whether every rank passed `ok=True`: one 1-element all-reduce."""
    flag = torch.tensor([1 if ok else 0], device=device)
    torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN)
    return bool(flag.item())


def raise_any(problem: Problem | None) -> None:
    """Every rank learns every rank's problem; all raise the first one, so all exit 2 together.

    Only before training (run_dir, resume): one small all-gather, not on the per-step path.
    """
    gathered: list[Problem | None] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, problem)
    for rank, found in enumerate(gathered):
        if found is not None:
            message, hint = found
            raise UsageError(message if rank == 0 else f"rank {rank}: {message}", hint=hint)
