"""Self-time timers put around named functions and a batch iterator: the instruments of
step_pieces.py (one process) and rank_pieces/sitecustomize.py (inside every torchrun rank).

Each timed call books its self time (the time of the timed calls inside it subtracted) under
its label in SELF, and one call in CALLS. Imports torch only, so a rank of the raw loop loads
nothing of trainbox for it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

# Self nanoseconds and calls per label, and the children's time of each open timer.
SELF: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
_OPEN: list[int] = [0]

# The optimizer step's label: one call per optimizer step, so it counts the steps.
STEP = "AdamW.step (with torch's profiler hook)"
# (owner, attribute, label): the pieces every DDP loop has, trainbox's and the raw one.
COMMON = [
    (DistributedDataParallel, "forward", "DDP forward"),
    (F, "cross_entropy", "cross_entropy"),
    (torch.Tensor, "backward", "backward (with the gradient all-reduce's wait)"),
    (torch.optim.AdamW, "step", STEP),
    (torch.optim.Optimizer, "zero_grad", "zero_grad"),
]
# The label of TimedBatches' calls.
NEXT_BATCH = "next batch"


def time_common(*, after_step: Callable[[], None] | None = None) -> None:
    """Put timers around COMMON's pieces; `after_step` runs after each optimizer step."""
    # The first optimizer wraps its class's step in torch's profiler hook: made now, so that
    # the timer goes around the hook (the hook's cost is the optimizer's, on both sides).
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    for owner, name, label in COMMON:
        time_calls(owner, name, label, then=after_step if label == STEP else None)


def time_calls(
    owner: Any, name: str, label: str, *, then: Callable[[], None] | None = None
) -> None:
    """Replace owner.name by a timer that books the call's self time under `label`; `then`
    runs after each call is booked."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        _OPEN.append(0)
        started = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            spent = time.perf_counter_ns() - started
            SELF[label] += spent - _OPEN.pop()
            CALLS[label] += 1
            _OPEN[-1] += spent
            if then is not None:
                then()

    # torch.optim wraps a class's step in its profiler hook once, unless it is marked hooked:
    # the timer around the hooked step keeps the mark, so the hook stays inside it.
    timed.hooked = getattr(inner, "hooked", False)  # type: ignore[attr-defined]
    setattr(owner, name, timed)


class TimedBatches:
    """An iterator whose `next` is booked as NEXT_BATCH."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner = inner

    def __iter__(self) -> TimedBatches:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter_ns()
        try:
            return next(self.inner)
        finally:
            SELF[NEXT_BATCH] += time.perf_counter_ns() - started
            CALLS[NEXT_BATCH] += 1
