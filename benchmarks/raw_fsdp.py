"""The FSDP baseline: a minimal FSDP2 loop written as PyTorch's docs show it, run under torchrun.

    torchrun --standalone --nproc-per-node 2 benchmarks/raw_fsdp.py --steps 30 --out marks.json

Same model, data, sampler, per-process batch and AdamW as benchmarks/raw_ddp.py; each Linear is
sharded with `fully_shard`, then the root. Rank 0 records the time after every `--log-every`-th
step, as trainbox's metrics lines do.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import benchtask
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--steps", type=int, default=30)
    parse.add_argument("--batch-size", type=int, default=8, help="samples per process")
    parse.add_argument("--log-every", type=int, default=5)
    parse.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parse.add_argument("--lr", type=float, default=3e-3)
    parse.add_argument("--model-args", default="{}", help="JSON keyword arguments")
    parse.add_argument("--data-args", default="{}", help="JSON keyword arguments")
    parse.add_argument("--out", help="rank 0 writes its step marks here (JSON)")
    args = parse.parse_args()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = benchtask.model(**json.loads(args.model_args)).to(device)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    train = benchtask.data(**json.loads(args.data_args)).train
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    marks: list[tuple[int, float]] = []
    step = epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((step, time.time()))
            if step == args.steps:
                break
        epoch += 1
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and args.out:
        with open(args.out, "w") as handle:
            json.dump({"marks": marks}, handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
