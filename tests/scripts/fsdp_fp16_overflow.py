"""One fp16 fsdp step in which only rank 0's gradient shard overflows; writes, per rank, whether
the optimizer step was taken and the loss scale after it to OUT_DIR/RANK.json.

Run as `torchrun --nproc-per-node=2 fsdp_fp16_overflow.py OUT_DIR`: the model is sharded by trainbox's own fsdp.wrap and
the scaler made as the trainer makes it (torch.amp.GradScaler on the device type).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainbox.tasks.mlp import mlp
from trainbox.train.parallel import fsdp


def main() -> None:
    dist.init_process_group("gloo")
    rank, device = dist.get_rank(), torch.device("cpu")
    torch.manual_seed(0)
    model = mlp(in_features=2, out_features=3, hidden=8, layers=2)
    fsdp.wrap(model, device, world_size=dist.get_world_size(), amp_dtype=torch.float16,
              units=None)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=True)
    before = [param.full_tensor().clone() for param in model.parameters()]
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(torch.randn(4, 2)).float().square().mean()
    scaler.scale(loss).backward()
    if rank == 0:  # an overflow in this rank's shard alone
        grad = next(model.parameters()).grad
        grad.to_local().view(-1)[0] = float("inf")
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    after = [param.full_tensor() for param in model.parameters()]
    stepped = any(not torch.equal(old, new) for old, new in zip(before, after, strict=True))
    found = {"rank": rank, "stepped": stepped, "scale": scaler.get_scale()}
    # A file each: the ranks' lines on one shared stdout can interleave.
    (Path(sys.argv[1]) / f"{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
