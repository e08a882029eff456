"""The DDP training loop: resume, accumulate, step, log, evaluate, checkpoint, summarise.

Its parts live beside it: the state a checkpoint captures (`state`), checkpoints
(`checkpointing`), resuming (`resume`), the step's loss and metrics (`objective`,
`step_metrics`), DDP (`ddp`), run_dir and its files (`rundir`, `runfiles`), and `hooks` for
the watchdog, the stop vote and test faults.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from trainbox.logs import log
from trainbox.train import batches, ddp, runfiles, seeding
from trainbox.train.checkpointing import Checkpointer
from trainbox.train.data import TrainBatches
from trainbox.train.evaluate import Validation, eval_step
from trainbox.train.objective import NOTHING, amp_dtype, autocast, train_loss
from trainbox.train.progress import Progress
from trainbox.train.rundir import RunDir
from trainbox.train.seams import choose
from trainbox.train.setup import Setup
from trainbox.train.start import start
from trainbox.train.state import TrainState
from trainbox.train.step_metrics import StepMetrics


class TrainingLoop:
    """The loop behind api.Trainer: trains `setup.model` on `setup.data`, returns the summary."""

    def __init__(self, setup: Setup) -> None:
        self.setup, self.config, self.hooks = setup, setup.config, setup.hooks
        self.context, self.device = setup.context, setup.device
        config, train = setup.config, setup.config.train
        rank, world = setup.context.rank, setup.context.world_size
        self.run_dir = RunDir(config.output_dir, rank0=rank == 0)
        self.batches = TrainBatches(
            setup.data.train,
            batch_size=train.batch_size,
            rank=rank,
            world_size=world,
            seed=config.seed,
            num_workers=setup.num_workers,
            worker_init=setup.worker_init,
            pin_memory=self.device.type == "cuda",
        )
        self.module = setup.model.to(self.device)
        self.ddp, self.forward = ddp.wrap(self.module, self.device, train)
        self.seams = setup.seams or choose(config)
        self.amp_dtype = amp_dtype(train.amp, self.device)
        # The context every step runs in (autocast, or nothing with AMP off).
        self._autocast = functools.partial(autocast, self.amp_dtype, self.device)
        self.state = TrainState(
            config,
            self.module,
            seams=self.seams,
            world_size=world,
            device=self.device,
            amp_dtype=self.amp_dtype,
        )
        self.checkpoints = Checkpointer(
            config.output_dir / "checkpoints",
            context=self.context,
            device=self.device,
            config=config,
            hooks=self.hooks,
        )
        self.metrics = runfiles.MetricsFile.for_run(config, enabled=rank == 0)
        self.stats = StepMetrics(
            self.metrics,
            device=self.device,
            world_size=world,
            seams=self.seams,
            last_good=self.checkpoints.last_good,
        )
        self.validation = Validation(
            setup.data.val,
            step=setup.eval_step or eval_step(train.eval_step, kind=train.loss),
            context=self.context,
            batch_size=train.batch_size,
            num_workers=setup.num_workers,
            record=self.metrics.append,
        )
        # Model init used the run seed on every rank; from here each rank draws its own stream.
        seeding.seed_all(seeding.rank_seed(config.seed, rank))

    def fit(self) -> dict[str, Any]:
        """Train to `train.max_steps` (resuming if a checkpoint says so) and write the outputs."""
        state, context, run_dir = self.state, self.context, self.run_dir
        begun = start(
            self.config,
            state,
            run_dir=run_dir,
            context=context,
            device=self.device,
            metrics=self.metrics,
            seams=self.seams,
            amp_dtype=self.amp_dtype,
        )
        if begun.done is not None:
            return begun.done
        self.checkpoints.saved_at = state.step if begun.resumed else -1
        if begun.last_loss is not None:
            self.stats.last_loss = begun.last_loss
        started = time.perf_counter()
        samples_per_s, stopped = self._loop()
        if stopped:
            return self._stopped(stopped)
        val = self._evaluate()
        self._checkpoint(final=True)
        summary = {
            "steps": state.step,
            "world_size": context.world_size,
            "launcher": context.launcher,
            "global_batch": begun.global_batch,
            "final_loss": self.stats.last_loss,
            "val_metrics": val,
            "samples_per_s": samples_per_s,
            "train_seconds": time.perf_counter() - started,
            "params_sha256": runfiles.params_sha256(self.module),
        }
        if context.rank == 0:
            runfiles.write_summary(run_dir.path, summary)
        log.info("finished", **{k: v for k, v in summary.items() if k != "val_metrics"}, **val)
        return summary

    def close(self) -> None:
        """Drop the DDP wrapper (and the compiled graph) before the process group goes away."""
        self.checkpoints.close()
        self.hooks.close()
        del self.forward, self.ddp
        self.run_dir.release()

    def _loop(self) -> tuple[float, str]:
        """Step until max_steps or an agreed stop: (samples per second, the stop's reason)."""
        train, state, hooks = self.config.train, self.state, self.hooks
        micro_batches = self.batches.iterate(self.batches.position(state.step * train.grad_accum))
        progress = Progress(train.max_steps, enabled=self.context.rank == 0)
        self.stats.start(state.step)
        hooks.mark("settling DDP's gradient buckets", state.step)
        ddp.settle_buckets(
            self.ddp,
            self.forward,
            step=self.seams.step,
            data=self.setup.data.train,
            device=self.device,
            autocast=self._autocast(),
        )
        state.optimizer.zero_grad(set_to_none=True)
        dist = self.config.dist
        stop = hooks.start(state.step, timeout_s=dist.timeout_s, every_s=dist.vote_every_s)
        while not stop and state.step < train.max_steps:
            hooks.before_step(state.step + 1)
            loss, samples = self._optimizer_step(micro_batches)
            state.after_step()
            hooks.after_step(state.step)
            self.stats.add(loss, samples)
            if state.step % train.log_every == 0 or state.step == train.max_steps:
                hooks.mark("the loss all-reduce", state.step)
                epoch = self.batches.position(state.step * train.grad_accum).epoch
                lr = float(state.scheduler.get_last_lr()[0])  # a tensor lr too
                self.stats.log(state.step, epoch=epoch, lr=lr, progress=progress)
            if train.eval_every and state.step % train.eval_every == 0:
                progress.eval(state.step, self._evaluate())
            if train.ckpt_every and state.step % train.ckpt_every == 0:
                self._checkpoint()
            stop = hooks.stop_after(state.step)
        hooks.finish(timeout_s=dist.timeout_s)
        progress.close()
        # Asked for during the last step: the work is done, nothing to resume.
        return self.stats.rate(), "" if state.step >= train.max_steps else stop

    def _optimizer_step(self, micro_batches: Any) -> tuple[torch.Tensor, int]:
        """One optimizer step: its summed loss (on the device) and this rank's sample count.

        Nothing here waits for the device (no .item(), .tolist(), .cpu()): a test counts them.
        """
        train, state, step = self.config.train, self.state, self.state.step + 1
        accum, samples = train.grad_accum, 0
        total: torch.Tensor | None = None
        for micro in range(accum):
            waited = time.perf_counter()
            batch = next(micro_batches)
            batch, count = batches.on_device(batch, self.device)  # disagreeing tensors stop here
            samples += count
            waited = time.perf_counter() - waited
            self.hooks.mark("forward/backward and the gradient all-reduce", step)
            last = micro == accum - 1  # gradients are all-reduced on the last micro-batch only
            if last and self.amp_dtype is None:  # the usual step: no context to enter
                loss, extras = train_loss(self.seams.step, self.forward, batch)
            else:
                with NOTHING if last else self.ddp.no_sync(), self._autocast():
                    loss, extras = train_loss(self.seams.step, self.forward, batch)
            if accum > 1:  # x / 1 is x bit for bit: skipping it keeps the fingerprints
                loss = loss / accum  # div is on no autocast list: the same outside it
            state.scaled(loss).backward()
            loss = loss.detach()
            total = loss if total is None else total + loss
            self.stats.add_micro(extras, micro_batches=accum, waited_s=waited)
        self.checkpoints.before_update()
        state.apply_gradients(clip_grad_norm=train.clip_grad_norm)
        assert total is not None  # grad_accum >= 1 (config checks it)
        return total, samples

    def _checkpoint(self, *, final: bool = False) -> None:
        """Check the losses are finite, then checkpoint this step (once); `final` also drains."""
        step = self.state.step
        if self.checkpoints.saved_at != step:
            self.hooks.mark("the non-finite loss check", step)
            self.stats.check_finite(step)
            self.checkpoints.save(self.state, final=final)
        if final:
            self.checkpoints.drain(step)

    def _stopped(self, reason: str) -> dict[str, Any]:
        self._checkpoint(final=True)
        step, where = self.state.step, self.checkpoints.path_for(self.state.step)
        self.metrics.append({"kind": "stop", "step": step, "reason": reason, "time": time.time()})
        log.warning("stopped", reason=reason, step=step, checkpoint=str(where))
        return {"stopped": reason, "steps": step, "checkpoint": str(where)}

    def _evaluate(self) -> dict[str, float]:
        self.hooks.mark("evaluation", self.state.step)
        return self.validation.at(
            self.module, self.state.step, device=self.device, autocast=self._autocast()
        )
