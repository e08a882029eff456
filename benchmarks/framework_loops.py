"""The same training loop as raw_ddp.py, written with Lightning Fabric, Hugging Face Accelerate
or Lightning's Trainer: what users would otherwise run. trainer_overhead.py's `--frameworks`.

    torchrun --standalone --nproc-per-node 2 benchmarks/framework_loops.py --framework fabric \\
        --steps 1000 --out marks.json

Each uses the library as its docs show for DDP on the CPU (or one GPU per rank): the library
wraps the model and optimizer and runs the backward pass, and nothing else is turned on (no
logger, no checkpoint, no progress bar). All three get raw_ddp.py's sampler and loader, so every
side reads the same samples in the same order. Rank 0 records the time after every
`--log-every`-th step, as raw_ddp.py does.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any

import benchtask
import raw_ddp
import torch
import torch.nn.functional as F
from harness import FIRST_STEP

FRAMEWORKS = ("fabric", "accelerate", "lightning")


def main() -> int:
    framework = _framework_argument()
    args = raw_ddp.options(__doc__, steps=1000, batch_size=64, log_every=50)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = benchtask.model(**json.loads(args.model_args))
    train_set = benchtask.data(**json.loads(args.data_args)).train
    run = {"fabric": with_fabric, "accelerate": with_accelerate, "lightning": with_trainer}
    rank, marks = run[framework](model, train_set, args)
    _release_the_group()
    raw_ddp.write_marks(args.out, rank, marks)
    return 0


def _release_the_group() -> None:
    """Destroy the group once nothing holds it, as docs/your-script.md ("A clean exit") shows.

    The libraries' wrappers are gone with their functions' frames; collecting frees any cycle
    still holding DDP's reducer, so gloo's threads are joined here rather than left to
    interpreter exit, where torch 2.13 can abort the rank (SIGABRT), which failed CI once.
    """
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _framework_argument() -> str:
    """Take `--framework NAME` off argv (the rest is raw_ddp.py's command line)."""
    for index, arg in enumerate(sys.argv):
        if arg.startswith("--framework="):
            name = arg.split("=", 1)[1]
            del sys.argv[index]
            break
        if arg == "--framework" and index + 1 < len(sys.argv):
            name = sys.argv[index + 1]
            del sys.argv[index : index + 2]
            break
    else:
        raise SystemExit(f"--framework is required: one of {', '.join(FRAMEWORKS)}")
    if name not in FRAMEWORKS:
        raise SystemExit(f"--framework {name!r}: one of {', '.join(FRAMEWORKS)}")
    return name


def with_fabric(model: torch.nn.Module, train_set: Any, args: Any) -> tuple[int, list[Any]]:
    """Fabric's documented DDP loop: setup, fabric.backward, the optimizer's step."""
    from lightning.fabric import Fabric

    cuda = torch.cuda.is_available()
    fabric = Fabric(accelerator="cuda" if cuda else "cpu", strategy="ddp", **_layout())
    fabric.launch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model, optimizer = fabric.setup(model, optimizer)
    loader = raw_ddp.batches(train_set, rank=fabric.global_rank, world=fabric.world_size,
                             size=args.batch_size, pin_memory=cuda)  # fmt: skip

    step = _step(model, optimizer, device=fabric.device, backward=fabric.backward)
    marks = _loop(step, loader, args, announce=fabric.global_rank == 0)
    fabric.barrier()
    return fabric.global_rank, marks


def with_accelerate(model: torch.nn.Module, train_set: Any, args: Any) -> tuple[int, list[Any]]:
    """Accelerate's documented loop: prepare the model and optimizer, accelerator.backward.

    The loader is not prepared: Accelerate would shard it its own way, and every side must read
    the same samples.
    """
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index
    cuda = torch.cuda.is_available()
    loader = raw_ddp.batches(train_set, rank=rank, world=accelerator.num_processes,
                             size=args.batch_size, pin_memory=cuda)  # fmt: skip

    step = _step(model, optimizer, device=accelerator.device, backward=accelerator.backward)
    marks = _loop(step, loader, args, announce=rank == 0)
    accelerator.wait_for_everyone()
    # The Accelerator keeps what it prepared; free_memory() lets go of the DDP-wrapped model.
    accelerator.free_memory(model, optimizer)
    return rank, marks


def with_trainer(model: torch.nn.Module, train_set: Any, args: Any) -> tuple[int, list[Any]]:
    """Lightning's Trainer with a LightningModule: fit for `--steps` steps, nothing else on."""
    import lightning as L

    marks: list[tuple[int, float]] = []
    cuda = torch.cuda.is_available()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def training_step(self, batch: Any, _index: int) -> torch.Tensor:
            inputs, targets = batch
            return F.cross_entropy(self.net(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=args.lr, weight_decay=0.0)

        def on_train_batch_end(self, *_: Any) -> None:
            done = self.trainer.global_step
            if done == 1 and self.global_rank == 0:
                print(FIRST_STEP, file=sys.stderr, flush=True)
            if done % args.log_every == 0 or done == args.steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((done, time.time()))

    trainer = L.Trainer(
        accelerator="cuda" if cuda else "cpu", strategy="ddp", max_steps=args.steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, max_epochs=-1, **_layout(),
    )  # fmt: skip
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    loader = raw_ddp.batches(train_set, rank=rank, world=world, size=args.batch_size,
                             pin_memory=cuda)  # fmt: skip
    trainer.fit(Module(), loader)
    return trainer.global_rank, marks


def _step(model: Any, optimizer: Any, *, device: Any, backward: Any) -> Any:
    """One training step the way Fabric and Accelerate write it: their own `backward`."""

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        inputs, targets = inputs.to(device), targets.to(device)
        backward(F.cross_entropy(model(inputs), targets))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _layout() -> dict[str, int]:
    """Lightning's devices and num_nodes, from torchrun's world (it checks they match)."""
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    return {"devices": local, "num_nodes": int(os.environ["WORLD_SIZE"]) // local}


def _loop(step: Any, loader: Any, args: Any, *, announce: bool) -> list[tuple[int, float]]:
    """raw_ddp.py's loop around `step(inputs, targets)`: epochs, the sampler's epoch, marks."""
    cuda = torch.cuda.is_available()
    marks: list[tuple[int, float]] = []
    done = epoch = 0
    while done < args.steps:
        loader.sampler.set_epoch(epoch)
        for inputs, targets in loader:
            step(inputs, targets)
            done += 1
            if done == 1 and announce:
                print(FIRST_STEP, file=sys.stderr, flush=True)
            if done % args.log_every == 0 or done == args.steps:
                if cuda:
                    torch.cuda.synchronize()
                marks.append((done, time.time()))
            if done == args.steps:
                break
        epoch += 1
    return marks


if __name__ == "__main__":
    raise SystemExit(main())
