"""Decisions every rank takes together, at O(1) traffic per rank: rank 0 gathers and judges.

An all-gather would hand each of N ranks all N records (O(N²) bytes across the job); here every
rank sends one record to rank 0 and receives one verdict, whatever the world size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as torch_dist

Verdict = TypeVar("Verdict")


def to_rank0(mine: Any) -> list[Any] | None:
    """Every rank's `mine` in rank order on rank 0; None on the others."""
    first = torch_dist.get_rank() == 0
    gathered: list[Any] | None = [None] * torch_dist.get_world_size() if first else None
    torch_dist.gather_object(mine, gathered, dst=0)
    return gathered


def from_rank0(value: Any) -> Any:
    """Rank 0's `value`, on every rank (one broadcast)."""
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def decided_by_rank0(mine: Any, judge: Callable[[list[Any]], Verdict]) -> Verdict:
    """`judge(every rank's mine)`, computed on rank 0 and returned on every rank."""
    gathered = to_rank0(mine)
    verdict: Verdict = from_rank0(judge(gathered) if gathered is not None else None)
    return verdict
