"""Data loading with trainbox's pinning plan, against PyTorch's defaults and an oversubscribed one.

    .venv/bin/python benchmarks/data_pinning.py            # 3 repetitions per setting
    .venv/bin/python benchmarks/data_pinning.py --quick    # 1 short repetition (CI)

Every setting trains the same thing under torchrun: a DataLoader over a dataset whose samples
cost CPU (each is made from a seeded random 3x96x96 image: crop, flip, a 5x5 blur, normalise,
pool), feeding a DDP MLP on CPU (gloo). The settings differ only in threads, workers and
affinity:

* plan: trainbox's plan, through the real code path (bootstrap.startup_facts and
  bootstrap.apply_cpu_plan before torch is imported, then affinity.set_torch_threads and
  affinity.worker_init).
* default: what PyTorch does untouched: no pinning, num_workers=0, torch's own thread count
  (torchrun sets OMP_NUM_THREADS=1 when it starts more than one process).
* oversubscribed: no pinning, num_workers = os.cpu_count() per rank.

Two layouts: as many ranks as fit (`--nproc`, default 2), where every CPU already has a rank;
and one rank, which has CPUs to spare for workers (`--quick` runs this one only). Reported:
steady-state samples/s of rank 0 (after `warmup` batches, so worker start-up is not counted).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness

SETTINGS = ("plan", "default", "oversubscribed")


class CpuBoundImages:
    """Samples that cost CPU to make: decode-like generation plus a few augmentations."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        import torch
        import torch.nn.functional as F

        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, 96, 96, generator=generator)
        top, left = index % 32, (index // 32) % 32
        crop = image[:, top : top + 64, left : left + 64]
        if index % 2:
            crop = crop.flip(-1)
        kernel = torch.full((3, 1, 5, 5), 1 / 25)
        blurred = F.conv2d(crop.unsqueeze(0), kernel, padding=2, groups=3)
        normed = (blurred - blurred.mean()) / (blurred.std() + 1e-6)
        return F.avg_pool2d(normed, 2).flatten(), index % 10


def worker(args: argparse.Namespace) -> int:
    """One rank of one setting (under torchrun): pin if the plan says so, then time the loop."""
    plan = harness.cpu_plan() if args.worker == "plan" else None
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from trainbox import affinity

    workers, worker_init = 0, None
    if plan is not None:
        affinity.set_torch_threads(plan)
        workers = plan.num_workers
        worker_init = affinity.worker_init(plan) if workers else None
    elif args.worker == "oversubscribed":
        workers = os.cpu_count() or 1
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = CpuBoundImages(args.batch_size * (args.batches + 1) * world)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0),
        num_workers=workers,
        worker_init_fn=worker_init,
        drop_last=True,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3 * 32 * 32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = 0.0
    for index, (inputs, targets) in enumerate(loader):
        if index == args.warmup:
            started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index + 1 == args.batches:
            break
    elapsed = time.perf_counter() - started
    dist.barrier()
    if rank == 0:
        Path(args.out).write_text(
            json.dumps({
                "samples_per_s": (args.batches - args.warmup) * args.batch_size * world / elapsed,
                "threads": torch.get_num_threads(),
                "workers": workers,
                "cpus": len(os.sched_getaffinity(0)),
            })
        )  # fmt: skip
    # DDP, and what reaches it, goes before the group: torch 2.13 may otherwise abort at exit
    # (docs/your-script.md, "A clean exit").
    del ddp, optimizer, loss
    gc.collect()
    dist.destroy_process_group()
    return 0


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--nproc", type=int, default=2, help="ranks of the first layout")
    parse.add_argument("--batch-size", type=int, default=32)
    harness.worker_options(parse, SETTINGS)
    args = parse.parse_args()
    if args.worker:
        return worker(args)
    bench = harness.start("data_pinning", args, reps=3)
    batches, warmup = (10, 3) if args.quick else (80, 10)
    # Quick: the one-rank layout only, where the plan starts a worker (worker_init runs).
    layouts = [1] if args.quick else list(dict.fromkeys((args.nproc, 1)))
    results: dict[str, Any] = {}
    lines = []
    for nproc in layouts:
        runs = bench.rounds(
            [(setting, _side(setting, nproc, batches, warmup, args.batch_size))
             for setting in SETTINGS]
        )  # fmt: skip
        rates = harness.column(runs, "samples_per_s")
        key = f"{nproc}_ranks"
        results[key] = {
            "runs": runs,
            "background_cpus": dict(harness.BACKGROUND),
            "samples_per_s": {name: harness.median(v) for name, v in rates.items()},
            "plan_vs_default": harness.ratio(rates["plan"], rates["default"]),
            "plan_vs_oversubscribed": harness.ratio(rates["plan"], rates["oversubscribed"]),
        }
        rows = [["setting", "threads", "workers", "CPUs pinned", "median samples/s", "runs"]]
        for name, found in runs.items():
            rows.append([
                name, found[0]["threads"], found[0]["workers"], found[0]["cpus"],
                harness.median(rates[name]), harness.spread(rates[name]),
            ])  # fmt: skip
        print(f"\n{nproc} rank{'s' if nproc > 1 else ''} on {os.cpu_count()} CPUs")
        print(harness.table(rows))
        harness.BACKGROUND.clear()
        lines.append(
            f"{nproc} rank(s): plan/default {results[key]['plan_vs_default']:.3f},"
            f" plan/oversubscribed {results[key]['plan_vs_oversubscribed']:.3f}"
        )
    print("\nthroughput ratios: " + "; ".join(lines))
    positive = [v for layout in results.values() for v in layout["samples_per_s"].values()]
    settings = {"reps": bench.reps, "batches": batches, "warmup": warmup,
                "batch_size": args.batch_size}  # fmt: skip
    return bench.finish({"settings": settings, **results}, positive=positive)


def _side(
    setting: str, nproc: int, batches: int, warmup: int, batch_size: int
) -> Callable[[], dict[str, Any]]:
    argv = harness.torchrun(
        nproc, str(Path(__file__).resolve()), f"--worker={setting}", f"--batches={batches}",
        f"--warmup={warmup}", f"--batch-size={batch_size}",
    )  # fmt: skip
    return lambda: harness.result_of(argv, harness.clean_env())


if __name__ == "__main__":
    sys.exit(main())
