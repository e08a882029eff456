"""What every rank of an eval or predict decides together: bad input, rank 0's outcome."""

from __future__ import annotations

from typing import Any

import torch.distributed as torch_dist

from trainbox.infer import problems as problem_list
from trainbox.infer.problems import Problem


def raise_together(mine: list[Problem], *, world_size: int) -> None:
    """Every rank raises the same UsageError listing every rank's problems, or none does."""
    gathered: list[Any] = [None] * world_size
    torch_dist.all_gather_object(gathered, [(p.text, p.hint) for p in mine])
    found = [Problem(text=text, hint=hint) for pairs in gathered for text, hint in pairs]
    error = problem_list.combined(found)
    if error is not None:
        raise error


def from_rank0(value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]
