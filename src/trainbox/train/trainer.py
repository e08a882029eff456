"""The DDP training loop: resume, accumulate, step, log, evaluate, checkpoint, summarise."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import default_collate

from trainbox import __version__
from trainbox import config as configuration
from trainbox.config import Config
from trainbox.errors import StorageError, UsageError
from trainbox.factories import Datasets
from trainbox.faults import Injector
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.preempt import Requests
from trainbox.train import (
    batches,
    checkpoint,
    extra_state,
    init_weights,
    optim,
    outputs,
    resume_policy,
    rundir_lock,
    seeding,
    stopping,
)
from trainbox.train.data import TrainBatches, eval_loader
from trainbox.train.evaluate import eval_step, evaluate
from trainbox.train.objective import Step, train_loss
from trainbox.train.progress import Progress
from trainbox.train.saver import BackgroundSaver
from trainbox.train.seams import Seams, choose

# A rank's reason to stop before training: (what is wrong, HINT).
Problem = tuple[str, str]
WRITABLE_HINT = "point run_dir at a writable directory (a mounted volume in containers)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """Everything the loop needs that the outer layer decided."""

    # The resolved run configuration.
    config: Config
    # Where this process sits in the job.
    context: LaunchContext
    # This rank's device.
    device: torch.device
    # The model as the factory built it (identical on every rank: same seed).
    model: torch.nn.Module
    # Train and validation datasets from the data factory.
    data: Datasets
    # DataLoader workers per rank (the pinning plan's), and their start-up hook.
    num_workers: int = 0
    worker_init: Callable[[int], None] | None = None
    # Stop signals this process has received (the CLI installs the handlers).
    requests: Requests = field(default_factory=Requests)
    # Epoch seconds after which to stop and checkpoint (Slurm's end time less the margin).
    deadline_at: float | None = None
    # Tells the hang watchdog what the main thread is doing: (operation, step).
    mark: Callable[[str, int], None] = lambda _op, _step: None
    # Test-only faults (TRAINBOX_FAULT); inert by default.
    faults: Injector = field(default_factory=lambda: Injector((), rank=0))
    # User code at the named seams (train.step, optim.factory...); None: from the config's keys.
    seams: Seams | None = None
    # What validation measures; None: `train.eval_step` of the config (or the built-in one).
    eval_step: Step | None = None


class TrainingLoop:
    """The loop behind api.Trainer: trains `setup.model` on `setup.data`, returns the summary."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.config = config = setup.config
        self.context = setup.context
        self.device = setup.device
        self.rank0 = setup.context.rank == 0
        self.run_dir = config.output_dir
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.data = setup.data
        train = config.train
        self.eval_step = setup.eval_step or eval_step(train.eval_step, kind=train.loss)
        self.batches = TrainBatches(
            setup.data.train,
            batch_size=train.batch_size,
            rank=self.context.rank,
            world_size=self.context.world_size,
            seed=config.seed,
            num_workers=setup.num_workers,
            worker_init=setup.worker_init,
            pin_memory=self.device.type == "cuda",
        )
        # Collective: every rank makes the stop vote's group here, in the same order.
        self.vote_group = stopping.group(config.dist.timeout_s)
        self.vote: stopping.Vote | None = None
        self.module = setup.model.to(self.device)
        self.ddp = DistributedDataParallel(
            self.module,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            find_unused_parameters=train.find_unused_parameters,
        )
        self.forward = torch.compile(self.ddp) if train.compile else self.ddp
        self.seams = setup.seams or choose(config)
        self.optimizer = optim.build_optimizer(
            config, self.module, world_size=self.context.world_size, factory=self.seams.optimizer
        )
        self.peak_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler = optim.build_scheduler(config, self.optimizer, factory=self.seams.schedule)
        # train.state_factory's objects: made in fit(), after init_from has set the weights.
        self.extra: dict[str, Any] = {}
        self.saved_extra: dict[str, Any] | None = None
        self.initialised_from: str | None = None
        self.amp_dtype = amp_dtype(train.amp, self.device)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )
        self.metrics = outputs.MetricsFile(self.run_dir / "metrics.jsonl", enabled=self.rank0)
        self.config_hash = configuration.fingerprint(config)
        self.step = 0
        self.last_loss = float("nan")
        self.last_val: dict[str, float] = {}
        # Steps whose evaluation / checkpoint already exists, so the end does not redo them.
        self.evaluated_at = self.saved_at = -1
        # train.async_save: checkpoints written on a thread while training goes on.
        self.saver = BackgroundSaver(hook=self._save_point) if train.async_save else None
        self.saving_step = 0
        # Rank 0's hold on run_dir, and the directories it made for it (deepest first).
        self.lock: rundir_lock.Lock | None = None
        self.made_dirs: list[Path] = []
        # Damaged checkpoints resuming passed over (moved aside once every rank agreed).
        self.damaged: list[Path] = []
        # Config keys that differ from the checkpoint's (all allowed, or the run stopped).
        self.changed: list[str] = []
        # Model init used the run seed on every rank; from here each rank draws its own stream.
        seeding.seed_all(seeding.rank_seed(config.seed, self.context.rank))

    def fit(self) -> dict[str, Any]:
        """Train to `train.max_steps` (resuming if a checkpoint says so) and write the outputs."""
        self._prepare_run_dir()
        resumed_from = self._resume()
        self._start_extra_state(resumed_from)
        train = self.config.train
        if resumed_from is not None and self.step >= train.max_steps:
            done = self._already_complete()
            if done is not None:
                return done
        # Nothing in run_dir changes before this point but the lock and damaged files set aside.
        redo_end = resumed_from is not None and self.step >= train.max_steps
        self.metrics.keep_until(self.step, redo_eval=redo_end)
        if redo_end:
            # Killed after its last checkpoint: only the end (evaluation, summary) is redone.
            logged = self.metrics.last_loss()
            self.last_loss = float("nan") if logged is None else logged
        self._write_manifest(resumed_from)
        global_batch = train.batch_size * self.context.world_size * train.grad_accum
        log.info(
            "training",
            start_step=self.step,
            max_steps=train.max_steps,
            batch_per_process=train.batch_size,
            global_batch=global_batch,
            peak_lr=self.peak_lr,
            device=str(self.device),
            amp=str(self.amp_dtype) if self.amp_dtype else "off",
        )
        started = time.perf_counter()
        samples_per_s, stopped = self._loop()
        if stopped:
            return self._stop(stopped)
        val_metrics = self.last_val if self.evaluated_at == self.step else self._evaluate()
        if self.saved_at != self.step:
            self._check_finite()
            self._save(final=True)
        self._drain()
        summary = {
            "steps": self.step,
            "world_size": self.context.world_size,
            "launcher": self.context.launcher,
            "global_batch": global_batch,
            "final_loss": self.last_loss,
            "val_metrics": val_metrics,
            "samples_per_s": samples_per_s,
            "train_seconds": time.perf_counter() - started,
            "params_sha256": outputs.params_sha256(self.module),
        }
        if self.rank0:
            outputs.write_json(self.run_dir / "summary.json", summary)
        log.info(
            "finished", **{k: v for k, v in summary.items() if k != "val_metrics"}, **val_metrics
        )
        return summary

    def _start_extra_state(self, resumed_from: str | None) -> None:
        """init_from's weights for a new run, then train.state_factory's objects (restored)."""
        init = self.config.train
        if resumed_from is None and init.init_from:
            # Every rank reads the same file, so the weights agree without a broadcast.
            used = init_weights.apply(
                self.module, source=init.init_from, prefix=init.init_prefix, strict=init.init_strict
            )
            self.initialised_from = str(used)
            log.info("initialised weights", checkpoint=str(used), prefix=init.init_prefix)
        self.extra = extra_state.build(self.seams.state, self.module, self.optimizer)
        if resumed_from is not None:
            extra_state.restore(self.extra, self.saved_extra, source=resumed_from)

    def _stop(self, reason: str) -> dict[str, Any]:
        if self.saved_at != self.step:
            self._check_finite()
            self._save(final=True)
        self._drain()
        where = checkpoint.path_for(self.ckpt_dir, self.step)
        self.metrics.append(
            {"kind": "stop", "step": self.step, "reason": reason, "time": time.time()}
        )
        log.warning("stopped", reason=reason, step=self.step, checkpoint=str(where))
        return {"stopped": reason, "steps": self.step, "checkpoint": str(where)}

    def close(self) -> None:
        """Drop the DDP wrapper (and the compiled graph) before the process group goes away."""
        if self.saver is not None and self.saver.busy:
            # Leaving on an error: let a write in flight finish whole (it is atomic anyway).
            with contextlib.suppress(StorageError):
                self.saver.join()
        if self.vote is not None:
            # Normally finished already; on an error the thread must end before the process.
            self.vote.abort(timeout_s=stopping.EVERY_S + 5)
        del self.forward, self.ddp
        if self.lock is not None:
            self._remove_unused_run_dir()
            self.lock.release()
            self.lock = None

    def _remove_unused_run_dir(self) -> None:
        # A run that made run_dir and wrote nothing into it leaves no empty directory behind.
        # Best effort, on the way out: an error here must not hide the one that ended the run.
        with contextlib.suppress(OSError):
            if not self.made_dirs or os.listdir(self.run_dir) != [rundir_lock.NAME]:
                return
            (self.run_dir / rundir_lock.NAME).unlink()
            for directory in self.made_dirs:
                directory.rmdir()

    def _loop(self) -> tuple[float, str]:
        train = self.config.train
        batches = self.batches.iterate(self.batches.position(self.step * train.grad_accum))
        progress = Progress(train.max_steps, enabled=self.rank0)
        window = _Window(self.device)
        overall = _Window(self.device)
        # Non-finite losses since the last check, counted on the device: no sync per step.
        self.nonfinite = torch.zeros((), device=self.device)
        self.finite_through = self.step
        self._settle_buckets()
        self.ddp.train()
        self.vote = vote = stopping.Vote(
            self.setup.requests,
            deadline_at=self.setup.deadline_at,
            group=self.vote_group,
            start_step=self.step,
            mark=self.setup.mark,
        )
        # A stop asked for during start-up is honoured before the first step.
        stop = vote.start()
        while not stop and self.step < train.max_steps:
            self.setup.mark("data loading", self.step + 1)
            self.setup.faults.before_step(self.step + 1)
            loss, samples = self._optimizer_step(batches, window)
            self.step += 1
            extra_state.after_step(self.extra, self.step)
            self.setup.faults.after_step(self.step)
            self.nonfinite += ~torch.isfinite(loss)
            # Every rank's shard has as many batches of the same size (DistributedSampler).
            window.add(loss, samples * self.context.world_size)
            overall.add(loss, samples * self.context.world_size)
            if self.step % train.log_every == 0 or self.step == train.max_steps:
                self._log(window, progress)
                window = _Window(self.device)
            if train.eval_every and self.step % train.eval_every == 0:
                self._evaluate()
            if train.ckpt_every and self.step % train.ckpt_every == 0:
                self._check_finite()
                self._save()
            stop = vote.after_step(self.step)
        vote.finish(timeout_s=self.config.dist.timeout_s)
        progress.close()
        if self.step >= train.max_steps:
            stop = ""  # asked for during the last step: the work is done, nothing to resume

        # No step trained (a run resumed at its end): no rate, rather than a rate of zero.
        rate = overall.samples / max(overall.elapsed(), 1e-9) if overall.samples else float("nan")
        return rate, stop

    def _settle_buckets(self) -> None:
        """One throwaway backward pass, so a resumed run sums gradients as an unbroken one does.

        DDP regroups its gradient buckets in gradient-ready order after the first backward of
        each process, and the grouping sets the order in which gloo adds the ranks' values: from
        3 ranks on, a run resumed at step k would round differently from one that passed step k
        in one go. Settling at every start makes every counted step use the same grouping. Eval
        mode: no dropout draw, no BatchNorm statistics; no optimizer step; no sampler batch.
        """
        self.setup.mark("settling DDP's gradient buckets", self.step)
        count = min(2, len(self.data.train))
        batch = default_collate([self.data.train[i] for i in range(count)])
        self.ddp.eval()
        with self._autocast():
            loss, _ = train_loss(
                self.seams.step, self.forward, batches.to_device(batch, self.device)
            )
            # Zero-weighted: every parameter gets a gradient hook call, none a value.
            (loss * 0).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def _optimizer_step(self, micro_batches: Any, window: _Window) -> tuple[torch.Tensor, int]:
        train = self.config.train
        total = torch.zeros((), device=self.device)
        samples = 0
        for micro in range(train.grad_accum):
            waited = time.perf_counter()
            batch = next(micro_batches)
            # Shapes only (no device work): tensors that disagree on the sample count stop here.
            samples += batches.sample_count(batch)
            batch = batches.to_device(batch, self.device, non_blocking=True)
            window.data_wait += time.perf_counter() - waited
            self.setup.mark("forward/backward and the gradient all-reduce", self.step + 1)
            # Gradients are all-reduced only on the last micro-batch of the step.
            last = micro == train.grad_accum - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync(), self._autocast():
                loss, extras = train_loss(self.seams.step, self.forward, batch)
                loss = loss / train.grad_accum
            self.scaler.scale(loss).backward()
            total += loss.detach()
            window.add_extras(extras, train.grad_accum)
        if train.clip_grad_norm:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), train.clip_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, samples

    def _log(self, window: _Window, progress: Progress) -> None:
        # One all-reduce per logged step gives the loss (and train.step's extra scalars)
        # averaged over every rank, and the count of non-finite losses since the last check.
        self.setup.mark("the loss all-reduce", self.step)
        names = sorted(set(window.extras) | set(window.host_extras))
        if self.seams.user_step:
            self._agree_on_names(names)
        summed = torch.stack(
            [
                window.loss_sum.double(),
                self.nonfinite.double(),
                *(window.extra_sum(name).double() for name in names),
            ]
        )
        dist.all_reduce(summed)
        loss_sum, nonfinite, *extra_sums = summed.tolist()
        if nonfinite:
            raise self._nonfinite_error()
        self.nonfinite.zero_()
        self.finite_through = self.step
        samples = window.steps * self.context.world_size
        loss = loss_sum / samples
        self.last_loss = loss
        elapsed = window.elapsed()
        record: dict[str, Any] = {
            "kind": "train",
            "step": self.step,
            "epoch": self.batches.position(self.step * self.config.train.grad_accum).epoch,
            "loss": loss,
            "lr": self.scheduler.get_last_lr()[0],
            "samples_per_s": window.samples / elapsed,
            "step_time_s": elapsed / window.steps,
            "data_wait_share": window.data_wait / elapsed,
        }
        clash = sorted(set(names) & {*record, "time", "gpu_mem_mib"})
        if clash:
            raise UsageError(
                f"train.step {self.seams.step.name} returned extra scalars named like trainbox's"
                f" own metrics: {', '.join(clash)}",
                hint="rename those extra values",
            )
        record.update(
            {name: value / samples for name, value in zip(names, extra_sums, strict=True)}
        )
        record["time"] = time.time()
        if self.device.type == "cuda":
            record["gpu_mem_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        self.metrics.append(record)
        progress.update(self.step, loss=loss, samples_per_s=record["samples_per_s"])
        log.info("step", **{k: v for k, v in record.items() if k not in ("kind", "time")})

    def _agree_on_names(self, names: list[str]) -> None:
        """Ranks whose steps returned other extra names would all-reduce tensors of other
        sizes (a hang or a crash): compare a digest of the names first, at log points only."""
        digest = zlib.crc32("\0".join(names).encode())
        seen = torch.tensor([digest, -digest], dtype=torch.int64, device=self.device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if int(seen[0]) != -int(seen[1]):
            raise UsageError(
                f"train.step {self.seams.step.name} returned other extra scalar names on other"
                f" ranks by step {self.step} (this rank: {', '.join(names) or 'none'})",
                hint="return the same names from every rank at every step",
            )

    def _check_finite(self) -> None:
        """Before a checkpoint: every rank stops if any loss since the last check was NaN/Inf."""
        self.setup.mark("the non-finite loss check", self.step)
        count = self.nonfinite.double().reshape(1)
        dist.all_reduce(count)
        if count.item():
            raise self._nonfinite_error()
        self.nonfinite.zero_()
        self.finite_through = self.step

    def _nonfinite_error(self) -> UsageError:
        # Raised on every rank at the same collective, so all stop together; no checkpoint is
        # written after it, so the newest one holds the last good weights.
        kept = checkpoint.existing(self.ckpt_dir)
        last = f"the last good checkpoint is {kept[-1]}" if kept else "no checkpoint was written"
        return UsageError(
            f"the training loss became NaN or Inf between steps {self.finite_through + 1} and"
            f" {self.step} (train.step {self.seams.step.name}); stopped, {last}",
            hint="lower optim.lr, set train.clip_grad_norm, or check the data for NaN/Inf values;"
            " a rerun with train.resume=auto starts from the last good checkpoint",
        )

    def _evaluate(self) -> dict[str, float]:
        if self.data.val is None:
            return {}
        self.setup.mark("evaluation", self.step)
        loader = eval_loader(
            self.data.val,
            rank=self.context.rank,
            world_size=self.context.world_size,
            batch_size=self.config.train.batch_size,
            num_workers=self.setup.num_workers,
        )
        metrics = evaluate(
            self.module,
            loader,
            step=self.eval_step,
            device=self.device,
            autocast=self._autocast(),
        )
        self.last_val = metrics
        self.evaluated_at = self.step
        self.metrics.append({"kind": "val", "step": self.step, **metrics, "time": time.time()})
        log.info("eval", step=self.step, **metrics)
        return metrics

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _prepare_run_dir(self) -> None:
        """Rank 0 makes run_dir and takes its lock; every rank stops together if it cannot."""
        problem: Problem | None = None
        if self.rank0:
            self.made_dirs = _missing_dirs(self.run_dir)
            problem = _make_dir(self.run_dir) or self._lock()
            if problem is None and (unwritable := _writable_problem(self.run_dir)):
                problem = (unwritable, WRITABLE_HINT)
        _agree(problem)

    def _lock(self) -> Problem | None:
        try:
            taken = rundir_lock.acquire(self.run_dir)
        except OSError as err:
            return (
                f"run_dir={str(self.run_dir)!r} cannot hold its lock file {rundir_lock.NAME}"
                f" ({err.strerror})",
                "point run_dir at a writable directory on a file system with file locking",
            )
        if isinstance(taken, rundir_lock.Lock):
            self.lock = taken
            return None
        holder = taken.describe() if taken else "one that is starting"
        return (
            f"run_dir={str(self.run_dir)!r} is in use by another run ({holder})",
            "wait for that run to end (or stop it), or use another run_dir; the lock of a run"
            " that died is released by the kernel, so the holder is alive",
        )

    def _resume(self) -> str | None:
        """Find the checkpoint, judge it against this config, agree on every rank, restore."""
        found, problem = self._find_checkpoint()
        if found is not None and problem is None:
            problem = self._judge(*found)
        _agree(problem)
        if self.rank0 and self.damaged:
            # Out of reach of pruning and of a new save of the same step; never deleted.
            moved = checkpoint.move_aside(self.damaged)
            log.warning("damaged checkpoints moved aside", moved=[str(path) for path in moved])
        if found is None:
            return None
        path, payload = found
        self._restore(path, payload)
        log.info("resumed", checkpoint=str(path), step=self.step)
        return str(path)

    def _find_checkpoint(self) -> tuple[tuple[Path, dict[str, Any]] | None, Problem | None]:
        resume = self.config.train.resume
        if resume not in ("never", "auto"):
            try:
                return (Path(resume), checkpoint.load(Path(resume))), None
            except (OSError, ValueError) as err:
                return None, (f"train.resume={resume!r}: {err}", "name an existing checkpoint file")
        scan = checkpoint.scan(self.ckpt_dir)
        self.damaged = [path for path, _ in scan.damaged]
        if resume == "never" and scan.found is not None:
            return None, (
                f"train.resume=never but {self.ckpt_dir} already holds checkpoints",
                "use a new run_dir, or train.resume=auto to continue that run",
            )
        if resume == "auto" and scan.found is None and scan.damaged:
            reasons = "; ".join(reason for _, reason in scan.damaged)
            return None, (
                f"every checkpoint in {self.ckpt_dir} is damaged ({reasons})",
                "nothing was changed: recover one if you can, or set train.resume=never to start"
                " from step 0 (the damaged files are then kept in checkpoints/damaged/)",
            )
        return (scan.found if resume == "auto" else None), None

    def _judge(self, path: Path, payload: dict[str, Any]) -> Problem | None:
        ours = configuration.as_dict(self.config)
        # Checkpoints from before they carried their whole config name only the model's.
        theirs = payload.get("config") or {"model": payload.get("model_config", {})}
        ours = {section: value for section, value in ours.items() if section in theirs}
        self.changed = resume_policy.changed(theirs, ours)
        refused = resume_policy.judge_resume(theirs, ours)
        if refused and self.config.train.resume_changes != "allow":
            return (
                f"resuming from {path} would change what the checkpoint was made with:"
                f" {'; '.join(refused)}",
                "set those back, use a new run_dir, or add train.resume_changes=allow to resume"
                " with the new values (docs/training.md); nothing was written",
            )
        if refused:
            log.warning("resuming with a changed config", changes=refused, checkpoint=str(path))
        misfit = checkpoint.mismatches(self.module.state_dict(), payload["model"])
        if misfit:
            return (
                f"checkpoint {path} does not fit the model: {'; '.join(misfit)}",
                "resume with the model code and model.args it was trained with, or use a new"
                " run_dir",
            )
        return None

    def _restore(self, path: Path, payload: dict[str, Any]) -> None:
        self.module.load_state_dict(payload["model"])
        optim.restore(
            self.optimizer,
            self.scheduler,
            payload,
            source=str(path),
            fresh_optimizer="optim.name" in self.changed,
        )
        if payload["scaler"] or not self.scaler.is_enabled():
            self.scaler.load_state_dict(payload["scaler"])
        else:
            log.warning("fp16 is new to this run: the gradient scaler starts afresh")
        # Restored in fit(), once train.state_factory's objects exist.
        self.saved_extra = payload.get("extra_state", {})
        if self.seams.optimizer is None and self.seams.schedule is None:
            # A user's optimizer and schedule carry their own lrs; optim.* shapes only built-ins.
            self._apply_optim_config()
        self.step = self.saved_at = int(payload["step"])
        states = payload["rng"]
        if len(states) == self.context.world_size:
            seeding.restore(states[self.context.rank])
        else:
            log.warning(
                "world size changed since the checkpoint: RNG streams restart, so the result will"
                " differ from an uninterrupted run",
                checkpoint_world_size=len(states),
                world_size=self.context.world_size,
            )

    def _apply_optim_config(self) -> None:
        """This config's lr, schedule and decay over the restored state (which carries its own).

        Unchanged values give the very floats the restored state holds, so a plain resume stays
        bit-identical; a changed (allowed) value takes effect at once.
        """
        optim, scheduler = self.config.optim, self.scheduler
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        scheduler.base_lrs = [self.peak_lr for _ in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.peak_lr
            group["lr"] = self.peak_lr * factor
            group["weight_decay"] = optim.weight_decay
            if optim.name == "sgd":
                group["momentum"] = optim.momentum
        scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _already_complete(self) -> dict[str, Any] | None:
        """A run resumed at or past max_steps with its summary: left alone (None: finish it)."""
        path = self.run_dir / "summary.json"
        summary = _read_json(path) if self.rank0 else {}
        # Rank 0 decides: without a summary (killed after the last save) the end is redone.
        if not _all_ranks_ok(summary is not None, self.device):
            return None
        log.warning(
            "run already complete: nothing to train, its files are left as they are",
            step=self.step,
            max_steps=self.config.train.max_steps,
            summary=str(path),
        )
        return {"steps": self.step, "val_metrics": {}, **(summary or {}), "already_complete": True}

    def _save(self, *, final: bool = False) -> None:
        self.setup.mark("the checkpoint's RNG all-gather", self.step)
        states: list[Any] = [None] * self.context.world_size
        dist.all_gather_object(states, seeding.capture())
        problem: StorageError | None = None
        if self.rank0:
            payload = {
                "step": self.step,
                "trainbox": __version__,
                "config_hash": self.config_hash,
                "model_config": configuration.as_dict(self.config)["model"],
                # What resuming judges a new config against (resume_policy).
                "config": configuration.as_dict(self.config),
                "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": states,
                "extra_state": extra_state.state_dicts(self.extra),
            }
            self.setup.mark("writing the checkpoint", self.step)
            try:
                # One write at a time: the previous background write ends (or fails) first.
                if self.saver is not None:
                    self.saver.join()
                self.saving_step = self.step
                if self.saver is not None and not final:
                    self.saver.submit(self.ckpt_dir, self.step, payload, then=self._written)
                else:
                    self._written(
                        checkpoint.save(self.ckpt_dir, self.step, payload, hook=self._save_point)
                    )
            except StorageError as err:
                problem = err
        self._agree_saved(problem)
        self.saved_at = self.step

    def _written(self, path: Path) -> None:
        # On the writer thread when saving in the background.
        checkpoint.prune(self.ckpt_dir, self.config.train.keep_last, hook=self._save_point)
        log.info("checkpoint", step=self.saving_step, path=str(path))

    def _drain(self) -> None:
        """Wait for a background write before anything that must follow it (summary, exit)."""
        problem: StorageError | None = None
        if self.saver is not None:
            try:
                self.saver.join()
            except StorageError as err:
                problem = err
        self._agree_saved(problem)

    def _agree_saved(self, problem: StorageError | None) -> None:
        self.setup.mark("waiting for rank 0's checkpoint write", self.step)
        # Nobody moves on (or exits) while rank 0 may still be writing, and everyone learns
        # whether it worked: a failed rank 0 would otherwise leave the rest waiting.
        if not _all_ranks_ok(problem is None, self.device):
            raise problem or StorageError(
                f"rank 0 could not write a checkpoint (step {self.step} or before)",
                hint="rank 0's log names the file and the reason; earlier checkpoints are intact",
            )

    def _save_point(self, point: str) -> None:
        # The step being written, not the one training has reached (background writes).
        self.setup.faults.at_save(point, self.saving_step)

    def _write_manifest(self, resumed_from: str | None) -> None:
        if not self.rank0:
            return
        outputs.write_text(self.run_dir / "config.yaml", configuration.to_yaml(self.config))
        outputs.write_json(
            self.run_dir / "run.json",
            {
                "trainbox": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "cuda": torch.version.cuda,
                "nccl": _nccl_version(),
                "image": _image_labels(),
                "launch": self.context.describe(),
                "device": str(self.device),
                "backend": dist.get_backend(),
                "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                "host": _host(),
                "config_hash": self.config_hash,
                "seed": self.config.seed,
                "rank_seeds": [
                    seeding.rank_seed(self.config.seed, rank)
                    for rank in range(self.context.world_size)
                ],
                "resumed_from": resumed_from,
                "initialised_from": self.initialised_from,
                "user_code": self.seams.describe(),
                "started": time.time(),
            },
        )


class _Window:
    """Loss, samples and data-wait time accumulated since the last log line."""

    def __init__(self, device: torch.device) -> None:
        self.started = time.perf_counter()
        # Kept on the device: reading it every step would stall the GPU once per step.
        self.loss_sum = torch.zeros((), device=device)
        self.samples = 0
        self.steps = 0
        self.data_wait = 0.0
        # train.step's extra scalars, summed as micro-batch means: tensors stay on the device,
        # plain numbers on the host, so adding them never waits for the GPU.
        self.extras: dict[str, torch.Tensor] = {}
        self.host_extras: dict[str, float] = {}
        self.device = device

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self.loss_sum += loss
        self.samples += samples
        self.steps += 1

    def add_extras(self, extras: dict[str, Any], micro_batches: int) -> None:
        for name, value in extras.items():
            if isinstance(value, torch.Tensor):
                part = value.detach().reshape(()).to(self.device, torch.float64) / micro_batches
                self.extras[name] = self.extras[name] + part if name in self.extras else part
            else:
                self.host_extras[name] = self.host_extras.get(name, 0.0) + value / micro_batches

    def extra_sum(self, name: str) -> torch.Tensor:
        total = torch.tensor(self.host_extras.get(name, 0.0), dtype=torch.float64)
        return (
            self.extras[name] + total.to(self.device)
            if name in self.extras
            else total.to(self.device)
        )

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.started, 1e-9)


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `train.amp` on `device` (auto: bf16 on a GPU that has it), or None."""
    if amp == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else None
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def _all_ranks_ok(ok: bool, device: torch.device) -> bool:
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _agree(problem: Problem | None) -> None:
    """Every rank learns every rank's problem; all raise the first one, so all exit 2 together."""
    gathered: list[Problem | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problem)
    for rank, found in enumerate(gathered):
        if found is not None:
            message, hint = found
            raise UsageError(message if rank == 0 else f"rank {rank}: {message}", hint=hint)


def _missing_dirs(run_dir: Path) -> list[Path]:
    """run_dir and those of its parents that do not exist yet, deepest first."""
    missing = []
    for directory in (run_dir, *run_dir.parents):
        if directory.exists():
            break
        missing.append(directory)
    return missing


def _make_dir(run_dir: Path) -> Problem | None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"run_dir={str(run_dir)!r} is not writable ({err.strerror})", WRITABLE_HINT
    return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _writable_problem(run_dir: Path) -> str:
    try:
        probe = run_dir / f".write-probe-{time.time_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return f"run_dir={str(run_dir)!r} is not writable ({err.strerror})"
    return ""


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return ".".join(map(str, torch.cuda.nccl.version()))


def _host() -> dict[str, Any]:
    # The machine behind the numbers in summary.json (throughput depends on it).
    return {
        "name": platform.node(),
        "cpus_logical": psutil.cpu_count(logical=True),
        "cpus_physical": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def _image_labels() -> dict[str, str]:
    return {
        key.removeprefix("TRAINBOX_IMAGE_").lower(): value
        for key, value in os.environ.items()
        if key.startswith("TRAINBOX_IMAGE_")
    }
