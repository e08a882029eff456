"""Per-piece self time inside each rank of a torchrun'd loop: `trainer_overhead.py --pieces`.

Python imports this at start-up when this folder is on PYTHONPATH (benchmarks/ is on it too).
With PIECES_OUT and RANK set (a torchrun worker), it puts piece_timers' timers around the
pieces every DDP loop shares (the next batch, DDP's forward, cross_entropy, backward with its
wait for the gradient all-reduce, AdamW.step, zero_grad), counts from optimizer step
PIECES_FROM on (the steady state the step times are measured over), and at exit writes
PIECES_OUT/rank-RANK.json: {"self_ns": {piece: ns}, "calls": {piece: n}}. Anything else in the
process stays untouched.
"""

from __future__ import annotations

import os

if os.environ.get("PIECES_OUT") and os.environ.get("RANK") is not None:
    import atexit
    import json
    from collections.abc import Callable, Iterator
    from typing import Any

    import piece_timers as timers
    from torch.utils.data import DataLoader

    # Optimizer steps before the counts start (the warm-up the step times leave out too).
    FROM = int(os.environ.get("PIECES_FROM", "0"))
    STEPS = [0]

    def _counted() -> None:
        """After each optimizer step: forget everything booked before step FROM."""
        STEPS[0] += 1
        if STEPS[0] == FROM:
            timers.SELF.clear()
            timers.CALLS.clear()

    timers.time_common(after_step=_counted)
    making: Callable[[DataLoader[Any]], Iterator[Any]] = DataLoader.__iter__
    DataLoader.__iter__ = lambda self: timers.TimedBatches(making(self))  # type: ignore[method-assign,assignment,return-value]

    def _dump() -> None:
        path = os.path.join(os.environ["PIECES_OUT"], f"rank-{os.environ['RANK']}.json")
        with open(path, "w") as handle:
            json.dump({"self_ns": dict(timers.SELF), "calls": dict(timers.CALLS)}, handle)

    atexit.register(_dump)
