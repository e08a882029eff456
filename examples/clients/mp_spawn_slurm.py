"""One process per node from the launcher, which spawns the node's workers itself.

The style of many cluster how-tos: `srun --ntasks-per-node=1` (or nothing, on one machine)
starts this script once per node, and `torch.multiprocessing.spawn` starts CLIENT_PROCS workers
(default 2). The node's place comes from SLURM_NODEID and SLURM_NNODES (0 and 1 outside
Slurm); MASTER_ADDR and MASTER_PORT come from the environment, which `trainbox exec` fills in.
It never imports trainbox. Every worker writes OUT/rank-<rank>.json. The commands are in
README.md beside it.
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
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 1234
STEPS = 24


def worker(local_rank: int, node_id: int, nprocs: int, nnodes: int, out: Path) -> None:
    rank = node_id * nprocs + local_rank
    world_size = nnodes * nprocs
    dist.init_process_group(backend="gloo", init_method="env://", rank=rank, world_size=world_size)
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(512, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, epoch = 0, 0
    while steps < STEPS:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
            if steps == STEPS:
                break
        epoch += 1

    # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
    rank_sum = torch.tensor(float(dist.get_rank()))
    dist.all_reduce(rank_sum)
    record = {
        "client": "mp_spawn_slurm",
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "local_rank": local_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": rank_sum.item(),
        "steps": steps,
        "node_id": node_id,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank-{rank}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    # Let go of DDP first: its reducer holds the process group, whose gloo threads would then
    # outlive destroy_process_group() and can abort the worker as Python exits.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


def main(out: Path) -> None:
    nprocs = int(os.environ.get("CLIENT_PROCS", 2))
    node_id = int(os.environ.get("SLURM_NODEID", 0))
    nnodes = int(os.environ.get("SLURM_NNODES", 1))
    mp.spawn(worker, args=(node_id, nprocs, nnodes, out), nprocs=nprocs)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
