"""Images from tar shards against the same images from folders, and a stream's start-up at
10,000 shards.

    .venv/bin/python benchmarks/stream_pipeline.py            # 3 repetitions per side
    .venv/bin/python benchmarks/stream_pipeline.py --quick    # 1 short repetition (CI)

The benchmark writes real image files (128x128, half JPEG, half PNG, 10 classes; the ones
benchmarks/input_pipeline.py writes) and the same files as tar shards
(`trainbox.tasks.to_shards images`, 100 images per shard). One process per run, the sides run
interleaved, each with trainbox's CPU plan applied before torch starts (its threads, its
DataLoader workers and their pinning), and both decode every image to a float tensor, with no
crop or flip (the shards' default decode does none):

* folders: `trainbox.tasks.images` through `train/data/map_style.TrainBatches`, as the
  trainer reads a map-style dataset (one DataLoader, its workers kept for the whole run).
* shards: `trainbox.tasks.shards` through `train/data/streams.StreamBatches`, as the trainer reads a
  stream (each worker its lane of shards front to back, new workers each epoch), with a
  shuffle buffer of 64 samples.

The step is a linear model on 8x8-pooled pixels, which costs the CPU little (as a GPU step
does), so the input pipeline is what is timed: steady-state samples/s after `warmup` batches,
epoch ends included. Start-up is timed in this process: reading a manifest of 10,000 shards
(that do not exist: planning opens none), planning rank 4,095 of 4,096 with 8 lanes and a
64-sample shuffle window, and locating its first batch, the median of the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
from input_pipeline import SIDE, make_images, time_batches

SIDES = ("shards", "folders")
PER_SHARD = 100
WINDOW = 64
# The start-up case: a large job over many shards.
SHARDS, RANKS, LANES = 10_000, 4096, 8


def worker(args: argparse.Namespace) -> int:
    """One side in one process: the CPU plan, then the timed loop."""
    plan = harness.cpu_plan()
    import torch

    from trainbox import affinity

    affinity.set_torch_threads(plan)
    common = {"batch_size": args.batch_size, "rank": 0, "world_size": 1, "seed": 0,
              "num_workers": plan.num_workers, "pin_memory": False,
              "worker_init": affinity.worker_init(plan)}  # fmt: skip
    loader = _shards(args.root, common) if args.worker == "shards" else _folders(args.root, common)
    started, ended = time_batches(loader, batches=args.batches, warmup=args.warmup, pixels=SIDE)
    Path(args.out).write_text(
        json.dumps({
            "samples_per_s": (args.batches - args.warmup) * args.batch_size / (ended - started),
            "threads": torch.get_num_threads(),
            "workers": plan.num_workers,
        })
    )  # fmt: skip
    return 0


def _shards(root: str, common: dict[str, Any]) -> Iterator[Any]:
    from trainbox.tasks import shards
    from trainbox.train.data.seam import Loading
    from trainbox.train.data.streams import StreamBatches

    stream = shards.data(train=str(Path(root) / "shards" / "train"), shuffle_buffer=WINDOW).train
    return StreamBatches(stream, Loading(**common)).batches_from(0)


def _folders(root: str, common: dict[str, Any]) -> Iterator[Any]:
    from trainbox.tasks import images
    from trainbox.train.data.map_style import Position, TrainBatches
    from trainbox.train.data.seam import Loading

    dataset = images.data(root=str(Path(root) / "images"), val_fraction=0, flip=False).train
    return TrainBatches(dataset, Loading(**common)).iterate(Position(epoch=0, batch=0))


def start_up(work: Path) -> float:
    """Seconds to read a 10,000-shard manifest, plan one rank of 4,096 and find its first
    batch's shards (none of them exists: planning must not open any)."""
    from trainbox.streams import plan
    from trainbox.streams.shards import Shard, read_manifest, write_manifest

    work.mkdir()
    shards = [
        Shard(location=str(work / f"absent-{i:06d}.tar"), samples=100 + i % 37, size=1)
        for i in range(SHARDS)
    ]
    manifest = write_manifest(work, shards)
    started = time.perf_counter()
    counts = read_manifest(manifest, key="bench").counts
    epoch = plan.first_plan(
        seed=1, epoch=0, total=sum(counts), world_size=RANKS, batch_size=32, lanes=LANES,
        window=WINDOW,
    )  # fmt: skip
    order = plan.epoch_order(counts, seed=1, epoch=0)
    located = [order.locate(i) for i in plan.batch_indices(epoch, RANKS - 1, 0)]
    elapsed = time.perf_counter() - started
    if len(located) != 32:
        raise RuntimeError(f"the first batch has {len(located)} samples, not 32")
    return elapsed


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--batch-size", type=int, default=32)
    harness.worker_options(parse, SIDES)
    args = parse.parse_args()
    if args.worker:
        return worker(args)
    bench = harness.start("stream_pipeline", args, reps=3)
    count, batches, warmup = (64, 8, 2) if args.quick else (640, 80, 10)
    with harness.workdir("streams") as root:
        _write_data(root, count)
        startup = [start_up(root / f"manifest-{rep}") for rep in range(bench.reps)]
        runs = bench.rounds([(s, _side(s, root, batches, warmup, args.batch_size)) for s in SIDES])
    settings = {"reps": bench.reps, "files": count, "per_shard": PER_SHARD, "batches": batches,
                "warmup": warmup, "batch_size": args.batch_size, "side_px": SIDE,
                "shuffle_buffer": WINDOW}  # fmt: skip
    results = _report(runs, settings, startup)
    return bench.finish(
        results, positive=[*results["samples_per_s"].values(), results["startup_s"]]
    )


def _write_data(root: Path, count: int) -> None:
    """The image folders, and the same images as shards (the converter, in this process)."""
    from trainbox.tasks import to_shards

    make_images(root / "images", count)
    argv = ["images", str(root / "images"), str(root / "shards"), "--val-fraction", "0",
            f"--per-shard={PER_SHARD}"]  # fmt: skip
    to_shards.convert(to_shards.parser().parse_args(argv))


def _report(
    runs: dict[str, list[dict[str, Any]]], settings: dict[str, Any], startup: list[float]
) -> dict[str, Any]:
    """Print the table, the ratio and the start-up time; the results for the JSON line."""
    rates = harness.column(runs, "samples_per_s")
    rows: list[list[Any]] = [["side", "threads", "workers", "median samples/s", "runs"]]
    for name, found in runs.items():
        rows.append([
            name, found[0]["threads"], found[0]["workers"], harness.median(rates[name]),
            harness.spread(rates[name]),
        ])  # fmt: skip
    print(f"\n1 process on {os.cpu_count()} CPUs, {settings['files']} images, batch"
          f" {settings['batch_size']}, {settings['per_shard']} images per shard")  # fmt: skip
    print(harness.table(rows))
    shards_vs_folders = harness.ratio(rates["shards"], rates["folders"])
    median_startup = harness.median(startup)
    print(f"\nshards/folders samples/s: {shards_vs_folders:.3f}; start-up at {SHARDS:,} shards"
          f" (manifest, plan for rank {RANKS - 1} of {RANKS}, first batch):"
          f" {median_startup:.3f} s")  # fmt: skip
    return {
        "settings": settings,
        "runs": runs,
        "samples_per_s": {name: harness.median(v) for name, v in rates.items()},
        "shards_vs_folders": shards_vs_folders,
        "startup_s": median_startup,
        "startup_runs_s": startup,
    }


def _side(
    setting: str, root: Path, batches: int, warmup: int, batch_size: int
) -> Callable[[], dict[str, Any]]:
    argv = [
        sys.executable, str(Path(__file__).resolve()), f"--worker={setting}", f"--root={root}",
        f"--batches={batches}", f"--warmup={warmup}", f"--batch-size={batch_size}",
    ]  # fmt: skip
    return lambda: harness.result_of(argv, harness.clean_env())


if __name__ == "__main__":
    sys.exit(main())
