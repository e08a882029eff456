"""Where one rank's step time goes: its own work, waiting for data, waiting in the gradient
all-reduce for slower ranks.

Under DDP every rank's wall step time is the same (they meet in the gradient all-reduce), so
the wall time cannot name a slow rank; the healthy ranks spend the difference waiting in the
all-reduce. The wait is the time from this rank's last gradient being ready to the end of
backward (DDP buckets gradients in reverse parameter order, so the first parameters' gradients
come last): a hook on those parameters stamps the time. Own work is what remains of the step.

Nothing here waits for the device: on CUDA the stamps are events, read at the log point, where
the loss all-reduce waits for the device anyway; on the CPU they are perf_counter readings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Parameters (from the first) whose gradient hook stamps "last gradient ready": a few, in case
# the very first one gets its gradient early (a tied or an unused weight).
HOOKED = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeTotals:
    """One rank's step times summed over one log window."""

    # Steps timed.
    steps: int
    # Wall time of those steps, from fetching the data to the end of the optimizer step.
    step_s: float
    # Of which waiting for the next batch.
    data_s: float
    # Of which waiting in the gradient all-reduce after this rank's last gradient was ready.
    wait_s: float

    def per_step(self) -> tuple[float, float, float]:
        """(own work, data wait, all-reduce wait) per step; own work is what the waits leave."""
        steps = max(self.steps, 1)
        compute = max(self.step_s - self.data_s - self.wait_s, 0.0)
        return compute / steps, self.data_s / steps, self.wait_s / steps


class StepClock:
    """Times each step of one rank on the host clock (perf_counter)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.reset()
        # When the hooked gradients were last ready (None: not in this step).
        self.ready: float | None = None
        trainable = [p for p in module.parameters() if p.requires_grad][:HOOKED]
        self._hooks = [p.register_post_accumulate_grad_hook(self._stamp) for p in trainable]

    def reset(self) -> None:
        """Start a new window."""
        self.steps, self.step_s, self.data_s, self.wait_s = 0, 0.0, 0.0, 0.0

    def begin(self) -> None:
        """A step starts (before its data is fetched)."""
        self.ready = None
        self.started = time.perf_counter()

    def synced(self) -> None:
        """The step's last backward (and so its gradient all-reduce) has returned."""
        ready = self.ready
        if ready is not None:
            self.wait_s += time.perf_counter() - ready

    def end(self, data_s: float) -> None:
        """The step ends; `data_s`: how long it waited for its batches."""
        self.step_s += time.perf_counter() - self.started
        self.data_s += data_s
        self.steps += 1

    def take(self) -> StepTimeTotals:
        """The window's sums (at the log point); the next window starts empty."""
        window = StepTimeTotals(steps=self.steps, step_s=self.step_s, data_s=self.data_s,
                                wait_s=self.wait_s)  # fmt: skip
        self.reset()
        return window

    def close(self) -> None:
        """Remove the gradient hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _stamp(self, _param: torch.Tensor) -> None:
        self.ready = time.perf_counter()


class CudaStepClock(StepClock):
    """Times each step of one rank on its GPU's stream with CUDA events, read at log points."""

    def __init__(self, module: torch.nn.Module) -> None:
        # Per step of the window: (start, last gradient ready or None, backward end, end).
        self._marks: list[tuple[torch.cuda.Event, torch.cuda.Event | None, torch.cuda.Event,
                                torch.cuda.Event]] = []  # fmt: skip
        self._spare: list[torch.cuda.Event] = []
        self._ready_event: torch.cuda.Event | None = None
        super().__init__(module)

    def begin(self) -> None:
        self._ready_event = None
        self._start = self._event()

    def synced(self) -> None:
        self._synced = self._event()

    def end(self, data_s: float) -> None:
        self._marks.append((self._start, self._ready_event, self._synced, self._event()))
        self.data_s += data_s
        self.steps += 1

    def take(self) -> StepTimeTotals:
        if self._marks:
            # The log point's all-reduce waits for the device too: this moves that wait earlier.
            self._marks[-1][-1].synchronize()
        for start, ready, synced, end in self._marks:
            self.step_s += start.elapsed_time(end) / 1e3
            if ready is not None:
                self.wait_s += ready.elapsed_time(synced) / 1e3
                self._spare.append(ready)
            self._spare += (start, synced, end)
        self._marks = []
        return super().take()

    def _event(self) -> torch.cuda.Event:
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _stamp(self, _param: torch.Tensor) -> None:
        # Runs on autograd's thread for this device, on the stream the backward kernels use;
        # a later hooked gradient in the same step records the same event again.
        if self._ready_event is None:
            self._ready_event = self._event()
        else:
            self._ready_event.record()


class Unclocked(StepClock):
    """Times nothing: the clock of a loop whose windows nobody takes (stragglers off)."""

    def __init__(self) -> None:
        self.reset()
        self.ready = None
        self._hooks = []

    def begin(self) -> None:
        pass

    def synced(self) -> None:
        pass

    def end(self, data_s: float) -> None:
        pass


def clock_for(module: torch.nn.Module, device: torch.device, *, read: bool) -> StepClock:
    """The clock for a rank training `module` on `device`; `read`: whether anything takes its
    windows (a CUDA clock keeps every step's events until then)."""
    if not read:
        return Unclocked()
    if device.type == "cuda":
        return CudaStepClock(module)
    return StepClock(module)
