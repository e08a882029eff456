"""A plain PyTorch loop with Hugging Face Accelerate, on CPU, started with plain `python`.

Accelerate reads its world from the environment (WORLD_SIZE, RANK, LOCAL_RANK and
MASTER_ADDR/MASTER_PORT as torchrun sets them, or MPI's own variables) and falls back to one
process. No `accelerate launch` and no `accelerate config`. With CLIENT_FSDP=2 it passes
Accelerate's FSDP plugin (`FullyShardedDataParallelPlugin(fsdp_version=2)`), as its FSDP guide
configures it in code; Accelerate takes FSDP only on an accelerator device, and on CPU keeps
the plugin but wraps the model in DDP (its state.py), which each rank records. It never
imports trainbox. Every process writes OUT/rank-<process_index>.json. The commands are in
README.md beside it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 1234
STEPS = 24


def main(out: Path) -> None:
    fsdp = os.environ.get("CLIENT_FSDP")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=int(fsdp)) if fsdp else None
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), fsdp_plugin=plugin)
    set_seed(SEED)

    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(1024, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataloader = DataLoader(dataset, batch_size=16)
    # Accelerate shards the dataloader across processes and wraps the model in DDP.
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)

    steps = 0
    while steps < STEPS:
        for x, y in dataloader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            steps += 1
            if steps == STEPS:
                break

    # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
    mine = torch.tensor(float(accelerator.process_index))
    rank_sum = accelerator.reduce(mine, reduction="sum")
    record = {
        "client": "accelerate_script",
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "local_rank": accelerator.local_process_index,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": rank_sum.item(),
        "steps": steps,
        "distributed_type": str(accelerator.distributed_type),
        # FSDPModule under FSDP2 (on a GPU); DistributedDataParallel on CPU.
        "wrapped_as": type(model).__name__,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank-{accelerator.process_index}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    # end_training() destroys the process group; free_memory() first lets go of the DDP model
    # that holds it, else gloo threads outlive the group and can abort the process at exit.
    accelerator.wait_for_everyone()
    model, optimizer, dataloader = accelerator.free_memory(model, optimizer, dataloader)
    accelerator.end_training()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
