"""What a training step tells the rest of the run besides its math, at the step's boundaries.

The loop's step reads like the math: fetch, forward, backward, clip, optimizer step, schedule.
Everything else a step must report or wait for goes through one StepHooks: the hang watchdog's
marks, test faults, the step clock (the straggler detector's input), the step metrics' sums,
and a background checkpoint save, whose copy of the weights the optimizer must not overwrite.
Each hook runs every step, so each does its parts inline instead of calling a method per part.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from trainbox.health import step_clock
from trainbox.health.step_clock import StepClock
from trainbox.train.data.batches import on_device
from trainbox.train.resume.checkpoints import Checkpointer
from trainbox.train.watch.control import RunControl
from trainbox.train.watch.metrics import StepMetrics


class DeviceBatches:
    """The training micro-batches on the device, with this rank's sample count of each; it
    adds up how long the loop waited for them (fetching and moving) in `wait_s`, and tells
    `clock` when the step waits for data (a pause then is taken off the data wait)."""

    def __init__(
        self, batches: Iterator[Any], device: torch.device, clock: StepClock | None = None
    ) -> None:
        self.batches, self.device = batches, device
        self.clock = clock if clock is not None else step_clock.Unclocked()
        # Seconds spent in __next__ since StepHooks.step_ends last took them.
        self.wait_s = 0.0

    def __iter__(self) -> DeviceBatches:
        return self

    def __next__(self) -> tuple[Any, int]:
        clock = self.clock
        clock.phase = step_clock.DATA
        started = time.perf_counter()
        # on_device counts first: tensors that disagree on the sample count stop here.
        moved = on_device(next(self.batches), self.device)
        self.wait_s += time.perf_counter() - started
        clock.phase = step_clock.COMPUTE
        return moved


class StepHooks:
    """The calls a training step makes besides its math; see the module docstring."""

    def __init__(
        self,
        *,
        control: RunControl,
        clock: StepClock,
        stats: StepMetrics,
        checkpoints: Checkpointer,
        batches: DeviceBatches,
        micro_batches: int,
    ) -> None:
        self.clock, self.stats, self.batches = clock, stats, batches
        # Tells the hang watchdog what the step is doing: (operation, step).
        self.mark = control.mark
        # Test faults, or None when none is armed on this rank (the usual case: no call).
        self.faults = control.faults if control.faults.faults else None
        # A background save in flight copies the weights; the optimizer step waits for it.
        self.saver = checkpoints.saver
        self.micro_batches = micro_batches

    def step_starts(self, step: int) -> None:
        """Step `step` starts: it waits for its data first."""
        self.mark("data loading", step)
        if self.faults is not None:
            self.faults.before_step(step)
        self.clock.begin()

    def backward_done(self, extras: dict[str, Any], *, last: bool) -> None:
        """A micro-batch's backward returned (`extras`: the other scalars its step returned).

        After the `last`, so has the gradient all-reduce, and the optimizer changes the weights
        next: a background save's copy of them must be done.
        """
        if extras:
            self.stats.window.add_extras(extras, self.micro_batches)
        if last:
            self.clock.synced()
            if self.saver is not None:
                self.saver.settle()

    def step_ends(self, step: int, loss: torch.Tensor, samples: int) -> None:
        """Optimizer step `step` is done: its summed loss (on the device), this rank's samples."""
        if self.faults is not None:
            self.faults.after_step(step)
        batches = self.batches
        data_s, batches.wait_s = batches.wait_s, 0.0
        self.clock.end(data_s)
        self.stats.add(loss, samples, data_s=data_s)
