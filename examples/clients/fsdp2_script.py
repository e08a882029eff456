"""An FSDP2 training script as PyTorch's FSDP2 tutorial writes it, on CPU with gloo.

`fully_shard` on each block and then on the root, over a 1-D device mesh; AdamW; a sharded
checkpoint with torch.distributed.checkpoint (DCP). Written for a launcher that sets LOCAL_RANK,
RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT: torchrun, or `trainbox exec` under any launcher.
It never imports trainbox. Every process writes OUT/rank-<rank>.json. The commands are in
README.md beside it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SEED = 1234
STEPS = 24


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class Model(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(out: Path) -> None:
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(SEED)
    model = Model()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    generator = torch.Generator().manual_seed(SEED + rank)
    steps = 0
    while steps < STEPS:
        x = torch.randn(16, 8, generator=generator)
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True).tanh())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1

    # Each rank writes its own shards; every rank joins the save.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=out / "ckpt")

    # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
    mine = torch.tensor(float(rank))
    dist.all_reduce(mine)
    sharded = model.blocks[0].linear.weight
    record = {
        "client": "fsdp2_script",
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": mine.item(),
        "steps": steps,
        # This rank's rows of a 16 x 16 weight: 16 / world when it is truly sharded.
        "local_rows": sharded.to_local().shape[0],
    }
    path = out / f"rank-{rank}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    main(target)
