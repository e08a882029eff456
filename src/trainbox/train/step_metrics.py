"""Training steps' loss and extra scalars: kept on the device, summed and all-reduced only at
log points (one all-reduce), written to metrics.jsonl; a NaN/Inf loss stops every rank there.

A step appends its loss to a list: no device op and nothing that waits for the device. The
per-step cost is part of the trainer's overhead (benchmarks/step_overhead.py).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox.errors import UsageError
from trainbox.logs import log
from trainbox.train.progress import Progress
from trainbox.train.runfiles import MetricsFile
from trainbox.train.seams import Seams

# Names trainbox writes in a train record; a train.step extra may not take one.
OWN = frozenset({"kind", "step", "epoch", "loss", "lr", "samples_per_s", "step_time_s",
                 "data_wait_share", "time", "gpu_mem_mib"})  # fmt: skip


class Window:
    """Samples, steps, data-wait time and extra scalars accumulated since the last log line."""

    def __init__(self, device: torch.device) -> None:
        self.started = time.perf_counter()
        self.samples = 0
        self.steps = 0
        self.data_wait = 0.0
        # train.step's extra scalars, summed as micro-batch means: tensors stay on the device,
        # plain numbers on the host, so adding them never waits for the GPU.
        self.extras: dict[str, torch.Tensor] = {}
        self.host_extras: dict[str, float] = {}
        self.device = device

    def add_extras(self, extras: dict[str, Any], micro_batches: int) -> None:
        for name, value in extras.items():
            if isinstance(value, torch.Tensor):
                part = value.detach().reshape(()).to(self.device, torch.float64) / micro_batches
                self.extras[name] = self.extras[name] + part if name in self.extras else part
            else:
                self.host_extras[name] = self.host_extras.get(name, 0.0) + value / micro_batches

    def names(self) -> list[str]:
        return sorted(set(self.extras) | set(self.host_extras))

    def extra_sum(self, name: str) -> torch.Tensor:
        total = torch.tensor(self.host_extras.get(name, 0.0), dtype=torch.float64)
        return self.extras.get(name, torch.zeros((), dtype=torch.float64)).to(
            self.device
        ) + total.to(self.device)

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.started, 1e-9)


# Losses kept as separate tensors before they are summed into one, whatever train.log_every
# is. It bounds the memory they hold: a user's step whose loss is a view of a larger tensor
# (`per_sample[0]`) keeps that tensor's storage alive until the fold.
FOLD = 32


class LossSums:
    """Each step's 0-d loss, kept on the device and summed only when asked, in float64.

    The sums are [losses since the last log line, losses since the last finiteness check]. A
    NaN/Inf loss makes its sums non-finite, so the checks need no isfinite per step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Forget every loss (a log line has read them all)."""
        # The losses not summed yet; StepMetrics.add appends to it directly (every step, no call).
        self.pending: list[torch.Tensor] = []
        # How many of `pending` the last finiteness check saw.
        self.checked = 0
        # The sums of the losses folded in before `pending`.
        self.folded = torch.zeros(2, dtype=torch.float64, device=self.device)

    def sums(self) -> torch.Tensor:
        """[since the last log line, since the last check], a new tensor on the device."""
        if not self.pending:
            return self.folded.clone()
        stacked = torch.stack(self.pending).double()
        return self.folded + torch.stack([stacked.sum(), stacked[self.checked :].sum()])

    def fold(self) -> None:
        """Sum the pending losses into `folded`."""
        self.folded = self.sums()
        self.pending, self.checked = [], 0

    def seen_finite(self) -> None:
        """A finiteness check has seen every loss so far."""
        self.folded[1] = 0.0
        self.checked = len(self.pending)


class StepMetrics:
    """One run's training metrics on this rank (rank 0 writes the file)."""

    def __init__(
        self,
        metrics: MetricsFile,
        *,
        device: torch.device,
        world_size: int,
        seams: Seams,
        last_good: Callable[[], str],
    ) -> None:
        self.metrics, self.device, self.world_size = metrics, device, world_size
        # The train step's `module:function`, for errors; whether its extras' names are checked.
        self.step_name, self.check_names = seams.step.name, seams.user_step
        self.last_good = last_good
        self.window = Window(device)
        self.overall = Window(device)
        # The steps' losses, on the device (reading them every step would stall the GPU).
        self.losses = LossSums(device)
        self.finite_through = 0
        self.last_loss = float("nan")

    def start(self, step: int) -> None:
        """The loop starts (or resumes) after `step`."""
        self.window, self.overall = Window(self.device), Window(self.device)
        self.losses.reset()
        self.finite_through = step

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """One optimizer step's loss (on the device) and this rank's sample count."""
        pending = self.losses.pending
        pending.append(loss)
        if len(pending) == FOLD:
            self.losses.fold()
        # Every rank's shard has as many batches of the same size (DistributedSampler).
        samples *= self.world_size
        window, overall = self.window, self.overall
        # Counted inline, not through methods: this runs every step (issue 15).
        window.samples += samples
        window.steps += 1
        overall.samples += samples
        overall.steps += 1

    def add_micro(self, extras: dict[str, Any], *, micro_batches: int, waited_s: float) -> None:
        """One micro-batch's extra scalars (train.step's) and the time it waited for data."""
        if extras:
            self.window.add_extras(extras, micro_batches)
        self.window.data_wait += waited_s

    def log(self, step: int, *, epoch: int, lr: float, progress: Progress) -> None:
        """All-reduce the window's sums (and the non-finite count) and write one train line."""
        window, names = self.window, self.window.names()
        if self.check_names:
            self._agree_on_names(names, step)
        summed = torch.cat(
            [self.losses.sums()] + [window.extra_sum(name).double().reshape(1) for name in names]
        )
        torch_dist.all_reduce(summed)
        loss_sum, unchecked, *extra_sums = summed.tolist()
        self._passed(unchecked, step)
        self.losses.reset()
        samples = window.steps * self.world_size
        self.last_loss = loss = loss_sum / samples
        elapsed = window.elapsed()
        record: dict[str, Any] = {
            "kind": "train",
            "step": step,
            "epoch": epoch,
            "loss": loss,
            "lr": lr,
            "samples_per_s": window.samples / elapsed,
            "step_time_s": elapsed / window.steps,
            "data_wait_share": window.data_wait / elapsed,
        }
        if clash := sorted(set(names) & OWN):
            raise UsageError(
                f"train.step {self.step_name} returned extra scalars named like trainbox's own"
                f" metrics: {', '.join(clash)}",
                hint="rename those extra values",
            )
        record.update(
            {name: value / samples for name, value in zip(names, extra_sums, strict=True)}
        )
        record["time"] = time.time()
        if self.device.type == "cuda":
            record["gpu_mem_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        self.metrics.append(record)
        self.window = Window(self.device)
        progress.update(step, loss=loss, samples_per_s=record["samples_per_s"])
        log.info("step", **{k: v for k, v in record.items() if k not in ("kind", "time")})

    def check_finite(self, step: int) -> None:
        """Before a checkpoint: every rank stops if any loss since the last check was NaN/Inf."""
        unchecked = self.losses.sums()[1:]
        torch_dist.all_reduce(unchecked)
        self._passed(unchecked.item(), step)
        self.losses.seen_finite()

    def rate(self) -> float:
        """Samples per second over the whole loop (NaN when no step was trained)."""
        overall = self.overall
        return overall.samples / overall.elapsed() if overall.samples else float("nan")

    def _passed(self, unchecked: float, step: int) -> None:
        """`unchecked`: every rank's losses since the last check, summed (NaN/Inf if any was)."""
        if not math.isfinite(unchecked):
            # Raised on every rank at the same collective, so all stop together; no checkpoint
            # is written after it, so the newest one holds the last good weights.
            raise UsageError(
                f"the training loss became NaN or Inf between steps {self.finite_through + 1}"
                f" and {step} (train.step {self.step_name}); stopped, {self.last_good()}",
                hint="lower optim.lr, set train.clip_grad_norm, or check the data for NaN/Inf"
                " values; a rerun with train.resume=auto starts from the last good checkpoint",
            )
        self.finite_through = step

    def _agree_on_names(self, names: list[str], step: int) -> None:
        """Ranks whose steps returned other extra names would all-reduce tensors of other
        sizes (a hang or a crash): compare a digest of the names first, at log points only."""
        digest = zlib.crc32("\0".join(names).encode())
        seen = torch.tensor([digest, -digest], dtype=torch.int64, device=self.device)
        torch_dist.all_reduce(seen, op=torch_dist.ReduceOp.MAX)
        if int(seen[0]) != -int(seen[1]):
            raise UsageError(
                f"train.step {self.step_name} returned other extra scalar names on other ranks"
                f" by step {step} (this rank: {', '.join(names) or 'none'})",
                hint="return the same names from every rank at every step",
            )
