"""A plain PyTorch DDP training script, as a user would write it: it knows nothing of trainbox.

It joins the process group with `init_method="env://"`, reads LOCAL_RANK, and trains a small
model on synthetic data; rank 0 writes a JSON result to OUT. Put it behind `trainbox exec`, which
gives it RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT under any launcher:

    torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/own_script.py OUT
    srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/own_script.py OUT
    mpirun -np 2 trainbox exec -- python examples/own_script.py OUT
    mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox exec -- python examples/own_script.py OUT

In a PyTorchJob or TrainJob pod, the container command is the same
`trainbox exec -- python examples/own_script.py OUT`.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STEPS = 30
BATCH_PER_RANK = 32
SEED = 1234


def make_data() -> TensorDataset:
    """A fixed synthetic regression set; every rank builds the same one from the seed."""
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(4096, 16, generator=generator)
    weights = torch.randn(16, 1, generator=generator)
    targets = torch.tanh(inputs @ weights) + 0.1 * torch.randn(4096, 1, generator=generator)
    return TensorDataset(inputs, targets)


def params_sha256(model: nn.Module) -> str:
    """SHA-256 over every parameter, in name order: equal models give equal checksums."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(out: Path) -> None:
    """Train STEPS steps with DDP; rank 0 writes world size, final loss and checksum to `out`."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # The same seed on every rank gives every replica the same initial weights.
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    data = make_data()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=SEED)
    loader = DataLoader(data, batch_size=BATCH_PER_RANK, sampler=sampler, drop_last=True)
    step, epoch, loss = 0, 0, torch.zeros((), device=device)
    while step < STEPS:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(inputs.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            step += 1
            if step == STEPS:
                break
        epoch += 1

    # The last step's loss, averaged over the ranks.
    final_loss = loss.detach().clone()
    dist.all_reduce(final_loss)
    if rank == 0:
        result = {
            "world_size": world_size,
            "steps": step,
            "final_loss": final_loss.item() / world_size,
            "params_sha256": params_sha256(model),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result) + "\n", encoding="utf-8")
    # Leave together: a rank that tears down while a peer still talks to it can abort the peer.
    dist.barrier()
    # DDP's reducer keeps the process group, and so gloo's worker threads, alive past
    # destroy_process_group(). A worker still releasing the last collective's tensors while
    # Python shuts down then aborts the rank ("terminate called without an active exception").
    del ddp, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.json")
    main(Path(sys.argv[1]))
