"""A LightningModule trained by Lightning's Trainer with the DDP strategy, on CPU.

Lightning finds its cluster itself: under torchrun (and trainbox's node mode) it reads
torchrun's variables, under srun Slurm's, and otherwise it starts the other processes of
`devices` on this machine itself unless LOCAL_RANK says a launcher did. `devices` and `num_nodes`
come from CLIENT_DEVICES and CLIENT_NODES (default 1): Lightning checks their product against
the world a launcher started. It never imports trainbox. Every process writes
OUT/rank-<global_rank>.json. The commands are in README.md beside it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 1234
STEPS = 24


class Regressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.rank_sum = float("nan")

    def training_step(self, batch, batch_idx):  # noqa: ARG002 (Lightning's hook signature)
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_end(self) -> None:
        # One process group: the sum of every rank's number is 0 + 1 + ... + (world - 1).
        mine = torch.tensor(float(self.global_rank))
        self.rank_sum = self.trainer.strategy.reduce(mine, reduce_op="sum").item()


def main(out: Path) -> None:
    seed_everything(SEED)
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(1024, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    # Lightning adds the DistributedSampler itself.
    train_loader = DataLoader(dataset, batch_size=16)

    model = Regressor()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("CLIENT_DEVICES", 1)),
        num_nodes=int(os.environ.get("CLIENT_NODES", 1)),
        strategy="ddp",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_loader)

    record = {
        "client": "lightning_trainer",
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank_sum": model.rank_sum,
        "steps": trainer.global_step,
        "cluster_environment": type(trainer.strategy.cluster_environment).__name__,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank-{trainer.global_rank}.json"
    # "x": if two processes claim one rank (two worlds in one folder), the second one fails.
    with path.open("x", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    # The Trainer unwraps DDP when fit ends but keeps the process group; destroy it while Python
    # is still whole: gloo threads left to interpreter exit can abort the process.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
