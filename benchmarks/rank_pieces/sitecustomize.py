"""Per-piece self time inside each rank of a torchrun'd loop: `trainer_overhead.py --pieces`.

Python imports this at start-up when this folder is on PYTHONPATH. With PIECES_OUT and RANK set
(a torchrun worker), it wraps the pieces every DDP loop shares (the next batch, DDP's forward,
cross_entropy, backward with its wait for the gradient all-reduce, AdamW.step, zero_grad) in
timers that book each call's self time from optimizer step PIECES_FROM on (the steady state
the step times are measured over), and at exit writes PIECES_OUT/rank-RANK.json:
{"self_ns": {piece: ns}, "calls": {piece: n}}. Anything else in the process stays untouched.
"""

from __future__ import annotations

import os

if os.environ.get("PIECES_OUT") and os.environ.get("RANK") is not None:
    import atexit
    import json
    import time
    from collections import Counter
    from collections.abc import Callable, Iterator
    from typing import Any

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    STEP = "AdamW.step"
    # Optimizer steps before the counts start (the warm-up the step times leave out too).
    FROM = int(os.environ.get("PIECES_FROM", "0"))
    # Optimizer steps so far (the counts below restart at FROM).
    STEPS = [0]
    SELF: Counter[str] = Counter()
    CALLS: Counter[str] = Counter()
    # The time of the children of each open timer, innermost last.
    OPEN = [0]

    def _timed(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            OPEN.append(0)
            began = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                took = time.perf_counter_ns() - began
                SELF[label] += took - OPEN.pop()
                CALLS[label] += 1
                OPEN[-1] += took
                if label == STEP:
                    STEPS[0] += 1
                    if STEPS[0] == FROM:
                        SELF.clear()
                        CALLS.clear()

        # torch's profiler hook marks an optimizer's step as wrapped: keep the mark.
        timed.hooked = getattr(inner, "hooked", False)  # type: ignore[attr-defined]
        setattr(owner, name, timed)

    class _Batches:
        """A DataLoader iterator whose __next__ is timed as "next batch"."""

        def __init__(self, batches: Iterator[Any]) -> None:
            self.batches = batches

        def __iter__(self) -> _Batches:
            return self

        def __next__(self) -> Any:
            began = time.perf_counter_ns()
            try:
                return next(self.batches)
            finally:
                SELF["next batch"] += time.perf_counter_ns() - began
                CALLS["next batch"] += 1

    # An optimizer made once first, so that torch's own step wrapping happens before ours.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    for owner, name, label in [
        (DistributedDataParallel, "forward", "DDP forward"),
        (F, "cross_entropy", "cross_entropy"),
        (torch.Tensor, "backward", "backward, with the gradient all-reduce's wait"),
        (torch.optim.AdamW, "step", STEP),
        (torch.optim.Optimizer, "zero_grad", "zero_grad"),
    ]:
        _timed(owner, name, label)
    making: Callable[[DataLoader[Any]], Iterator[Any]] = DataLoader.__iter__
    DataLoader.__iter__ = lambda self: _Batches(making(self))  # type: ignore[method-assign,assignment,return-value]

    def _dump() -> None:
        path = os.path.join(os.environ["PIECES_OUT"], f"rank-{os.environ['RANK']}.json")
        with open(path, "w") as handle:
            json.dump({"self_ns": dict(SELF), "calls": dict(CALLS)}, handle)

    atexit.register(_dump)
