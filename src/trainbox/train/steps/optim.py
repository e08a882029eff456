"""The optimizer and its learning-rate schedule: built-in from `optim.*`, or from user factories.

The trainer owns the LR scaling (`optim.scale_lr`) of every param group, stepping the scheduler
and checkpointing both, whichever code built them. The built-in schedule is warmup, then cosine
or constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainbox.config import Config
from trainbox.errors import UsageError
from trainbox.logs import log
from trainbox.train.steps.functions import describe
from trainbox.train.steps.user_code import UserFn, call


def scaled_lr(base: float, *, world_size: int, grad_accum: int, mode: str) -> float:
    """The peak lr after scaling by the number of samples an optimizer step sees."""
    factor = world_size * grad_accum
    if mode == "linear":
        return base * factor
    if mode == "sqrt":
        return base * math.sqrt(factor)
    return base


def lr_factor(step: int, *, warmup: int, total: int, kind: str, min_ratio: float) -> float:
    """Multiplier on the peak lr for optimizer step `step` (0-based)."""
    return lr_factors(warmup=warmup, total=total, kind=kind, min_ratio=min_ratio)(step)


def lr_factors(*, warmup: int, total: int, kind: str, min_ratio: float) -> Callable[[int], float]:
    """lr_factor with its settings bound, their constant parts worked out once: the schedule
    calls it every optimizer step. The float operations are the same, so the lr is bit for bit."""
    span = max(1, total - warmup)
    constant = kind == "constant"
    half_range = (1 - min_ratio) * 0.5

    def factor(step: int) -> float:
        if step < warmup:  # never when warmup is 0: steps count from 0
            return (step + 1) / warmup
        if constant:
            return 1.0
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + half_range * (1 + math.cos(math.pi * progress))

    return factor


class BuiltinSchedule(torch.optim.lr_scheduler.LambdaLR):
    """torch's LambdaLR with a short every-step path: the same lrs and the same state_dict, so
    checkpoints of either load into the other.

    LambdaLR.step runs about 240 Python bytecodes and a dozen calls a step (its misuse warnings,
    a context manager, tensor-lr checks), the largest piece of the trainer's own per-step work
    (benchmarks/step_overhead.py). Float lrs, the built-in optimizer's, take the short path.
    """

    def step(self, epoch: int | None = None) -> None:
        bases = self.base_lrs
        # torch's path: its own first call (from the constructor) and tensor lrs (filled in place).
        if epoch is not None or not self._step_count:
            super().step(epoch)
            return
        for base in bases:
            if type(base) is not float:
                super().step()
                return
        self._step_count += 1
        self.last_epoch = at = self.last_epoch + 1
        lrs = []
        groups = self.optimizer.param_groups
        for group, factor, base in zip(groups, self.lr_lambdas, bases, strict=True):
            group["lr"] = lr = base * factor(at)
            lrs.append(lr)
        self._last_lr = lrs


OPTIMIZER_HINT = "return a torch.optim.Optimizer over the model's parameters (param groups allowed)"
SCHEDULE_HINT = "return a torch.optim.lr_scheduler.LRScheduler built on the optimizer it is given"


def build_optimizer(
    config: Config, model: torch.nn.Module, *, world_size: int, factory: UserFn | None
) -> torch.optim.Optimizer:
    """The optimizer with every group's lr scaled for `world_size` * grad_accum samples."""
    optim = config.optim

    def scaled(lr: float) -> float:
        mode, accum = optim.scale_lr, config.train.grad_accum
        return scaled_lr(lr, world_size=world_size, grad_accum=accum, mode=mode)

    if factory is None:
        lr = scaled(optim.lr)
        if optim.name == "sgd":
            return torch.optim.SGD(
                model.parameters(), lr=lr, momentum=optim.momentum, weight_decay=optim.weight_decay
            )
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=optim.weight_decay)
    optimizer = call(factory, model, args=optim.args, key="optim.factory")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            f"optim.factory {factory.name} returned {describe(optimizer)}, not a"
            " torch.optim.Optimizer",
            hint=OPTIMIZER_HINT,
        )
    for group in optimizer.param_groups:
        group["lr"] = scaled(group["lr"])
    return optimizer


def build_scheduler(
    config: Config, optimizer: torch.optim.Optimizer, *, factory: UserFn | None
) -> torch.optim.lr_scheduler.LRScheduler:
    """Warmup + `optim.schedule` on every group, or the user's scheduler for `max_steps`."""
    optim, total = config.optim, config.train.max_steps
    if factory is None:
        kind, warmup, floor = optim.schedule, optim.warmup_steps, optim.min_lr_ratio
        factors = lr_factors(warmup=warmup, total=total, kind=kind, min_ratio=floor)
        return BuiltinSchedule(optimizer, factors)
    scheduler = call(
        factory, optimizer, total, args=optim.schedule_args, key="optim.schedule_factory"
    )
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise UsageError(
            f"optim.schedule_factory {factory.name} returned {describe(scheduler)}, not an"
            " LRScheduler",
            hint=SCHEDULE_HINT,
        )
    if scheduler.optimizer is not optimizer:
        raise UsageError(
            f"optim.schedule_factory {factory.name} returned a scheduler of another optimizer",
            hint=SCHEDULE_HINT,
        )
    return scheduler


def restore(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    optimizer_state: Mapping[str, Any] | None,
    scheduler_state: Mapping[str, Any] | None,
    source: str,
    fresh_optimizer: bool = False,
    optimizer_loaded: bool = False,
) -> None:
    """Load the checkpoint's optimizer and scheduler state; one error naming what did not fit.

    `fresh_optimizer`: the optimizer changed kind (an allowed resume change), so it starts afresh.
    `optimizer_loaded`: its state came from shards already; only the scheduler is left.
    """
    problems = []
    # LRScheduler.load_state_dict takes any dict without complaint: another kind of scheduler's
    # state would be merged in silently, so its keys must be this scheduler's own.
    theirs, ours = set(scheduler_state or {}), set(scheduler.state_dict())
    if theirs != ours:
        extra = ", ".join(sorted(theirs - ours)) or "fewer keys"
        problems.append(
            f"the scheduler state in {source} is another kind of schedule than this run's"
            f" {type(scheduler).__name__} (it has {extra})"
        )
    if fresh_optimizer:
        log.warning("the optimizer changed: its state starts afresh", checkpoint=source)
    skip = fresh_optimizer or optimizer_loaded
    mine = [] if skip else [("optimizer", optimizer, optimizer_state)]
    targets = mine + ([] if problems else [("scheduler", scheduler, scheduler_state)])
    for name, target, state in targets:
        try:
            if state is None:
                raise KeyError(f"{source} holds no {name} state")
            # torch takes a dict (it copies it); the checkpoint's state is a read-only Mapping.
            target.load_state_dict(dict(state))
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as err:
            reason = " ".join(str(err).split())[:200]
            problems.append(
                f"the {name} state in {source} does not fit this run's {name}"
                f" ({type(target).__name__}): {type(err).__name__}: {reason}"
            )
    if problems:
        raise UsageError(
            problems,
            hint="resume with the optim.* settings and factories the run was started with,"
            " or start a new run_dir",
        )
