"""Decisions every rank takes together: all go on, or all stop with the same error.

The one home for "decide together". Every rank sends one record to rank 0 and receives one
verdict, whatever the world size: O(1) traffic per rank. An all-gather would hand each of N
ranks all N records (O(N²) bytes across the job).

torch is imported inside the functions that talk to other ranks: commands that never start a
process group (`trainbox config`, `doctor`) collect their Problems here without loading it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from trainbox.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

Verdict = TypeVar("Verdict")


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with a command's input or a run's start, found on some rank."""

    # What is wrong, naming the option, key or file.
    text: str
    # What to do about it.
    hint: str


def to_rank0(mine: Any, group: ProcessGroup | None = None) -> list[Any] | None:
    """Every rank's `mine` in rank order on rank 0; None on the others.

    `group`: another process group of every rank (a background writer's own), else the default.
    """
    import torch.distributed as torch_dist  # here, not at the top: see the module docstring

    first = torch_dist.get_rank() == 0
    gathered: list[Any] | None = [None] * torch_dist.get_world_size() if first else None
    torch_dist.gather_object(mine, gathered, dst=0, group=group)
    return gathered


def from_rank0(value: Any, group: ProcessGroup | None = None) -> Any:
    """Rank 0's `value`, on every rank (one broadcast)."""
    import torch.distributed as torch_dist

    box = [value]
    torch_dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def decided_by_rank0(
    mine: Any, judge: Callable[[list[Any]], Verdict], group: ProcessGroup | None = None
) -> Verdict:
    """`judge(every rank's mine)`, computed on rank 0 and returned on every rank."""
    gathered = to_rank0(mine, group)
    verdict: Verdict = from_rank0(judge(gathered) if gathered is not None else None, group)
    return verdict


def all_ok(ok: bool, device: torch.device, group: ProcessGroup | None = None) -> bool:
    """Whether every rank passed `ok=True`: one 1-element all-reduce, no objects pickled."""
    import torch
    import torch.distributed as torch_dist

    flag = torch.tensor([1 if ok else 0], device=device)
    torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def raise_first(problem: Problem | None) -> None:
    """Every rank raises the lowest rank's problem, if any rank has one: all exit 2 together.

    For a run's start (run_dir, resume), where the ranks usually find the same problem and
    one line, naming the rank, says it.
    """
    first = decided_by_rank0(
        None if problem is None else (problem.text, problem.hint), _first_problem
    )
    if first is not None:
        rank, (text, hint) = first
        raise UsageError(text if rank == 0 else f"rank {rank}: {text}", hint=hint)


def raise_together(mine: list[Problem]) -> None:
    """Every rank raises one UsageError listing every distinct problem of every rank, or none
    does. For eval and predict, whose ranks each read other parts of the input."""
    pairs = decided_by_rank0([(p.text, p.hint) for p in mine], _every_problem)
    error = combined([Problem(text=text, hint=hint) for text, hint in pairs])
    if error is not None:
        raise error


def combined(found: Iterable[Problem]) -> UsageError | None:
    """One UsageError for every distinct problem (first seen first), or None when all is well."""
    texts: list[str] = []
    hints: list[str] = []
    for problem in found:
        # One line, as promised, whatever a problem quotes (torch's messages span paragraphs).
        text, hint = _one_line(problem.text), _one_line(problem.hint)
        if text not in texts:
            texts.append(text)
        if hint not in hints:
            hints.append(hint)
    return UsageError(texts, hint="; ".join(hints)) if texts else None


def _first_problem(everyone: list[tuple[str, str] | None]) -> tuple[int, tuple[str, str]] | None:
    return next(((rank, found) for rank, found in enumerate(everyone) if found), None)


def _every_problem(everyone: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    return [pair for pairs in everyone for pair in pairs]


def _one_line(text: str) -> str:
    return " ".join(text.split())
