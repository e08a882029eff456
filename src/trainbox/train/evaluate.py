"""Sharded evaluation: each rank scores its share, sums are all-reduced, so metrics are exact.

What is measured is an eval step (train/objective.py): the built-in one of `train.loss`, or the
user's `train.eval_step` returning {name: (sum, count)}. Every metric is its whole-set sum over
its whole-set count; `val_samples` counts the samples (each once: the shards have no padding).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox import consensus, factories
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.train import batches
from trainbox.train.data import eval_loader
from trainbox.train.objective import Step, builtin_eval_step, eval_sums

__all__ = ["Validation", "eval_step", "evaluate", "step_of", "unpack"]


def eval_step(path: str, *, kind: str) -> Step:
    """The step named by `train.eval_step` (imported now), or the built-in one of `kind`."""
    if not path:
        builtin = builtin_eval_step(kind)
        return Step(fn=lambda model, batch: builtin.fn(model, _pair(batch)), name=builtin.name)
    return Step(fn=factories.resolve(path, key="train.eval_step"), name=path)


def _pair(batch: Any) -> Any:
    """The batch, if it is the `(inputs, targets)` the built-in metrics read."""
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch
    raise UsageError(
        f"the built-in validation metrics read (inputs, targets) batches, not a"
        f" {type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, tuple | list) else ''}",
        hint="set train.eval_step to a function that reads your batches (docs/eval-predict.md)",
    )


def step_of(fn: Callable[[Any, Any], Any]) -> Step:
    """A step given as a Python object (the API's keywords), named as config would name it."""
    return Step(fn=fn, name=f"{fn.__module__}:{getattr(fn, '__qualname__', repr(fn))}")


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: Any,
    *,
    step: Step,
    device: torch.device,
    autocast: AbstractContextManager[Any],
) -> dict[str, float]:
    """`val_<name>` for each metric the step returns, and `val_samples`; the same on every rank.

    Collective: every rank calls it, also one whose share is empty. A step that returns the
    wrong shape stops every rank with the same UsageError (exit 2), never a hang.
    """
    was_training = model.training
    model.eval()
    try:
        totals, samples, problem = _local_sums(model, loader, step=step, device=device,
                                               autocast=autocast)  # fmt: skip
    finally:
        model.train(was_training)
    # Counts equal to the samples (the built-in step's) need no all-reduce of their own.
    uniform = all(count.item() == samples for _, count in totals.values())
    names, uniform = _agreed(list(totals), uniform, problem)
    # [sum 0, samples, sum 1, ...], then the counts unless uniform: before user steps the
    # built-in metrics were all-reduced as [loss, samples, third] and keep that layout, so
    # their bits. float64 so large sets add up exactly.
    sums = [totals[name][0] if name in totals else _zero(device) for name in names]
    counts = [] if uniform else [totals[n][1] if n in totals else _zero(device) for n in names]
    samples_at = torch.tensor(float(samples), dtype=torch.float64, device=device)
    packed = torch.stack([*sums[:1], samples_at, *sums[1:], *counts])
    torch_dist.all_reduce(packed)
    return unpack(packed.tolist(), names, uniform=uniform)


def unpack(values: list[float], names: list[str], *, uniform: bool) -> dict[str, float]:
    """The metrics from the all-reduced [sum 0, samples, sum 1, ..., (count per name)]."""
    if not names:
        return {"val_samples": int(values[0])}
    samples = values[1]
    sums = [values[0], *values[2 : len(names) + 1]]
    counts = [samples] * len(names) if uniform else values[len(names) + 1 :]
    metrics = {
        f"val_{name}": _ratio(total, count)
        for name, total, count in zip(names, sums, counts, strict=True)
    }
    return metrics | {"val_samples": int(samples)}


def _local_sums(
    model: torch.nn.Module,
    loader: Any,
    *,
    step: Step,
    device: torch.device,
    autocast: AbstractContextManager[Any],
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int, UsageError | None]:
    """This rank's (sum, count) per metric in first-seen order, its samples, and what went wrong."""
    totals: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    samples = 0
    try:
        for batch in loader:
            batch = batches.to_device(batch, device)
            samples += batches.sample_count(batch)
            with autocast:
                sums = eval_sums(step, model, batch)
            if "samples" in sums:
                raise UsageError(
                    f"train.eval_step {step.name} returned a metric named 'samples'",
                    hint="rename it: val_samples is the number of samples evaluated",
                )
            for name, (total, count) in sums.items():
                running = totals.setdefault(name, (_zero(device), _zero(device)))
                running[0].add_(_as_float64(total, device))
                running[1].add_(_as_float64(count, device))
    except UsageError as err:
        # Stop here, but still meet the other ranks: they learn of it and stop alike.
        return totals, samples, err
    return totals, samples, None


def _agreed(mine: list[str], uniform: bool, problem: UsageError | None) -> tuple[list[str], bool]:
    """Every rank's metric names (rank 0's first, in their order) and whether every count is the
    samples on every rank; any rank's problem raised on every rank. Rank 0 judges."""
    sent = (mine, uniform, problem.problems if problem else None, problem.hint if problem else "")
    names, all_uniform, problems, hint = consensus.decided_by_rank0(sent, _judged)
    if problems:
        raise UsageError(problems, hint=hint)
    return names, all_uniform


def _judged(everyone: list[Any]) -> tuple[list[str], bool, list[str], str]:
    problems = list(dict.fromkeys(text for _, _, texts, _ in everyone if texts for text in texts))
    hint = next((hint for _, _, texts, hint in everyone if texts), "")
    names = list(dict.fromkeys(name for names, _, _, _ in everyone for name in names))
    return names, all(flag for _, flag, _, _ in everyone), problems, hint


def _zero(device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64, device=device)


def _as_float64(value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def _ratio(total: float, count: float) -> float:
    # A metric no sample contributed to has no value (JSON writes NaN as NaN; the log shows it).
    return total / count if count else float("nan")


class Validation:
    """The loop's evaluations of the validation set: run, logged, written, and not repeated."""

    def __init__(
        self,
        dataset: Any,
        *,
        step: Step,
        context: LaunchContext,
        batch_size: int,
        num_workers: int,
        record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.dataset, self.step = dataset, step
        self.rank, self.world_size = context.rank, context.world_size
        self.batch_size, self.num_workers = batch_size, num_workers
        # Where a `val` line goes (metrics.jsonl).
        self.record = record
        self.last: dict[str, float] = {}
        # The training step the last evaluation was at.
        self.done_at = -1

    def at(
        self, model: torch.nn.Module, at_step: int, *, device: torch.device, autocast: Any
    ) -> dict[str, float]:
        """The metrics after training step `at_step` (collective; {} without a validation set)."""
        if self.dataset is None:
            return {}
        if self.done_at == at_step:
            return self.last
        loader = eval_loader(
            self.dataset,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
        )
        metrics = evaluate(model, loader, step=self.step, device=device, autocast=autocast)
        self.last, self.done_at = metrics, at_step
        self.record({"kind": "val", "step": at_step, **metrics, "time": time.time()})
        log.info("eval", step=at_step, **metrics)
        return metrics
