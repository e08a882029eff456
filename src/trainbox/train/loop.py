"""The training loop (DDP, or FSDP2 under train.strategy=fsdp): start or resume, accumulate, step,
log, evaluate, checkpoint, summarise.

Its parts live in the subpackages beside it (train/__init__.py names them); beside it are
only what a step reports besides its math (`step_hooks`) and validation (`evaluate`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import default_collate

from trainbox.config import Config
from trainbox.distributed.regroup import Generations
from trainbox.errors import UsageError
from trainbox.health.fleet import Fleet
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.process.keeper import Promotion
from trainbox.train.data import batches, workers
from trainbox.train.data.contract import Datasets
from trainbox.train.data.kinds import follows_the_step, open_batches
from trainbox.train.data.seam import Batches, Loading
from trainbox.train.evaluate import Validation, eval_step
from trainbox.train.parallel import ddp, fsdp, mesh
from trainbox.train.recovery import Recovery
from trainbox.train.resume.checkpoints import Checkpointer
from trainbox.train.resume.determinism import rank_seed, seed_all, seed_step
from trainbox.train.resume.run_dir import RunDir, TrainSummary, write_summary
from trainbox.train.resume.run_store import RunStore
from trainbox.train.resume.start import start_run
from trainbox.train.resume.state import TrainState, params_sha256, user_state_after_step
from trainbox.train.step_hooks import DeviceBatches, StepHooks
from trainbox.train.steps.functions import (
    NO_EFFECT,
    Step,
    amp_dtype,
    autocast,
    eval_sums,
    train_loss,
)
from trainbox.train.steps.user_code import UserCode, choose
from trainbox.train.watch.control import RunControl
from trainbox.train.watch.metrics import MetricsFile, StepMetrics
from trainbox.train.watch.progress import Progress


@dataclass(frozen=True, kw_only=True, slots=True)
class LoopInputs:
    """Everything the loop needs that the layer above it (runtime.Trainer) decided."""

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
    # DataLoader workers per rank (the pinning plan's).
    num_workers: int = 0
    # What each DataLoader worker runs first (the pinning plan's CPU and thread settings).
    worker_init: Callable[[int], None] | None = None
    # The watchdog's marks, the stop vote's inputs (signals, deadline) and test faults.
    control: RunControl = field(default_factory=RunControl)
    # This rank's part in fleet health (telemetry included); None: the `health` config's,
    # without telemetry.
    fleet: Fleet | None = None
    # User code for train.step, optim.factory...; None: from the config's keys.
    user_code: UserCode | None = None
    # What validation measures; None: `train.eval_step` of the config (or the built-in one).
    eval_step: Step | None = None
    # dist.recovery=in_process: the process group's generations (None: no in-place recovery).
    generations: Generations | None = None
    # A spare that took its rank over mid-run: what its keeper told it (None: a first process).
    promotion: Promotion | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoppedEarly:
    """Training ended before train.max_steps by an agreed stop, after a checkpoint."""

    # What asked for the stop: a signal's name or "deadline".
    reason: str
    # The last step trained.
    step: int
    # The checkpoint of that step, to resume from.
    checkpoint: Path


class TrainingLoop:
    """The loop behind runtime.Trainer: trains `setup.model` on `setup.data`."""

    def __init__(self, setup: LoopInputs) -> None:
        self.setup, self.config, self.control = setup, setup.config, setup.control
        self.context, self.device = setup.context, setup.device
        config, train = setup.config, setup.config.train
        rank, world = setup.context.rank, setup.context.world_size
        self.run_dir = RunDir(config.output_dir, rank0=rank == 0)
        loading = Loading(
            batch_size=train.batch_size,
            rank=rank,
            world_size=world,
            seed=config.seed,
            num_workers=setup.num_workers,
            worker_init=setup.worker_init,
            pin_memory=self.device.type == "cuda",
            stuck_after_s=workers.stuck_after(config.dist.timeout_s),
        )
        self.batches = open_batches(setup.data.train, loading)
        self.module = setup.model.to(self.device)
        self.user_code = setup.user_code or choose(config)
        self.amp_dtype = amp_dtype(train.amp, self.device)
        # DDP's wrapper (None under fsdp, which shards `module` in place) and what a step calls.
        # A spare taking over wraps once it holds the survivors' state: DDP's wrapper sends
        # rank 0's weights to every rank as it is made.
        self.ddp: DistributedDataParallel | None
        self.forward: Any
        self.ddp, self.forward = (None, None) if setup.promotion else self._wrap(world)
        fleet = setup.fleet or Fleet(config=config.health, rank=rank, device=self.device)
        # Where each step's time goes on this rank, for the straggler detector.
        self.clock = fleet.clock_for(self.module)
        self.parts = fleet.participants(self.clock)
        # The context every step runs in (autocast, or nothing with AMP off).
        self._autocast = functools.partial(autocast, self.amp_dtype, self.device)
        self.state = TrainState(
            config,
            self.module,
            user_code=self.user_code,
            world_size=world,
            device=self.device,
            amp_dtype=self.amp_dtype,
        )
        # Whether the gradient scaler is on (fp16); fixed for the run.
        self.scaling = self.state.scaler.is_enabled()
        # run_dir=s3://: the store behind the working copy that `run_dir` then is.
        self.store = RunStore.for_run(config, self.context)
        self.checkpoints = Checkpointer(
            config.output_dir / "checkpoints",
            context=self.context,
            device=self.device,
            config=config,
            control=self.control,
            store=self.store,
        )
        # The step whose checkpoint exists or is being written: the end does not save it again.
        self.saved_at = -1
        self.metrics = MetricsFile.for_run(config, enabled=rank == 0)
        # This run's step metrics; made once the run knows where it starts (fit).
        self.stats: StepMetrics
        measure = setup.eval_step or eval_step(train.eval_step, kind=train.loss)
        self.validation = Validation(
            setup.data.val,
            step=measure,
            context=self.context,
            batch_size=train.batch_size,
            num_workers=setup.num_workers,
            stuck_after_s=workers.stuck_after(config.dist.timeout_s),
            record=self.metrics.append,
            lockstep=self._lockstep(measure),
        )
        self.recovery = self._recovery(setup)
        # The step the loop has begun (a lost peer breaks it off: it is trained again).
        self.begun = 0
        # Model init used the run seed on every rank; from here each rank draws its own stream.
        seed_all(rank_seed(config.seed, rank))

    def _recovery(self, setup: LoopInputs) -> Recovery | None:
        """In-place recovery's part of this rank (dist.recovery=in_process under a keeper)."""
        if setup.generations is None:
            return None
        if not follows_the_step(setup.data.train):
            raise UsageError(
                "dist.recovery=in_process needs a map-style dataset: a sharded stream's position"
                " lives in each rank's memory and dies with it",
                hint="use dist.recovery=restart with streamed data; it resumes from the newest"
                " checkpoint (docs/reliability.md#in-process-recovery)",
            )
        return Recovery(
            setup.generations,
            rank=self.context.rank,
            world_size=self.context.world_size,
            promotion=setup.promotion,
            record=self.metrics.append,
        )

    def fit(self) -> TrainSummary | StoppedEarly:
        """Train to `train.max_steps` (resuming if a checkpoint says so) and write the outputs."""
        state, context = self.state, self.context
        if self.recovery is not None and self.recovery.promotion is not None:
            # A spare taking its rank over: the survivors hand it their state.
            self.run_dir.take_over()
            self._rejoin(in_flight=-1)
            return self._train(last_loss=None)
        # Before anything is written: data already missing or cut short stops every rank.
        self.batches.agree()
        start = start_run(
            self.config,
            state,
            run_dir=self.run_dir,
            context=context,
            device=self.device,
            metrics=self.metrics,
            user_code=self.user_code,
            dataloader_workers=self.setup.num_workers,
            store=self.store,
        )
        if isinstance(start, TrainSummary):
            return start
        self._follow_data(self.batches)
        # A checkpoint taken from another run_dir (train.resume=PATH) is not one of this run's.
        own = start.checkpoint is not None and (
            start.checkpoint.resolve().parent == self.checkpoints.directory.resolve()
        )
        self.saved_at = state.step if own else -1
        return self._train(last_loss=start.last_loss)

    def _train(self, *, last_loss: float | None) -> TrainSummary | StoppedEarly:
        """From the step the state stands at to the end, re-forming the group where it breaks."""
        state, context, train = self.state, self.context, self.config.train
        self.stats = self._step_metrics(last_loss)
        global_batch = train.batch_size * context.world_size * train.grad_accum
        log.info(
            "training",
            start_step=state.step,
            max_steps=train.max_steps,
            batch_per_process=train.batch_size,
            global_batch=global_batch,
            peak_lr=state.peak_lr,
            device=str(self.device),
            amp=str(self.amp_dtype) if self.amp_dtype else "off",
        )
        started = time.perf_counter()
        while True:
            try:
                samples_per_s, stop = self._loop()
                break
            except RuntimeError as err:
                if self.recovery is None or not self.recovery.recoverable(err):
                    raise
            # Outside the handler: the traceback's frames hold the broken step's tensors.
            self._rejoin(in_flight=self.begun)
        if stop is not None:
            return self._stopped(stop)
        return self._finish(
            global_batch=global_batch,
            samples_per_s=samples_per_s,
            started=started,
        )

    def _step_metrics(self, last_loss: float | None) -> StepMetrics:
        """This rank's step metrics from the step the state stands at."""
        return StepMetrics(
            self.metrics,
            device=self.device,
            world_size=self.context.world_size,
            user_code=self.user_code,
            last_good=self.checkpoints.last_good,
            start_step=self.state.step,
            last_loss=last_loss,
            parts=self.parts,
        )

    def _rejoin(self, *, in_flight: int) -> None:
        """A peer was lost (or this spare replaces it): re-form the group with its spare and go on
        from the furthest survivor's state, with a new DDP wrapper, data and metrics."""
        assert self.recovery is not None
        self.control.drop_vote()
        self.ddp = self.forward = None
        self.state.optimizer.zero_grad(set_to_none=True)
        self.recovery.rejoin(
            self.state,
            in_flight=in_flight,
            mark=self.control.mark,
            fault=self.control.faults.at_recovery,
        )
        self.ddp, self.forward = self._wrap(self.context.world_size)
        self._follow_data(self.batches)
        last_loss = self.stats.last_loss if hasattr(self, "stats") else None
        self.stats = self._step_metrics(last_loss)

    def _follow_data(self, batches: Batches) -> None:
        """Start the data where the checkpoint left it; checkpoints record where it stands."""
        accum = self.config.train.grad_accum
        batches.resume(self.state.resumed_data_position, micro_batches_done=self.state.step * accum)
        self.state.data_position = lambda step: batches.saved_position(step * accum)
        self.state.samples_skipped = lambda: batches.skipped

    def _finish(self, *, global_batch: int, samples_per_s: float, started: float) -> TrainSummary:
        """The end of a run that reached max_steps: evaluate, checkpoint, write summary.json."""
        context = self.context
        val = self._evaluate()
        self._checkpoint(final=True)
        summary = TrainSummary(
            steps=self.state.step,
            world_size=context.world_size,
            launcher=context.launcher,
            global_batch=global_batch,
            final_loss=self.stats.last_loss,
            val_metrics=val,
            samples_per_s=samples_per_s,
            train_seconds=time.perf_counter() - started,
            params_sha256=params_sha256(self.module),
            skipped_samples=self.batches.total_skipped(self.device),
            recoveries=self.recovery.generations.recoveries() if self.recovery else 0,
        )
        if context.rank == 0:
            write_summary(self.run_dir.path, summary)
        self.checkpoints.publish_run_files(self.state.step)
        shown = {
            k: v
            for k, v in summary.as_dict().items()
            if k not in ("val_metrics", "already_complete")
        }
        log.info("finished", **shown, **val)
        return summary

    def close(self) -> None:
        """Drop the DDP wrapper (and the compiled graph) before the process group goes away."""
        self.checkpoints.close()
        self.control.close()
        self.clock.close()
        del self.forward, self.ddp
        self.run_dir.release()

    def _loop(self) -> tuple[float, str | None]:
        """Step until max_steps or an agreed stop: (samples per second, the stop's reason)."""
        train, state, control = self.config.train, self.state, self.control
        micro_batches = DeviceBatches(
            control.faults.data(
                self.batches.batches_from(state.step * train.grad_accum),
                first_step=state.step + 1,
                per_step=train.grad_accum,
            ),
            self.device,
            self.clock,
        )
        hooks = StepHooks(
            control=control,
            clock=self.clock,
            stats=self.stats,
            checkpoints=self.checkpoints,
            batches=micro_batches,
            micro_batches=train.grad_accum,
        )
        progress = Progress(train.max_steps, enabled=self.context.rank == 0)
        if self.ddp is not None:
            control.mark("settling DDP's gradient buckets", state.step)
            ddp.settle_buckets(
                self.ddp,
                self.forward,
                step=self.user_code.step,
                data=self.setup.data.train,
                device=self.device,
                autocast=self._autocast(),
            )
        state.optimizer.zero_grad(set_to_none=True)
        stats, dist = self.stats, self.config.dist
        stop = control.start(state.step, timeout_s=dist.timeout_s, every_s=dist.vote_every_s)
        last_step, log_every = train.max_steps, train.log_every
        eval_every, ckpt_every = train.eval_every, train.ckpt_every
        while stop is None and state.step < last_step:
            step = self.begun = state.step + 1
            if self.recovery is not None:
                # Each step's own stream: a spare taking the rank over rebuilds it from the step.
                seed_step(self.config.seed, self.context.rank, step, self.device)
            hooks.step_starts(step)
            loss, samples = self._train_step(micro_batches, step, hooks)
            state.step = step
            if state.extra:
                user_state_after_step(state.extra, step)
            hooks.step_ends(step, loss, samples)
            if self.recovery is not None and self.recovery.pending is not None:
                self.recovery.recovered(step)
            if stats.in_flight is not None:
                # The last log point's all-reduces went out a step ago, so this seldom waits.
                control.mark("the loss all-reduce", step - 1)
                stats.settle()
            if step % log_every == 0 or step == last_step:
                control.mark("the loss all-reduce", step)
                epoch = self.batches.epoch_at(step * train.grad_accum)
                stats.log(step, epoch=epoch, lr=state.lr(), progress=progress)
                if self.recovery is not None:
                    # A gloo all-reduce left in flight by a lost peer holds the broken group's
                    # teardown until dist.timeout_s: in-place recovery takes the result at once.
                    stats.settle()
            if eval_every and step % eval_every == 0:
                progress.eval(step, self._evaluate())
            if ckpt_every and step % ckpt_every == 0:
                self._checkpoint()
            stop = control.stop_after(step)
        control.mark("the loss all-reduce", state.step)
        stats.settle()
        control.finish(timeout_s=dist.timeout_s)
        progress.close()
        # Asked for during the last step: the work is done, nothing to resume.
        return self.stats.rate(), None if state.step >= train.max_steps else stop

    def _train_step(
        self, micro_batches: DeviceBatches, step: int, hooks: StepHooks
    ) -> tuple[torch.Tensor, int]:
        """Optimizer step `step`: forward and backward on `train.grad_accum` micro-batches, then
        clip, the optimizer and the schedule. Returns the summed loss (on the device) and this
        rank's sample count.

        Nothing here waits for the device (no .item(), .tolist(), .cpu()): a test counts them.
        """
        train, state = self.config.train, self.state
        optimizer, scaler, accum = state.optimizer, state.scaler, train.grad_accum
        # Off, torch's GradScaler passes every call through: three calls a step saved.
        scaling = self.scaling
        total: torch.Tensor | None = None
        samples = 0
        for micro in range(accum):
            batch, count = next(micro_batches)
            hooks.mark("forward/backward and the gradient all-reduce", step)
            last = micro == accum - 1  # gradients are all-reduced on the last one only
            with self._syncing(last), self._autocast():
                loss, extras = train_loss(self.user_code.step, self.forward, batch)
            if accum > 1:  # x / 1 is x bit for bit: skipping it keeps the fingerprints
                loss = loss / accum  # div is on no autocast list: the same outside it
            if scaling:  # fp16: the scaled loss, so that small gradients do not underflow
                scaler.scale(loss).backward()
            else:
                loss.backward()
            hooks.backward_done(extras, last=last)  # the last waits for a background save's copy
            loss = loss.detach()
            total = loss if total is None else total + loss
            samples += count
        if train.clip_grad_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), train.clip_grad_norm)
        if scaling:
            scaler.step(optimizer)  # skipped when the gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        state.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        assert total is not None  # grad_accum >= 1: the config refuses less
        return total, samples

    def _wrap(self, world: int) -> tuple[DistributedDataParallel | None, Any]:
        """(DDP's wrapper or None, what a step calls) for `train.strategy`."""
        train = self.config.train
        if train.strategy == "ddp":
            return ddp.wrap(self.module, self.device, train)
        units = self.user_code.units
        options = fsdp.UnitOptions(
            reshard_after_forward=train.fsdp_reshard_after_forward,
            checkpointing=train.activation_checkpointing,
            compiled=train.compile,
        )
        context = self.context
        shape = mesh.mesh_shape(train, world_size=world, local_world_size=context.local_world_size)
        if train.strategy == "hsdp" and not mesh.node_major(context):
            # Correct, only slower: the per-unit all-gathers then cross the network.
            log.warning(
                "hsdp: this node's ranks are not consecutive; shard groups span nodes",
                mesh=shape,
                node_rank=context.node_rank,
                local_rank=context.local_rank,
            )
        sharded = fsdp.wrap(
            self.module,
            self.device,
            world_size=world,
            amp_dtype=self.amp_dtype,
            units=units,
            options=options,
            mesh_shape=shape,
        )
        return None, sharded

    def _syncing(self, last: bool) -> AbstractContextManager[Any]:
        """Whether this micro-batch's backward reduces the gradients: DDP's no_sync, or fsdp's
        switch, which holds until it is set again."""
        if self.ddp is None:
            cast(FSDPModule, self.module).set_requires_gradient_sync(last)
            return NO_EFFECT
        return NO_EFFECT if last else self.ddp.no_sync()

    def _lockstep(self, step: Step) -> Callable[[], None] | None:
        """fsdp: a forward on the first validation sample, for ranks with a batch fewer."""
        val, module = self.setup.data.val, self.module
        if not self.config.train.sharded or val is None or len(val) == 0:
            return None
        batch = batches.to_device(default_collate([val[0]]), self.device)

        def forward() -> None:
            eval_sums(step, module, batch)

        return forward

    def _checkpoint(self, *, final: bool = False) -> None:
        """Check the losses are finite, then checkpoint this step (once); `final` also drains."""
        step = self.state.step
        if self.saved_at != step:
            self.control.mark("the non-finite loss check", step)
            self.stats.check_finite(step)
            self.checkpoints.save(self.state, final=final)
            self.saved_at = step
        if final:
            self.checkpoints.drain(step)

    def _stopped(self, reason: str) -> StoppedEarly:
        self._checkpoint(final=True)
        step, where = self.state.step, self.checkpoints.path_for(self.state.step)
        self.metrics.append({"kind": "stop", "step": step, "reason": reason, "time": time.time()})
        self.checkpoints.publish_run_files(step)
        log.warning("stopped", reason=reason, step=step, checkpoint=str(where))
        return StoppedEarly(reason=reason, step=step, checkpoint=where)

    def _evaluate(self) -> dict[str, float]:
        # The step's train line comes before its evaluation's.
        self.control.mark("the loss all-reduce", self.state.step)
        self.stats.settle()
        self.control.mark("evaluation", self.state.step)
        return self.validation.run(
            self.module, self.state.step, device=self.device, autocast=self._autocast()
        )
