"""Sharded evaluation: each rank scores its share, sums are all-reduced, so metrics are exact."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from trainbox.train.objective import loss_fn


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: Any,
    *,
    kind: str,
    device: torch.device,
    autocast: AbstractContextManager[Any],
) -> dict[str, float]:
    """Validation loss and accuracy (or mae) over the whole set, identical on every rank."""
    was_training = model.training
    model.eval()
    # [loss sum, samples, correct or absolute-error sum], float64 so large sets add up exactly.
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast:
            outputs = model(inputs)
        count = targets.shape[0]
        totals[0] += loss_fn(kind, outputs.float(), targets).double() * count
        totals[1] += count
        if kind == "cross_entropy":
            totals[2] += (outputs.argmax(dim=-1) == targets).sum()
        else:
            error = (outputs.reshape(targets.shape).float() - targets.float()).abs()
            totals[2] += error.reshape(count, -1).mean(dim=1).sum()
    dist.all_reduce(totals)
    model.train(was_training)
    loss_sum, samples, third = totals.tolist()
    metric = "val_accuracy" if kind == "cross_entropy" else "val_mae"
    return {"val_loss": loss_sum / samples, metric: third / samples, "val_samples": int(samples)}
