"""The process group: backend and device choice (pure), and init/teardown (a context manager)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from trainbox.launch.context import LaunchContext


def choose_backend(configured: str, *, cuda: bool) -> str:
    """`auto` is nccl when this process drives a GPU, else gloo; an explicit choice stands."""
    if configured != "auto":
        return configured
    return "nccl" if cuda else "gloo"


def choose_device(context: LaunchContext, *, cuda_count: int) -> torch.device:
    """This rank's device: its local rank's GPU, wrapping when fewer GPUs are visible than ranks."""
    if cuda_count == 0:
        return torch.device("cpu")
    # One visible GPU per task (srun --gpus-per-task, torchrun virtual local rank): it is ours.
    return torch.device("cuda", context.local_rank % cuda_count)


@contextmanager
def process_group(
    context: LaunchContext, *, backend: str, timeout_s: float, device: torch.device
) -> Iterator[None]:
    """Join the job's process group through env:// and always leave it again."""
    # init_method env:// reads these; the CLI's outer layer is the only place that sets them.
    missing = [
        name
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        if name not in os.environ
    ]
    if missing:
        raise RuntimeError(f"process_group needs {missing} in os.environ (set by the CLI)")
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=context.rank,
        world_size=context.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
        # Leave together: a rank that tears down while a peer still talks to it can abort
        # gloo's transport threads ("terminate called without an active exception").
        dist.barrier()
    finally:
        # Objects holding the group (DDP's reducer) must be gone before the group is.
        gc.collect()
        dist.destroy_process_group()
