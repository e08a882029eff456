"""Decoding and augmenting image files: trainbox's CPU plan against PyTorch's defaults.

    .venv/bin/python benchmarks/input_pipeline.py            # 3 repetitions per side
    .venv/bin/python benchmarks/input_pipeline.py --quick    # 1 short repetition (CI)
    .venv/bin/python benchmarks/input_pipeline.py --nproc 8  # 8 ranks contend for the CPUs

The benchmark writes real files first (128x128 JPEG and PNG, 10 classes, in a temp dir), then
trains a linear model on 8x8-pooled pixels (a step that, like a GPU's, costs the CPU little)
from them through trainbox.tasks.images (PIL decode, random 112 crop, flip), `--nproc` ranks
(default 1) under one `torchrun --standalone`. Each rank reads RANK and WORLD_SIZE and loads
its own shard; there is no process group (the model is not DDP): what is measured is the ranks'
input pipelines contending for the CPUs. The file count grows with `--nproc`, so every rank's
epoch is as long as one rank's alone. The sides, run interleaved, differ only in the CPU plan:

* plan: the real path: bootstrap.startup_facts + bootstrap.apply_cpu_plan before torch starts
  (the plan divides the CPUs among the local ranks itself), then affinity.set_torch_threads, and
  train/data/map_style.TrainBatches with the rank's shard, the plan's workers, affinity.worker_init,
  pin_memory on CUDA only, one DataLoader whose workers persist across epochs, and PyTorch's
  prefetch_factor (2 per worker).
* default: DataLoader(batch_size, sampler=DistributedSampler(shuffle=True, seed=0,
  drop_last=True), drop_last=True), set_epoch each epoch, as PyTorch ships it otherwise:
  num_workers=0, no pinning, torch's own thread count (torchrun sets OMP_NUM_THREADS=1 when
  it starts more than one rank).

Reported: steady-state samples/s summed over the ranks (each rank's after `warmup` batches;
epoch ends and the plan's worker starts are counted), their ratio, each rank's threads,
workers and CPUs (the table shows rank 0's, the JSON every rank's), how much of the timed
span all ranks were timing at once (`overlap`: a sum of rates means little where ranks ran
one after another), and the CPU-seconds one sample costs to decode and augment, measured
alone on one thread: the input for the 64-CPU projection in README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import harness

if TYPE_CHECKING:
    from trainbox.affinity import CpuPlan

SIDES = ("plan", "default")
SIDE = 128  # pixels of each generated image
CROP = 112
CLASSES = 10


def make_images(root: Path, count: int, *, side: int = SIDE) -> None:
    """`count` smooth-noise images of `side` pixels, half JPEG, half PNG, spread over CLASSES
    subdirectories."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        coarse = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)
        # Upscaled noise compresses like a photograph, not like white noise.
        image = Image.fromarray(coarse).resize((side, side), Image.Resampling.BICUBIC)
        folder = root / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        if index % 2:
            image.save(folder / f"{index}.png")
        else:
            image.save(folder / f"{index}.jpg", quality=90)


def decode_cost(root: Path, items: int) -> float:
    """CPU-seconds to decode and augment one sample, on one thread in this process."""
    import torch

    from trainbox.tasks import images

    torch.set_num_threads(1)
    dataset = images.data(root=str(root), crop=CROP, val_fraction=0).train
    started = time.process_time()
    for index in range(items):
        dataset[index % len(dataset)]
    return (time.process_time() - started) / items


def worker(args: argparse.Namespace) -> int:
    """One side, one rank under torchrun: pin if the plan says so, then time the loop."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    plan = harness.cpu_plan() if args.worker == "plan" else None
    import torch

    from trainbox.affinity.facts import format_cpulist
    from trainbox.tasks import images

    dataset = images.data(root=args.root, crop=CROP, val_fraction=0).train
    loader, workers = _loader(dataset, plan, batch_size=args.batch_size, rank=rank, world=world)
    ready = functools.partial(_wait_for_ranks, args.out, rank, world)
    started, ended = time_batches(
        loader, batches=args.batches, warmup=args.warmup, pixels=CROP, ready=ready
    )
    cpus = os.sched_getaffinity(0)
    _rank_file(args.out, rank).write_text(
        json.dumps({
            "samples_per_s": (args.batches - args.warmup) * args.batch_size / (ended - started),
            "threads": torch.get_num_threads(),
            "workers": workers,
            "cpus": len(cpus),
            "cpulist": format_cpulist(cpus),
            "started": started,
            "ended": ended,
        })
    )  # fmt: skip
    return 0


def _loader(
    dataset: Any, plan: CpuPlan | None, *, batch_size: int, rank: int, world: int
) -> tuple[Iterator[Any], int]:
    """Endless batches of this rank's shard, and the DataLoader workers behind them."""
    import torch

    from trainbox import affinity
    from trainbox.train.data.map_style import Position, TrainBatches
    from trainbox.train.data.seam import Loading

    if plan is None:
        sampler = torch.utils.data.DistributedSampler[Any](
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size, sampler=sampler, drop_last=True)
        return _epochs(loader, sampler), 0
    affinity.set_torch_threads(plan)
    loading = Loading(batch_size=batch_size, rank=rank, world_size=world, seed=0,
        num_workers=plan.num_workers, pin_memory=torch.cuda.is_available(),
        worker_init=affinity.worker_init(plan))  # fmt: skip
    batches = TrainBatches(dataset, loading)
    return batches.iterate(Position(epoch=0, batch=0)), plan.num_workers


def time_batches(
    loader: Iterator[Any],
    *,
    batches: int,
    warmup: int,
    pixels: int,
    ready: Callable[[], None] = lambda: None,
    marks: list[float] | None = None,
) -> tuple[float, float]:
    """Train on `batches` batches of `pixels`-wide images; wall-clock (time.time) start and end
    of the timed ones.

    `ready` runs before the first timed batch; `marks`, when given, gets the time each batch
    arrived. time.time, not perf_counter: the parent compares the spans of different processes.
    """
    import torch

    torch.manual_seed(0)
    # A step that costs the CPU little, as a GPU's does: the input pipeline is what is measured.
    pooled = pixels // 8
    model = torch.nn.Sequential(
        torch.nn.AvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(3 * pooled**2, CLASSES)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = 0.0
    for index, (inputs, targets) in enumerate(loader):
        if marks is not None:
            marks.append(time.time())
        if index == warmup:
            ready()
            started = time.time()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index + 1 == batches:
            break
    return started, time.time()


def _epochs(loader: Any, sampler: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _wait_for_ranks(out: str, rank: int, world: int, *, limit_s: float = 300) -> None:
    """A barrier through files next to `out`: the ranks start timing together.

    Without it the ranks' start-up (imports, worker starts) staggers them by more than a quick
    run's timed span, and their rates would be summed over spans that barely overlap.
    """
    _rank_file(out, rank).with_suffix(".ready").touch()
    marks = [_rank_file(out, other).with_suffix(".ready") for other in range(world)]
    deadline = time.monotonic() + limit_s
    while not all(mark.exists() for mark in marks):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: not every one of {world} ranks ready in {limit_s} s")
        time.sleep(0.002)


def _rank_file(out: str | Path, rank: int) -> Path:
    """Where rank `rank` writes its result: `out` with the rank before the suffix."""
    path = Path(out)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--batch-size", type=int, default=32)
    parse.add_argument("--nproc", type=int, default=1, help="ranks under one torchrun (1)")
    harness.worker_options(parse, SIDES)
    args = parse.parse_args()
    if args.worker:
        return worker(args)
    if args.nproc < 1:
        parse.error(f"--nproc {args.nproc}: at least 1")
    bench = harness.start("input_pipeline", args, reps=3)
    per_rank, batches, warmup = (128, 12, 3) if args.quick else (640, 80, 10)
    # Every rank's shard as large as one rank's alone: the same epochs per rank at any --nproc.
    count = per_rank * args.nproc
    with harness.workdir("images") as root:
        make_images(root, count)
        cost = decode_cost(root, 64 if args.quick else 320)
        runs = bench.rounds(
            [(s, _side(s, root, args.nproc, batches, warmup, args.batch_size)) for s in SIDES]
        )
    settings = {"reps": bench.reps, "nproc": args.nproc, "files": count, "batches": batches,
                "warmup": warmup, "batch_size": args.batch_size, "side_px": SIDE,
                "crop_px": CROP}  # fmt: skip
    results = _report(runs, settings, cost)
    return bench.finish(results, positive=[*results["samples_per_s"].values(), cost])


def _report(
    runs: dict[str, list[dict[str, Any]]], settings: dict[str, Any], cost: float
) -> dict[str, Any]:
    """Print the table and the ratio; the results for the JSON line."""
    rates = harness.column(runs, "samples_per_s")
    header = ["side", "threads", "workers", "CPUs pinned", "median samples/s", "runs"]
    rows: list[list[Any]] = [[*header, "overlap", "rank CPU lists"]]
    for name, found in runs.items():
        rows.append([
            name, found[0]["threads"], found[0]["workers"], found[0]["cpus"],
            harness.median(rates[name]), harness.spread(rates[name]),
            min(r["overlap"] for r in found), " ".join(r["cpulist"] for r in found[0]["ranks"]),
        ])  # fmt: skip
    nproc = settings["nproc"]
    print(
        f"\n{nproc} rank(s) on {os.cpu_count()} CPUs, {settings['files']} files,"
        f" batch {settings['batch_size']}; samples/s: sum over ranks;"
        " threads, workers, CPUs: rank 0's"
    )
    print(harness.table(rows))
    plan_vs_default = harness.ratio(rates["plan"], rates["default"])
    print(f"\nplan/default samples/s: {plan_vs_default:.3f};"
          f" decode+augment: {cost * 1e3:.2f} ms CPU per sample")  # fmt: skip
    return {
        "settings": settings,
        "runs": runs,
        "samples_per_s": {name: harness.median(v) for name, v in rates.items()},
        "plan_vs_default": plan_vs_default,
        "decode_cpu_s_per_sample": cost,
    }


def _side(
    setting: str, root: Path, nproc: int, batches: int, warmup: int, batch_size: int
) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        with harness.workdir("input") as work:
            out = work / "result.json"
            argv = harness.torchrun(
                nproc, str(Path(__file__).resolve()), f"--worker={setting}", f"--root={root}",
                f"--batches={batches}", f"--warmup={warmup}", f"--batch-size={batch_size}",
                f"--out={out}",
            )  # fmt: skip
            harness.run(argv, harness.clean_env())
            return _combine([json.loads(_rank_file(out, r).read_text()) for r in range(nproc)])

    return run


def _combine(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's ranks as one result: summed samples/s, rank 0's plan, every rank's figures.

    `overlap`: the share of the span from the first rank's timed start to the last rank's end
    in which every rank was timing (1: all at once; near 0: one after another).
    """
    span = max(r["ended"] for r in ranks) - min(r["started"] for r in ranks)
    common = min(r["ended"] for r in ranks) - max(r["started"] for r in ranks)
    keep = ("samples_per_s", "threads", "workers", "cpus", "cpulist")
    return {
        "samples_per_s": sum(r["samples_per_s"] for r in ranks),
        "threads": ranks[0]["threads"],
        "workers": ranks[0]["workers"],
        "cpus": ranks[0]["cpus"],
        "overlap": max(0.0, common) / span,
        "ranks": [{key: r[key] for key in keep} for r in ranks],
    }


if __name__ == "__main__":
    sys.exit(main())
