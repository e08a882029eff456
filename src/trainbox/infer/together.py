"""What every rank of an eval or predict decides together: bad input, rank 0's outcome."""

from __future__ import annotations

from trainbox import consensus
from trainbox.infer.problems import Problem, combined


def raise_together(mine: list[Problem]) -> None:
    """Every rank raises the same UsageError listing every rank's problems, or none does.

    Rank 0 gathers and combines them (trainbox.consensus): O(1) traffic per rank.
    """
    texts = consensus.decided_by_rank0([(p.text, p.hint) for p in mine], _every_problem)
    error = combined([Problem(text=text, hint=hint) for text, hint in texts])
    if error is not None:
        raise error


def _every_problem(everyone: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    return [pair for pairs in everyone for pair in pairs]


# Rank 0's outcome (a failure, the parts it reused), on every rank.
from_rank0 = consensus.from_rank0
