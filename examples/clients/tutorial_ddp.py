"""PyTorch's DDP tutorial for torchrun (multigpu_torchrun.py), on CPU with gloo.

Written for a launcher that sets LOCAL_RANK, RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT:
torchrun, or `trainbox exec` under any launcher. It never imports trainbox. Every process
writes OUT/rank-<rank>.json. The commands are in README.md beside it.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SEED = 1234
STEPS = 24


def ddp_setup() -> None:
    """env://: torchrun (or trainbox exec) sets RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT."""
    init_process_group(backend="gloo")


def make_dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(512, 8, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).tanh()
    return TensorDataset(inputs, targets)


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(model)
        self.steps = 0

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1

    def train(self, max_steps: int) -> None:
        epoch = 0
        while self.steps < max_steps:
            self.train_data.sampler.set_epoch(epoch)
            for source, targets in self.train_data:
                self._run_batch(source, targets)
                if self.steps == max_steps:
                    break
            epoch += 1


def main(out: Path) -> None:
    ddp_setup()
    torch.manual_seed(SEED)
    dataset = make_dataset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_data = DataLoader(
        dataset, batch_size=16, shuffle=False, sampler=DistributedSampler(dataset)
    )
    trainer = Trainer(model, train_data, optimizer)
    trainer.train(STEPS)

    # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
    rank_sum = torch.tensor(float(dist.get_rank()))
    dist.all_reduce(rank_sum)
    record = {
        "client": "tutorial_ddp",
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "local_rank": trainer.local_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": rank_sum.item(),
        "steps": trainer.steps,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank-{dist.get_rank()}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    # Let go of DDP first: its reducer holds the process group, whose gloo threads would then
    # outlive destroy_process_group() and can abort the process as Python exits ("terminate
    # called without an active exception", about one run in seven on torch 2.13).
    del trainer
    gc.collect()
    destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
