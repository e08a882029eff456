"""A run's training metrics: each step's loss and extra scalars kept on the device, summed and
all-reduced only at log points, and written to metrics.jsonl and the run's metrics sinks; a
NaN/Inf loss stops every rank there.

A step appends its loss to a list: no device op and nothing that waits for the device. The
per-step cost is part of the trainer's overhead (benchmarks/step_overhead.py).

A log point does not hold the loop: its all-reduces go out at the log step and the loop takes
their result after the next step (`settle`), so their round trip overlaps that step's work
instead of adding to it. Every rank settles at the same point, so a NaN still stops them all
together, and the loop settles before anything that reads the result or must follow the line:
an evaluation, a checkpoint (never written after a non-finite loss), the end of the loop. Under
in-place recovery the loop settles at once (train/loop.py says why).

Parts (health/logpoint.py: the straggler detector, ...) add fixed-size shares to the log point's
SUM all-reduce and to one MAX all-reduce, and records to the file.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox import atomic, sinks
from trainbox.config import Config
from trainbox.errors import UsageError
from trainbox.health import logpoint
from trainbox.logs import log
from trainbox.sinks import Sink, SinkRunner
from trainbox.train.steps.user_code import UserCode
from trainbox.train.watch.progress import Progress


class MetricsFile:
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes; every
    record also goes to the run's metrics sinks (trainbox.sinks), off the training thread."""

    def __init__(self, path: Path, *, enabled: bool, sinks: Sequence[Sink] = ()) -> None:
        self.path = path
        self.enabled = enabled
        self.sinks = SinkRunner(sinks if enabled else ())

    @classmethod
    def for_run(cls, config: Config, *, enabled: bool) -> MetricsFile:
        """RUN_DIR/metrics.jsonl with the sinks `logging` asks for (made on rank 0 only)."""
        run_dir, wanted = config.output_dir, config.logging
        # Every rank checks, so a missing package stops them all at once, not rank 0 alone.
        sinks.check(tensorboard=wanted.tensorboard, factories=wanted.sinks)
        made = (
            sinks.build(run_dir=run_dir, tensorboard=wanted.tensorboard, factories=wanted.sinks)
            if enabled
            else []
        )
        return cls(run_dir / "metrics.jsonl", enabled=enabled, sinks=made)

    def close(self) -> None:
        """Let the sinks take the queued records and close them."""
        self.sinks.close()

    def keep_until(self, step: int, *, redo_eval: bool = False) -> None:
        """Drop lines past `step`: after a resume they describe work that was thrown away.

        `redo_eval`: also drop the evaluation at `step`, which the run is about to redo.
        """
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the half line a killed process left
            at = record.get("step", 0)
            if at < step or (at == step and not (redo_eval and record.get("kind") == "val")):
                kept.append(line)
        atomic.write_text(self.path, "".join(f"{line}\n" for line in kept))

    def last_loss(self) -> float | None:
        """The loss of the last train line, or None (rank 0 only; others have no file)."""
        if not self.enabled or not self.path.exists():
            return None
        loss = None
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("kind") == "train" and "loss" in record:
                loss = record["loss"]
        return loss

    def append(self, record: dict[str, Any]) -> None:
        """Add one record (rank 0 only)."""
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        self.sinks.put(record)


# Names trainbox writes in a train record; a train.step extra may not take one.
OWN = frozenset({"kind", "step", "epoch", "loss", "lr", "samples_per_s", "step_time_s",
                 "data_wait_share", "time", "gpu_mem_mib", "world_size",
                 # The straggler detector's (health/stragglers.py).
                 "own_s_p50", "own_s_max", "compute_s_min", "compute_s_p50", "compute_s_max",
                 "data_s_p50", "data_s_max", "outside_s_p50", "outside_s_max", "paused_s_p50",
                 "paused_s_max", "allreduce_wait_s_mean", "slowest_rank"})  # fmt: skip


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


def _tensor(values: Sequence[float]) -> torch.Tensor:
    """A float64 tensor of `values`. torch.tensor converts a sequence of Python floats one by
    one; an array hands the thousands the log point's parts share over as one buffer."""
    if not values:
        return torch.zeros(0, dtype=torch.float64)
    return torch.frombuffer(array.array("d", values), dtype=torch.float64)


class _Reduction:
    """A log point's two all-reduces in flight: one SUM of its own sums and the parts' sums, one
    MAX of the parts' maxes."""

    def __init__(self, summed: torch.Tensor, most: torch.Tensor, own: int) -> None:
        self.summed, self.most, self.own = summed, most, own
        self.works = [torch_dist.all_reduce(summed, async_op=True)]
        if most.numel():
            self.works.append(
                torch_dist.all_reduce(most, op=torch_dist.ReduceOp.MAX, async_op=True)
            )

    def result(
        self, shares: list[logpoint.LogPointShare]
    ) -> tuple[list[float], list[logpoint.LogPointShare]]:
        """Wait for both, read back together (one wait for the device): (own sums, each part's
        whole)."""
        for work in self.works:
            work.wait()
        values = torch.cat([self.summed, self.most]).tolist()
        mine, sums = self.own, self.summed.numel()
        whole = logpoint.LogPointShare(sums=tuple(values[mine:sums]), maxes=tuple(values[sums:]))
        return values[:mine], logpoint.split(whole, shares)


def _start_all_reduce(
    own: torch.Tensor, shares: list[logpoint.LogPointShare], device: torch.device
) -> _Reduction:
    """Send `own` and the parts' shares into the log point's all-reduces."""
    part_sums = [_tensor(share.sums) for share in shares]
    summed = torch.cat([own, *(sums.to(device) for sums in part_sums)])
    maxes = list(itertools.chain.from_iterable(share.maxes for share in shares))
    return _Reduction(summed, _tensor(maxes).to(device), own.numel())


@dataclass(frozen=True, kw_only=True, slots=True)
class _LogPoint:
    """A log point whose all-reduces are out: what its line needs once they are back."""

    # The step it logs.
    step: int
    # The epoch that step is in.
    epoch: int
    # The learning rate after it.
    lr: float
    # The progress bar it updates.
    progress: Progress
    # Its window, closed: later steps count in the next one.
    window: Window
    # The window's seconds, up to the log point.
    elapsed: float
    # The extra scalars' names, in the order of their sums.
    names: list[str]
    # This rank's part shares: the shapes their wholes are cut back into.
    shares: list[logpoint.LogPointShare]
    # The all-reduces themselves.
    reduced: _Reduction


class StepMetrics:
    """One run's training metrics on this rank (rank 0 writes the file)."""

    def __init__(
        self,
        metrics: MetricsFile,
        *,
        device: torch.device,
        world_size: int,
        user_code: UserCode,
        last_good: Callable[[], str],
        start_step: int,
        last_loss: float | None,
        parts: Sequence[logpoint.LogPointParticipant] = (),
    ) -> None:
        self.metrics, self.device, self.world_size = metrics, device, world_size
        # What else every log point all-reduces and records (logpoint.LogPointParticipant).
        self.parts = tuple(parts)
        # The train step's `module:function`, for errors; whether its extras' names are checked.
        self.step_name, self.check_names = user_code.step.name, user_code.user_step
        self.last_good = last_good
        self.window = Window(device)
        self.overall = Window(device)
        # The steps' losses, on the device (reading them every step would stall the GPU).
        self.losses = LossSums(device)
        # Every loss up to this step was finite (checked before its checkpoint was written).
        self.finite_through = start_step
        # The mean loss of the last log line; a run resumed at its end keeps the logged one.
        self.last_loss = float("nan") if last_loss is None else last_loss
        # The log point whose all-reduces are out and whose line is not written yet.
        self.in_flight: _LogPoint | None = None

    def add(self, loss: torch.Tensor, samples: int, *, data_s: float = 0.0) -> None:
        """One optimizer step's loss (on the device), this rank's sample count and the seconds
        it waited for its data."""
        pending = self.losses.pending
        pending.append(loss)
        if len(pending) == FOLD:
            self.losses.fold()
        window = self.window
        # Counted inline, not through methods: this runs every step. Samples are this rank's;
        # the job's are world_size times as many (DistributedSampler: equal shards).
        window.samples += samples
        window.steps += 1
        window.data_wait += data_s
        self.overall.samples += samples

    def log(self, step: int, *, epoch: int, lr: float, progress: Progress) -> None:
        """Start the log point of `step`: its all-reduces go out now; `settle` writes its line."""
        self.settle()
        window, names = self.window, self.window.names()
        if self.check_names:
            self._agree_on_names(names, step)
        if clash := sorted(set(names) & OWN):
            raise UsageError(
                f"train.step {self.step_name} returned extra scalars named like trainbox's own"
                f" metrics: {', '.join(clash)}",
                hint="rename those extra values",
            )
        shares = [part.share() for part in self.parts]
        own_sums = torch.cat(
            [self.losses.sums()] + [window.extra_sum(name).double().reshape(1) for name in names]
        )
        # The losses and the window from here on are the next log point's.
        self.losses.reset()
        self.window = Window(self.device)
        self.in_flight = _LogPoint(
            step=step,
            epoch=epoch,
            lr=lr,
            progress=progress,
            window=window,
            elapsed=window.elapsed(),
            names=names,
            shares=shares,
            reduced=_start_all_reduce(own_sums, shares, self.device),
        )

    def settle(self) -> None:
        """Wait for the log point in flight, if any; check its losses and write its line."""
        point, self.in_flight = self.in_flight, None
        if point is None:
            return
        summed, wholes = point.reduced.result(point.shares)
        loss_sum, unchecked, *extra_sums = summed
        self._passed(unchecked, point.step)
        window, names, step = point.window, point.names, point.step
        samples = window.steps * self.world_size
        self.last_loss = loss = loss_sum / samples
        record: dict[str, Any] = {
            "kind": "train",
            "step": step,
            "epoch": point.epoch,
            "loss": loss,
            "lr": point.lr,
            "samples_per_s": window.samples * self.world_size / point.elapsed,
            "step_time_s": point.elapsed / window.steps,
            "data_wait_share": window.data_wait / point.elapsed,
            # An elastic run changes it between restarts: which steps ran at which size.
            "world_size": self.world_size,
        }
        record.update(
            {name: value / samples for name, value in zip(names, extra_sums, strict=True)}
        )
        record["time"] = time.time()
        if self.device.type == "cuda":
            record["gpu_mem_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        # The step log line keeps trainbox's own fields; the parts' go to the file and sinks.
        shown = {k: v for k, v in record.items() if k not in ("kind", "time")}
        others = []
        for part, whole in zip(self.parts, wholes, strict=True):
            for made in part.records(whole, step=step):
                if made.get("kind") == "train":
                    record.update((k, v) for k, v in made.items() if k != "kind")
                else:
                    others.append(made)
        self.metrics.append(record)
        for made in others:
            self.metrics.append(made)
        point.progress.update(step, loss=loss, samples_per_s=record["samples_per_s"])
        log.info("step", **shown)

    def check_finite(self, step: int) -> None:
        """Before a checkpoint: every rank stops if any loss since the last check was NaN/Inf."""
        self.settle()
        unchecked = self.losses.sums()[1:]
        torch_dist.all_reduce(unchecked)
        self._passed(unchecked.item(), step)
        self.losses.seen_finite()

    def rate(self) -> float:
        """Samples per second over the whole loop (NaN when no step was trained)."""
        overall = self.overall
        if not overall.samples:
            return float("nan")
        return overall.samples * self.world_size / overall.elapsed()

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
