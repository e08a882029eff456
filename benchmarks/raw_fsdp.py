"""The FSDP baseline: a minimal FSDP2 loop written as PyTorch's docs show it, run under torchrun.

    torchrun --standalone --nproc-per-node 2 benchmarks/raw_fsdp.py --steps 30 --out marks.json

Same model, data, sampler, per-process batch, AdamW and loop as benchmarks/raw_ddp.py; each
Linear is sharded with `fully_shard`, then the root. Rank 0 records the time after every
`--log-every`-th step, as trainbox's metrics lines do.
"""

from __future__ import annotations

import json

import benchtask
import raw_ddp
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> int:
    args = raw_ddp.options(__doc__, steps=30, batch_size=8, log_every=5)
    rank, world, device = raw_ddp.join(args.threads)
    model = benchtask.model(**json.loads(args.model_args)).to(device)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    train_set = benchtask.data(**json.loads(args.data_args)).train
    loader = raw_ddp.batches(train_set, rank=rank, world=world, size=args.batch_size)
    marks = raw_ddp.train(model, optimizer, loader, steps=args.steps, log_every=args.log_every,
                          device=device)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    raw_ddp.write_marks(args.out, rank, marks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
