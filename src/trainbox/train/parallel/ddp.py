"""The model as the loop trains it: wrapped in DistributedDataParallel (compiled if asked; each
repeated block checkpointed if asked), with its gradient buckets settled before the first
counted step."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import default_collate

from trainbox.config import TrainConfig
from trainbox.train.data import batches
from trainbox.train.parallel.blocks import recompute_in_backward, repeated_blocks
from trainbox.train.steps.functions import Step, train_loss


class MapStyle(Protocol):
    """A map-style dataset with a length: what the data factory returns for training."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def wrap(
    module: torch.nn.Module, device: torch.device, train: TrainConfig
) -> tuple[DistributedDataParallel, Any]:
    """(the DDP wrapper, what a step calls: the wrapper, or its compiled form)."""
    if train.activation_checkpointing:
        # The blocks fsdp would shard by default; a model without any is one block.
        for block in repeated_blocks(module) or [module]:
            recompute_in_backward(block)
    ddp = DistributedDataParallel(
        module,
        device_ids=[device] if device.type == "cuda" else None,
        find_unused_parameters=train.find_unused_parameters,
    )
    return ddp, torch.compile(ddp) if train.compile else ddp


def settle_buckets(
    ddp: DistributedDataParallel,
    forward: Any,
    *,
    step: Step,
    data: MapStyle,
    device: torch.device,
    autocast: Any,
) -> None:
    """One throwaway backward pass, so a resumed run sums gradients as an unbroken one does.

    DDP regroups its gradient buckets in gradient-ready order after the first backward of
    each process, and the grouping sets the order in which gloo adds the ranks' values: from
    3 ranks on, a run resumed at step k would round differently from one that passed step k
    in one go. Settling at every start makes every counted step use the same grouping. Eval
    mode: no dropout draw, no BatchNorm statistics; no optimizer step; no sampler batch.
    The caller zeroes the gradients afterwards (they are all zero, but exist).
    """
    batch = default_collate([data[i] for i in range(min(2, len(data)))])
    ddp.eval()
    with autocast:
        loss, _ = train_loss(step, forward, batches.to_device(batch, device))
        # Zero-weighted: every parameter gets a gradient hook call, none a value.
        (loss * 0).backward()
    ddp.train()
