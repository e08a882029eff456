"""The GPU proof's baseline: a hand-written DDP loop over gputask's models, run under torchrun.

    torchrun --standalone --nproc-per-node 1 acceptance/gpu/raw_gpu.py --task resnet50 --out m.json

What a careful user writes: the same model, samples, DistributedSampler, per-process batch and
AdamW as trainbox's side, bf16 autocast, pinned memory and non-blocking copies, the DataLoader
workers the dataset asks for; nothing else (no scheduler, no metrics, no log lines). Rank 0
records the time after every `--log-every`-th step, after a device synchronisation.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import gputask
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

# The task's model factory, data factory and loss on (model, batch).
TASKS: dict[str, tuple[Any, Any, Any]] = {
    "resnet50": (gputask.resnet50, gputask.images, lambda m, b: F.cross_entropy(m(b[0]), b[1])),
    "gpt2": (gputask.gpt2, gputask.tokens, gputask.lm_step),
}


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--task", choices=sorted(TASKS), required=True)
    parse.add_argument("--steps", type=int, default=200)
    parse.add_argument("--batch-size", type=int, default=64, help="samples per process")
    parse.add_argument("--log-every", type=int, default=50)
    parse.add_argument("--lr", type=float, default=3e-4)
    parse.add_argument("--amp", choices=("bf16", "off"), default="bf16")
    parse.add_argument("--tiny", action="store_true", help="the CPU dry run's small shapes")
    parse.add_argument("--out", help="rank 0 writes its step marks here (JSON)")
    args = parse.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    make_model, make_data, loss_of = TASKS[args.task]
    model = make_model(tiny=args.tiny).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    data = make_data(tiny=args.tiny)
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    workers = data.max_workers or 0
    loader = DataLoader(
        data.train, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        num_workers=workers, pin_memory=cuda, persistent_workers=workers > 0,
    )  # fmt: skip
    dtype = torch.bfloat16 if args.amp == "bf16" else None
    marks = train(ddp, optimizer, loader, sampler, loss_of, device, dtype, args)
    dist.barrier()
    del ddp
    dist.destroy_process_group()
    if rank == 0 and args.out:
        with open(args.out, "w") as handle:
            json.dump({"marks": marks, "workers": workers}, handle)
    return 0


def train(ddp, optimizer, loader, sampler, loss_of, device, dtype, args) -> list[list[float]]:  # type: ignore[no-untyped-def]
    """The loop: `args.steps` optimizer steps; (step, time) after every log_every-th."""
    marks: list[list[float]] = []
    step = epoch = 0
    ddp.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_of(ddp, (inputs, targets))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                marks.append([step, time.time()])
            if step == args.steps:
                break
        epoch += 1
    return marks


if __name__ == "__main__":
    raise SystemExit(main())
