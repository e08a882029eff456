"""What a checkpoint captures of a run (weights, optimizer, schedule, scaler, user state, step),
built from the config and the user's factories, and turned into and back from a Payload."""

from __future__ import annotations

from typing import Any

import torch

from trainbox.checkpoint.schema import Payload
from trainbox.config import Config
from trainbox.logs import log
from trainbox.train import extra_state, init_weights, optim, seeding
from trainbox.train.seams import Seams


class TrainState:
    """The training state of one rank; the loop steps it, checkpoints save and restore it."""

    def __init__(
        self,
        config: Config,
        module: torch.nn.Module,
        *,
        seams: Seams,
        world_size: int,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ) -> None:
        self.config, self.module, self.seams = config, module, seams
        self.optimizer = optim.build_optimizer(
            config, module, world_size=world_size, factory=seams.optimizer
        )
        # optim.lr after optim.scale_lr: what the built-in schedules start from.
        self.peak_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler = optim.build_scheduler(config, self.optimizer, factory=seams.schedule)
        # Only fp16 needs loss scaling; disabled, the scaler passes every call straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        # Fixed once made: asked every step without a call into the scaler.
        self.scaling = self.scaler.is_enabled()
        # train.state_factory's objects; made by `begin` once init_from has set the weights.
        self.extra: dict[str, Any] = {}
        self.step = 0

    def begin(self, resumed: Payload | None, *, source: str) -> str | None:
        """Before the first step: init_from's weights for a new run, then train.state_factory's
        objects (restored when resuming). Returns the checkpoint init_from used, if any."""
        used = None
        init = self.config.train
        if resumed is None and init.init_from:
            # Every rank reads the same file, so the weights agree without a broadcast.
            path = init_weights.apply(
                self.module, source=init.init_from, prefix=init.init_prefix, strict=init.init_strict
            )
            used = str(path)
            log.info("initialised weights", checkpoint=used, prefix=init.init_prefix)
        self.extra = extra_state.build(self.seams.state, self.module, self.optimizer)
        if resumed is not None:
            extra_state.restore(self.extra, resumed.extra_state, source=source)
        return used

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to backpropagate: scaled for fp16, else itself (no GradScaler call)."""
        return self.scaler.scale(loss) if self.scaling else loss

    def apply_gradients(self, *, clip_grad_norm: float | None) -> None:
        """Clip, step the optimizer (through the scaler for fp16) and the schedule, zero grads."""
        scaling = self.scaling
        if clip_grad_norm:
            if scaling:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), clip_grad_norm)
        if scaling:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:  # what a disabled GradScaler does, without its calls
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def after_step(self) -> None:
        """Count the optimizer step just taken and tell the user's state objects."""
        self.step += 1
        if self.extra:  # most runs have none: no call
            extra_state.after_step(self.extra, self.step)

    def payload(self, *, config: dict[str, Any], config_hash: str, rng: list[Any]) -> Payload:
        """This state as a checkpoint holds it (`rng`: every rank's RNG states, in rank order)."""
        return Payload(
            step=self.step,
            config=config,
            config_hash=config_hash,
            model=self.module.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            rng=rng,
            extra_state=extra_state.state_dicts(self.extra),
        )

    def restore(
        self, saved: Payload, *, source: str, changed: list[str], rank: int, world_size: int
    ) -> None:
        """Load a checkpoint into this state (the user's state objects: in `begin`)."""
        self.module.load_state_dict(saved.model)
        optim.restore(
            self.optimizer,
            self.scheduler,
            optimizer_state=saved.optimizer,
            scheduler_state=saved.scheduler,
            source=source,
            fresh_optimizer="optim.name" in changed,
        )
        if saved.scaler or not self.scaler.is_enabled():
            self.scaler.load_state_dict(dict(saved.scaler or {}))
        else:
            log.warning("fp16 is new to this run: the gradient scaler starts afresh")
        if self.seams.optimizer is None and self.seams.schedule is None:
            # A user's optimizer and schedule carry their own lrs; optim.* shapes only built-ins.
            self._apply_optim_config()
        self.step = saved.step
        states = saved.rng or []
        if len(states) == world_size:
            seeding.restore(states[rank])
        else:
            log.warning(
                "world size changed since the checkpoint: RNG streams restart, so the result will"
                " differ from an uninterrupted run",
                checkpoint_world_size=len(states),
                world_size=world_size,
            )

    def _apply_optim_config(self) -> None:
        """This config's lr, schedule and decay over the restored state (which carries its own).

        Unchanged values give the very floats the restored state holds, so a plain resume stays
        bit-identical; a changed (allowed) value takes effect at once.
        """
        settings, scheduler, groups = self.config.optim, self.scheduler, self.optimizer.param_groups
        # Without a user schedule_factory, build_scheduler made the built-in LambdaLR.
        assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR), type(scheduler)
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        scheduler.base_lrs = [self.peak_lr for _ in groups]
        for group in groups:
            group["initial_lr"] = self.peak_lr
            group["lr"] = self.peak_lr * factor
            group["weight_decay"] = settings.weight_decay
            if settings.name == "sgd":
                group["momentum"] = settings.momentum
        scheduler._last_lr = [group["lr"] for group in groups]
