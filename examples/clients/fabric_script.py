"""A plain PyTorch loop accelerated with Lightning Fabric (the DDP strategy, on CPU).

Fabric finds its cluster like Lightning's Trainer: torchrun's variables, Slurm's under srun,
and otherwise `fabric.launch()` starts the other processes of `devices` on this machine itself
unless LOCAL_RANK says a launcher did. `devices` and `num_nodes` come from CLIENT_DEVICES and
CLIENT_NODES (default 1). It never imports trainbox. Every process writes
OUT/rank-<global_rank>.json. The commands are in README.md beside it.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 1234
STEPS = 24


def main(out: Path) -> None:
    fabric = Fabric(
        accelerator="cpu",
        devices=int(os.environ.get("CLIENT_DEVICES", 1)),
        num_nodes=int(os.environ.get("CLIENT_NODES", 1)),
        strategy="ddp",
    )
    fabric.launch()
    fabric.seed_everything(SEED)

    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(1024, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    # Fabric adds the DistributedSampler itself.
    dataloader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=16))

    steps = 0
    while steps < STEPS:
        for x, y in dataloader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            steps += 1
            if steps == STEPS:
                break

    # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
    rank_sum = fabric.all_reduce(torch.tensor(float(fabric.global_rank)), reduce_op="sum")
    record = {
        "client": "fabric_script",
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": rank_sum.item(),
        "steps": steps,
        "cluster_environment": type(fabric.strategy.cluster_environment).__name__,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank-{fabric.global_rank}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    # Fabric leaves the process group to the script. Let go of the DDP-wrapped model first (its
    # reducer holds the group), then destroy the group while Python is still whole: gloo threads
    # left to interpreter exit can abort the process ("terminate called without an active
    # exception").
    del model, optimizer
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
