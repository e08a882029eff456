"""The baseline: a minimal hand-written PyTorch DDP loop, run under torchrun.

    torchrun --standalone --nproc-per-node 2 benchmarks/raw_ddp.py --steps 1000 --out marks.json

Same model and data as trainbox's side (benchtask), the same sampler, per-process batch and
AdamW; nothing else: no scheduler, no loss averaging, no metrics file, no log lines. Rank 0
prints FIRST_STEP to stderr when its first optimizer step is done and records the time after
every `--log-every`-th step (the steps at which trainbox writes a metrics line). raw_fsdp.py and
step_overhead.py's empty side train with this file's loop.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import benchtask
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import FIRST_STEP
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def main() -> int:
    args = options(__doc__, steps=1000, batch_size=64, log_every=50)
    rank, world, device = join(args.threads)
    cuda = device.type == "cuda"
    model = benchtask.model(**json.loads(args.model_args)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    train_set = benchtask.data(**json.loads(args.data_args)).train
    loader = batches(train_set, rank=rank, world=world, size=args.batch_size, pin_memory=cuda)
    ddp.train()
    marks = train(ddp, optimizer, loader, steps=args.steps, log_every=args.log_every,
                  device=device, announce=rank == 0)  # fmt: skip
    dist.barrier()
    # Let go of DDP (the optimizer reaches it too; the last loss went with train()) before the
    # group, so that gloo's thread is joined inside destroy_process_group(): otherwise torch
    # 2.13 may abort at exit with SIGABRT (docs/your-script.md, "A clean exit"), which failed a
    # clean check here.
    del ddp, optimizer
    gc.collect()
    dist.destroy_process_group()
    write_marks(args.out, rank, marks)
    return 0


def options(doc: str | None, *, steps: int, batch_size: int, log_every: int) -> argparse.Namespace:
    """A raw loop's command line, with its defaults."""
    parse = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parse.add_argument("--steps", type=int, default=steps)
    parse.add_argument("--batch-size", type=int, default=batch_size, help="samples per process")
    parse.add_argument("--log-every", type=int, default=log_every)
    parse.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parse.add_argument("--lr", type=float, default=3e-3)
    parse.add_argument("--model-args", default="{}", help="JSON keyword arguments")
    parse.add_argument("--data-args", default="{}", help="JSON keyword arguments")
    parse.add_argument("--out", help="rank 0 writes its step marks here (JSON)")
    return parse.parse_args()


def join(threads: int) -> tuple[int, int, torch.device]:
    """Join torchrun's process group (nccl on GPUs, else gloo), seeded: (rank, world, device)."""
    torch.set_num_threads(threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    return rank, world, device


def batches(
    dataset: Dataset[Any], *, rank: int, world: int, size: int, pin_memory: bool = False
) -> DataLoader[Any]:
    """This rank's shuffled batches of `size`, through a DistributedSampler."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    return DataLoader(
        dataset, batch_size=size, sampler=sampler, drop_last=True, pin_memory=pin_memory
    )


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader[Any],
    *,
    steps: int,
    log_every: int,
    device: torch.device,
    announce: bool = False,
) -> list[tuple[int, float]]:
    """`steps` optimizer steps, epoch after epoch: the (step, time) after every `log_every`-th
    and the last. With `announce`, FIRST_STEP goes to stderr after the first."""
    sampler: DistributedSampler[Any] = loader.sampler  # type: ignore[assignment]
    cuda = device.type == "cuda"
    marks: list[tuple[int, float]] = []
    step = epoch = 0
    while step < steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == 1 and announce:
                print(FIRST_STEP, file=sys.stderr, flush=True)
            if step % log_every == 0 or step == steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((step, time.time()))
            if step == steps:
                break
        epoch += 1
    return marks


def write_marks(out: str | None, rank: int, marks: list[tuple[int, float]]) -> None:
    """Rank 0's marks to `out` as {"marks": [[step, time], ...]}, if asked."""
    if rank == 0 and out:
        with open(out, "w") as handle:
            json.dump({"marks": marks}, handle)


if __name__ == "__main__":
    raise SystemExit(main())
