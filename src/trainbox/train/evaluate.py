"""Sharded evaluation: each rank scores whole batches; their sums, added in batch order, give
metrics with the same bits at every world size.

What is measured is an eval step (train/steps/functions.py): the built-in one of
`train.loss`, or the user's `train.eval_step` returning {name: (sum, count)}. Every metric is
its whole-set sum over its whole-set count; `val_samples` counts the samples (each once: the
shards have no padding).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox.config import factories
from trainbox.distributed import consensus
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.train.data import batches
from trainbox.train.data.map_style import eval_batch_count, eval_loader
from trainbox.train.steps.functions import Step, builtin_eval_step, eval_sums

__all__ = ["Validation", "eval_step", "evaluate", "step_of"]


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
    slots: int,
    lockstep: Callable[[], None] | None = None,
) -> dict[str, float]:
    """`val_<name>` for each metric the step returns, and `val_samples`; the same on every rank.

    `loader` gives this rank's batches of `eval_loader` (batch b of the set on rank b % W), at
    most `slots` of them. Collective: every rank calls it, also one with no batch. A step that
    returns the wrong shape stops every rank with the same UsageError (exit 2), never a hang.
    `lockstep`: a throwaway forward, run until this rank has made `slots` forwards (a sharded
    model's forward is collective, and ranks hold up to one batch fewer than others).
    """
    was_training = model.training
    model.eval()
    try:
        rows, problem = _batch_sums(model, loader, step=step, device=device, autocast=autocast)
        if lockstep is not None:
            for _ in range(slots - len(rows)):
                with autocast:
                    lockstep()
    finally:
        model.train(was_training)
    names = _agreed([name for row in rows for name in row], problem)
    every = _gathered(_table(rows, names, slots=slots, device=device))
    return _metrics(every, names)


def _batch_sums(
    model: torch.nn.Module,
    loader: Any,
    *,
    step: Step,
    device: torch.device,
    autocast: AbstractContextManager[Any],
) -> tuple[list[dict[str, tuple[torch.Tensor, torch.Tensor]]], UsageError | None]:
    """Per batch, in order: {name: (sum, count)} in float64, `samples` included."""
    rows: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    try:
        for batch in loader:
            batch = batches.to_device(batch, device)
            count = float(batches.sample_count(batch))
            with autocast:
                sums = eval_sums(step, model, batch)
            if "samples" in sums:
                raise UsageError(
                    f"train.eval_step {step.name} returned a metric named 'samples'",
                    hint="rename it: val_samples is the number of samples evaluated",
                )
            row = {name: (_as_float64(total, device), _as_float64(n, device))
                   for name, (total, n) in sums.items()}  # fmt: skip
            row["samples"] = (_as_float64(count, device), _as_float64(count, device))
            rows.append(row)
    except UsageError as err:
        # Stop here, but still meet the other ranks: they learn of it and stop alike.
        return rows, err
    return rows, None


def _table(
    rows: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    names: list[str],
    *,
    slots: int,
    device: torch.device,
) -> torch.Tensor:
    """This rank's batches as a [slots, 2 * len(names)] float64 tensor of (sum, count) pairs,
    padded with zero rows up to `slots` so that every rank sends the same shape."""
    table = torch.zeros((slots, 2 * len(names)), dtype=torch.float64, device=device)
    zero = (table.new_zeros(()), table.new_zeros(()))
    flat = [torch.stack([value for name in names for value in row.get(name, zero)]) for row in rows]
    if flat:
        table[: len(flat)] = torch.stack(flat)
    return table


def _gathered(table: torch.Tensor) -> list[list[float]]:
    """Every rank's table, as rows in the set's batch order (batch b = slot j of rank b % W).

    One all-gather of slots x columns float64 per rank: at 4,096 ranks and 10,000 validation
    batches of 3 metrics, each rank receives 10,000 x 6 x 8 bytes, about 0.5 MB.
    """
    world = torch_dist.get_world_size()
    tables = [torch.empty_like(table) for _ in range(world)]
    torch_dist.all_gather(tables, table)
    # [rank, slot, column] -> [slot, rank, column]: row j * W + r is batch j * W + r.
    ordered = torch.stack(tables).transpose(0, 1).reshape(-1, table.shape[1])
    return ordered.cpu().tolist()


def _metrics(rows: list[list[float]], names: list[str]) -> dict[str, float]:
    """Each metric's whole-set sum over its count, added exactly (math.fsum) in batch order."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * (2 * len(names))
    totals = {name: (math.fsum(columns[2 * i]), math.fsum(columns[2 * i + 1]))
              for i, name in enumerate(names)}  # fmt: skip
    samples = int(totals.pop("samples")[0])
    metrics = {f"val_{name}": _ratio(total, count) for name, (total, count) in totals.items()}
    return metrics | {"val_samples": samples}


def _agreed(mine: list[str], problem: UsageError | None) -> list[str]:
    """Every rank's metric names (rank 0's first, in their order), `samples` last; any rank's
    problem raised on every rank. Rank 0 judges."""
    sent = (list(dict.fromkeys(mine)), problem.problems if problem else None,
            problem.hint if problem else "")  # fmt: skip
    names, problems, hint = consensus.decided_by_rank0(sent, _judged)
    if problems:
        raise UsageError(problems, hint=hint)
    return [*(name for name in names if name != "samples"), "samples"]


def _judged(everyone: list[Any]) -> tuple[list[str], list[str], str]:
    problems = list(dict.fromkeys(text for _, texts, _ in everyone if texts for text in texts))
    hint = next((hint for _, texts, hint in everyone if texts), "")
    names = list(dict.fromkeys(name for names, _, _ in everyone for name in names))
    return names, problems, hint


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
        stuck_after_s: float,
        record: Callable[[dict[str, Any]], None],
        lockstep: Callable[[], None] | None = None,
    ) -> None:
        self.dataset, self.step = dataset, step
        # A sharded model's throwaway forward, so every rank makes as many (see `evaluate`).
        self.lockstep = lockstep
        self.rank, self.world_size = context.rank, context.world_size
        self.batch_size, self.num_workers = batch_size, num_workers
        # A starting worker silent this long is stuck in its fork (train/data/workers.py).
        self.stuck_after_s = stuck_after_s
        # Where a `val` line goes (metrics.jsonl).
        self.record = record
        self.last: dict[str, float] = {}
        # The training step the last evaluation was at.
        self.done_at = -1

    def run(
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
            stuck_after_s=self.stuck_after_s,
        )
        slots = eval_batch_count(
            len(self.dataset), batch_size=self.batch_size, world_size=self.world_size
        )
        metrics = evaluate(
            model,
            loader,
            step=self.step,
            device=device,
            autocast=autocast,
            slots=slots,
            lockstep=self.lockstep,
        )
        self.last, self.done_at = metrics, at_step
        self.record({"kind": "val", "step": at_step, **metrics, "time": time.time()})
        log.info("eval", step=at_step, **metrics)
        return metrics
