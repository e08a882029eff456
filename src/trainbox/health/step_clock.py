"""Where one rank's step time goes: its own work, waiting for data, waiting in the gradient
all-reduce (under fsdp: the all-gathers) for slower ranks, the time between steps, and, on the
CPU, the time the process did not run (health/pauses.py).

Under DDP every rank's wall step time is the same (they meet in the gradient all-reduce), so
the wall time cannot name a slow rank; the healthy ranks spend the difference waiting in the
all-reduce. The wait is the time from this rank's last gradient being ready to the end of
backward (DDP buckets gradients in reverse parameter order, so the first parameters' gradients
come last): a hook on those parameters stamps the time. Own work is what remains of the step.

Under fsdp the ranks meet in every unit's all-gather, in forward and again in backward, so the
wait is the time spent inside fsdp's own hooks that gather a unit's parameters: hooks of ours
run just before and just after them (a forward pre-hook put first and one put last, and hooks
on each unit's outputs registered before and after fsdp's pre-backward hook on them).

A window's wall time runs from the end of the log point that ended the last one (the start of
the step after it, which the log point's all-reduce overlaps), a moment every rank shares, to
this rank's arrival at the next log point: what a rank did not spend waiting for others in it
is its own time, and the rank with the most is the one the others wait for, at the step's
collective or in it (a rank paused in the collective holds everyone).

Nothing here waits for the device: on CUDA the stamps are events, read at the log point, where
the loss all-reduce waits for the device anyway; on the CPU they are perf_counter readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.utils.hooks import RemovableHandle

from trainbox.health.pauses import PauseMeter

# Parameters (from the first) whose gradient hook stamps "last gradient ready": a few, in case
# the very first one gets its gradient early (a tied or an unused weight).
HOOKED = 2
# Where the training thread is, so that a pause is taken off the part it fell in: between
# steps, fetching a batch, its own work in the step, waiting for slower ranks.
OUTSIDE, DATA, COMPUTE, WAIT = range(4)
NO_PAUSES = (0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimes:
    """One rank's seconds per step over a window, each second counted in one part only."""

    # Its own work in the step: the step's wall time less both waits and its pauses.
    compute: float
    # Waiting for its batches, less its pauses meanwhile.
    data: float
    # Waiting for slower ranks in the step's collectives while it could run.
    wait: float
    # Between steps (log points, evaluation, saves, the loop's own work), less its pauses.
    outside: float
    # Not running though it was ready to (stopped, descheduled), wherever it fell.
    paused: float

    @property
    def own(self) -> float:
        """What it did not spend waiting for others: how late it comes to the collectives, or
        how long it keeps the others in them."""
        return self.compute + self.data + self.outside + self.paused


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
    # The window's wall time: from the last log point's end (every rank at once) to now.
    wall_s: float
    # Seconds the process was paused, per part (OUTSIDE, DATA, COMPUTE, WAIT).
    paused_s: tuple[float, float, float, float]

    def per_step(self) -> StepTimes:
        """The window's parts per step; own work is what the waits and the pauses leave."""
        steps = max(self.steps, 1)
        paused = self.paused_s
        compute = self.step_s - self.data_s - self.wait_s - paused[COMPUTE]
        parts = {
            "compute": compute,
            "data": self.data_s - paused[DATA],
            "wait": self.wait_s - paused[WAIT],
            "outside": self.wall_s - self.step_s - paused[OUTSIDE],
            "paused": sum(paused),
        }
        # A pause charged to a part it did not fall in (it ended as the part did) takes it to 0.
        return StepTimes(**{name: max(value, 0.0) / steps for name, value in parts.items()})


class StepClock:
    """Times each step of one rank on the host clock (perf_counter), and its pauses."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.reset()
        # When the hooked gradients were last ready (None: not in this step).
        self.ready: float | None = None
        # Inside a step (between begin and end): fsdp's waits outside steps (eval) do not count.
        self.stepping = False
        # The part of the step the training thread is in (OUTSIDE, DATA, COMPUTE, WAIT).
        self.phase = OUTSIDE
        # When the window's wall time started (None: before the first step).
        self.since: float | None = None
        # What saw this process paused; started with the first step.
        self.pauses = self._pause_meter()
        # When the fsdp wait in progress began (None: none).
        self._waiting: float | None = None
        units = [unit for unit in module.modules() if isinstance(unit, FSDPModule)]
        if units:
            # fsdp reduces gradients before their hooks run: the wait is timed around its hooks.
            self._hooks = [h for unit in units for h in _around_gathers(unit, self)]
        else:
            trainable = [p for p in module.parameters() if p.requires_grad][:HOOKED]
            self._hooks = [p.register_post_accumulate_grad_hook(self._stamp) for p in trainable]

    def reset(self) -> None:
        """Start a new window."""
        self.steps, self.step_s, self.data_s, self.wait_s = 0, 0.0, 0.0, 0.0

    def begin(self) -> None:
        """A step starts (before its data is fetched)."""
        self.ready, self.stepping, self.phase = None, True, DATA
        self.started = time.perf_counter()
        if self.since is None:
            self._first_step()

    def synced(self) -> None:
        """The step's last backward (and so its gradient all-reduce) has returned."""
        self.phase = COMPUTE
        ready = self.ready
        if ready is not None:
            self.wait_s += time.perf_counter() - ready

    def end(self, data_s: float) -> None:
        """The step ends; `data_s`: how long it waited for its batches."""
        self.stepping, self.phase = False, OUTSIDE
        self.step_s += time.perf_counter() - self.started
        self.data_s += data_s
        self.steps += 1

    def take(self) -> StepTimeTotals:
        """The window's sums (at the log point); the next window starts empty."""
        since = self.since if self.since is not None else time.perf_counter()
        paused = self.pauses.take() if self.pauses is not None else NO_PAUSES
        window = StepTimeTotals(steps=self.steps, step_s=self.step_s, data_s=self.data_s,
                                wait_s=self.wait_s, wall_s=time.perf_counter() - since,
                                paused_s=(paused[0], paused[1], paused[2], paused[3]))  # fmt: skip
        self.reset()
        return window

    def window_starts(self) -> None:
        """The log point's all-reduce has returned on every rank: the next window starts at a
        moment every rank shares, so a rank late at the next one shows it. The loop takes that
        result after at most one more step, which began as the log point ended: from there."""
        if self.since is not None:
            self.since = self.started if self.steps else time.perf_counter()

    def close(self) -> None:
        """Remove the gradient hooks; stop the pause meter."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.pauses is not None:
            self.pauses.stop()

    def _first_step(self) -> None:
        """The first window starts with the first step, after the run's set-up."""
        self.since = self.started
        if self.pauses is not None:
            self.pauses.start()

    def _pause_meter(self) -> PauseMeter | None:
        """The meter of this process's pauses, charged to the part the training thread is in."""
        return PauseMeter(lambda: self.phase, phases=len(NO_PAUSES))

    def _stamp(self, _param: torch.Tensor) -> None:
        self.ready, self.phase = time.perf_counter(), WAIT

    def gather_begins(self) -> None:
        """fsdp is about to gather a unit's parameters (and wait for every rank to be there)."""
        if self.stepping:
            self._waiting, self.phase = time.perf_counter(), WAIT

    def gather_ends(self) -> None:
        """fsdp has the unit's parameters: every rank reached this gather."""
        if self._waiting is not None:
            self.wait_s += time.perf_counter() - self._waiting
            self._waiting, self.phase = None, COMPUTE


def _around_gathers(unit: torch.nn.Module, clock: StepClock) -> list[RemovableHandle]:
    """Hooks that call `clock` just before and after fsdp's gathers of `unit`, in forward (its
    pre-forward hook) and in backward (its hook on the unit's outputs). Registered after
    fully_shard: `prepend` puts ours before fsdp's, appending after."""

    def before(*_: Any) -> None:
        clock.gather_begins()

    def after(*_: Any) -> None:
        clock.gather_ends()

    def on_outputs(hook: Callable[[], None]) -> Callable[..., None]:
        def register(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if not torch.is_grad_enabled():
                return
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda _grad: hook())

        return register

    return [
        unit.register_forward_pre_hook(before, prepend=True),
        unit.register_forward_pre_hook(after),
        # fsdp registers its pre-backward gather on the outputs in its forward hook.
        unit.register_forward_hook(on_outputs(clock.gather_begins), prepend=True),
        unit.register_forward_hook(on_outputs(clock.gather_ends)),
    ]


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a module's output: a tensor, or tuples, lists and dicts of them."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, list | tuple):
        return [tensor for item in output for tensor in _tensors(item)]
    return []


class CudaStepClock(StepClock):
    """Times each step of one rank on its GPU's stream with CUDA events, read at log points.

    No pause meter: the host runs ahead of the GPU, so a host pause costs the job only where
    the GPU runs dry, and that shows in the events, as compute or as time between steps. A
    pause while a collective needs the host (NCCL's network proxy is a host thread) stays in
    everyone's wait."""

    def __init__(self, module: torch.nn.Module) -> None:
        # Per step of the window: (start, last gradient ready or None, backward end, end).
        self._marks: list[tuple[torch.cuda.Event, torch.cuda.Event | None, torch.cuda.Event,
                                torch.cuda.Event]] = []  # fmt: skip
        self._spare: list[torch.cuda.Event] = []
        self._ready_event: torch.cuda.Event | None = None
        # fsdp: the window's gathers as (before, after) events, and the one in progress.
        self._gathers: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._gather_start: torch.cuda.Event | None = None
        super().__init__(module)

    def begin(self) -> None:
        self._ready_event, self.stepping = None, True
        self._start = self._event()
        self.started = time.perf_counter()
        if self.since is None:
            self.since = time.perf_counter()

    def synced(self) -> None:
        self._synced = self._event()

    def end(self, data_s: float) -> None:
        self.stepping = False
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
        for before, after in self._gathers:
            # How long the stream stood still until the gather it waits for had come.
            self.wait_s += before.elapsed_time(after) / 1e3
            self._spare += (before, after)
        self._marks, self._gathers = [], []
        return super().take()

    def gather_begins(self) -> None:
        if self.stepping:
            self._gather_start = self._event()

    def gather_ends(self) -> None:
        if self._gather_start is not None:
            self._gathers.append((self._gather_start, self._event()))
            self._gather_start = None

    def _pause_meter(self) -> PauseMeter | None:
        return None

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
        self.ready, self.phase, self.since, self.pauses = None, OUTSIDE, None, None
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
