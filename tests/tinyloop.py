"""A whole TrainingLoop in this process: a world of one, a Linear(3, 2), 64 random samples.

For unit tests that watch what the real loop does (host syncs, the order of a background save's
copy and the optimizer step) without a launcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from trainbox.config import load
from trainbox.launch.context import LaunchContext
from trainbox.train.data.contract import Datasets
from trainbox.train.loop import LoopInputs, TrainingLoop
from trainbox.train.watch.control import RunControl


@contextmanager
def world_of_one() -> Iterator[None]:
    """A real gloo group of this process alone, on an in-memory store (no port, nothing left)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def tiny_loop(run_dir: Path, *, steps: int, overrides: list[str]) -> TrainingLoop:
    """The loop for `steps` steps of batch 4, logging only at the end; `overrides` on top."""
    config = load(
        None,
        [
            f"run_dir={run_dir}", f"train.max_steps={steps}", "train.batch_size=4",
            "train.log_every=1000", "train.eval_every=0", "train.resume=never", *overrides,
        ],
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(64, 3, generator=generator), torch.randint(0, 2, (64,), generator=generator)
    )
    context = LaunchContext(
        launcher="single", flavor="single", rank=0, local_rank=0, world_size=1,
        local_world_size=1, node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=0,
    )  # fmt: skip
    torch.manual_seed(0)
    setup = LoopInputs(
        config=config,
        context=context,
        device=torch.device("cpu"),
        model=torch.nn.Linear(3, 2),
        data=Datasets(train=data, val=None, max_workers=0),
        control=RunControl(),
    )
    return TrainingLoop(setup)
