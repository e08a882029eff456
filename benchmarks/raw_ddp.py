"""The baseline: a minimal hand-written PyTorch DDP loop, run under torchrun.

    torchrun --standalone --nproc-per-node 2 benchmarks/raw_ddp.py --steps 1000 --out marks.json

Same model and data as trainbox's side (benchtask), the same sampler, per-process batch and
AdamW; nothing else: no scheduler, no loss averaging, no metrics file, no log lines. Rank 0
prints FIRST_STEP to stderr when its first optimizer step is done and records the time after
every `--log-every`-th step (the steps at which trainbox writes a metrics line).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import benchtask
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import FIRST_STEP
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--steps", type=int, default=1000)
    parse.add_argument("--batch-size", type=int, default=64, help="samples per process")
    parse.add_argument("--log-every", type=int, default=50)
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
    ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    train = benchtask.data(**json.loads(args.data_args)).train
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(
        train, batch_size=args.batch_size, sampler=sampler, drop_last=True, pin_memory=cuda
    )
    marks: list[tuple[int, float]] = []
    step = epoch = 0
    ddp.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = F.cross_entropy(ddp(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == 1 and rank == 0:
                print(FIRST_STEP, file=sys.stderr, flush=True)
            if step % args.log_every == 0 or step == args.steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((step, time.time()))
            if step == args.steps:
                break
        epoch += 1
    dist.barrier()
    # Let go of DDP (the optimizer and the last loss reach it too) before the group, so that
    # gloo's thread is joined inside destroy_process_group(): otherwise torch 2.13 may abort at
    # exit with SIGABRT (docs/your-script.md, "A clean exit"), which failed a clean check here.
    del ddp, optimizer, loss
    gc.collect()
    dist.destroy_process_group()
    if rank == 0 and args.out:
        with open(args.out, "w") as handle:
            json.dump({"marks": marks}, handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
