"""Images from tar shards against the same images from folders, what each cost of the stream is
worth, a sweep over the data's and the loader's shape, and a stream's start-up at 10,000 shards.

    .venv/bin/python benchmarks/stream_pipeline.py              # 3 repetitions per side
    .venv/bin/python benchmarks/stream_pipeline.py --quick      # 1 short repetition (CI)
    .venv/bin/python benchmarks/stream_pipeline.py --breakdown  # what each cause is worth
    .venv/bin/python benchmarks/stream_pipeline.py --sweep      # image size, shard size,
                                                                # epochs and workers

The benchmark writes real image files (128x128, half JPEG, half PNG, 10 classes; the ones
benchmarks/input_pipeline.py writes) and the same files as tar shards
(`trainbox.tasks.to_shards images`, 100 images per shard). One process per run, the sides run
interleaved, each with trainbox's CPU plan applied before torch starts (its threads, its
DataLoader workers and their pinning), and both decode every image to a float tensor, with no
crop or flip (the shards' default decode does none):

* folders: `trainbox.tasks.images` through `train/data/map_style.TrainBatches`, as the
  trainer reads a map-style dataset (one DataLoader, its workers kept for the whole run).
* shards: `trainbox.tasks.shards` through `train/data/streams.StreamBatches`, as the trainer reads a
  stream (each worker its lane of shards front to back), with a shuffle buffer of 64 samples.

The step is a linear model on 8x8-pooled pixels, which costs the CPU little (as a GPU step
does), so the input pipeline is what is timed: steady-state samples/s after `warmup` batches,
epoch ends included. Each run also reports its epoch-boundary stall: how much longer the wait
for an epoch's first batch was than the median wait for a batch, on average over the timed
epoch boundaries.

`--breakdown` adds a third side, shards with a shuffle buffer of 1 (no window to fill), and
times in this process, on one thread, per sample: reading its bytes from the shards (tar
headers and members) and from its file, and each side's whole item (read and decode). So it
prices the causes of a gap: DataLoader workers started again at each epoch (the stall with no
window to fill), filling the shuffle window (the stall with one, less that), tar parsing and
decoding (per sample, times the samples of an epoch).

`--sweep` compares the two sides at each setting of SWEEP: one factor at a time away from the
setting above (image side, images per shard, epochs in the timed batches, DataLoader workers),
and a few settings that combine the factors that favour folders.

Start-up is timed in this process: reading a manifest of 10,000 shards (that do not exist:
planning opens none), planning rank 4,095 of 4,096 with 8 lanes and a 64-sample shuffle
window, and locating its first batch, the median of the repetitions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import harness
from input_pipeline import SIDE, make_images, time_batches

SIDES = ("shards", "folders")
PER_SHARD = 100
WINDOW = 64
# Images, batches and untimed batches of a full run: the timed batches span about 4 epochs.
FILES, BATCHES, WARMUP = 640, 80, 10
# The start-up case: a large job over many shards.
SHARDS, RANKS, LANES = 10_000, 4096, 8


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """The data and the loader of one comparison."""

    # Pixels on each side of every image.
    side: int = SIDE
    # Images per tar shard.
    per_shard: int = PER_SHARD
    # Images in the set: with the batches, how many epochs a run spans.
    files: int = FILES
    # DataLoader workers; None: the CPU plan's.
    workers: int | None = None

    def label(self, batches: int, batch_size: int) -> str:
        """How a table names it: "128 px, 100/shard, 4 epochs, plan's workers"."""
        epochs = batches * batch_size / self.files
        workers = "plan's workers" if self.workers is None else f"{self.workers} workers"
        spans = f"{epochs:g} epoch" + ("" if epochs == 1 else "s")
        return f"{self.side} px, {self.per_shard}/shard, {spans}, {workers}"


BASE = Setting()
# One factor at a time away from BASE, then combinations of those that favoured folders.
SWEEP = (
    BASE,
    replace(BASE, side=32),
    replace(BASE, side=256),
    replace(BASE, per_shard=10),
    replace(BASE, per_shard=1000),
    replace(BASE, files=FILES * 4),
    replace(BASE, files=FILES // 4),
    replace(BASE, workers=0),
    replace(BASE, workers=2),
    replace(BASE, side=32, files=FILES // 4),
    replace(BASE, side=32, per_shard=10, workers=2),
)
QUICK_SWEEP = (replace(BASE, files=64), replace(BASE, side=32, files=64, workers=0))


def worker(args: argparse.Namespace) -> int:
    """One side in one process: the CPU plan, then the timed loop."""
    plan = harness.cpu_plan()
    import torch

    from trainbox import affinity

    affinity.set_torch_threads(plan)
    workers = plan.num_workers if args.workers < 0 else args.workers
    common = {"batch_size": args.batch_size, "rank": 0, "world_size": 1, "seed": 0,
              "num_workers": workers, "pin_memory": False,
              "worker_init": affinity.worker_init(plan)}  # fmt: skip
    if args.worker == "shards":
        loader = _shards(args.root, common, window=args.window)
    else:
        loader = _folders(args.root, common)
    marks: list[float] = []
    spent: list[float] = []
    started, ended = time_batches(
        loader, batches=args.batches, warmup=args.warmup, pixels=args.side, marks=marks,
        ready=lambda: spent.append(cpu_seconds()),
    )  # fmt: skip
    spent.append(cpu_seconds())
    samples = (args.batches - args.warmup) * args.batch_size
    Path(args.out).write_text(
        json.dumps({
            "samples_per_s": samples / (ended - started),
            "cpu_us_per_sample": (spent[1] - spent[0]) / samples * 1e6,
            "boundary_stall_s": boundary_stall(marks, warmup=args.warmup,
                                               per_epoch=args.per_epoch),
            "threads": torch.get_num_threads(),
            "workers": workers,
        })
    )  # fmt: skip
    return 0


def cpu_seconds() -> float:
    """CPU seconds of this process and its DataLoader workers so far, the ones still running
    and the ones that ended (when each epoch starts its own)."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    running = multiprocessing.active_children()
    return (harness.cpu_seconds() + ended.ru_utime + ended.ru_stime
            + sum(harness.cpu_seconds(child.pid) for child in running))  # fmt: skip


def boundary_stall(marks: Sequence[float], *, warmup: int, per_epoch: int) -> float | None:
    """How much longer, on average, the timed epochs' first batches took to arrive than the
    median batch; None when no epoch starts in the timed batches."""
    waits = [(index, marks[index] - marks[index - 1]) for index in range(warmup + 1, len(marks))]
    firsts = [wait for index, wait in waits if index % per_epoch == 0]
    others = [wait for index, wait in waits if index % per_epoch != 0]
    if not firsts or not others:
        return None
    return statistics.fmean(firsts) - statistics.median(others)


def _shards(root: str, common: dict[str, Any], *, window: int) -> Iterator[Any]:
    from trainbox.tasks import shards
    from trainbox.train.data.seam import Loading
    from trainbox.train.data.streams import StreamBatches

    stream = shards.data(train=str(Path(root) / "shards" / "train"), shuffle_buffer=window).train
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


def per_sample_costs(root: Path, *, passes: int) -> dict[str, float]:
    """Microseconds per sample on one thread in this process, the median of `passes` passes
    over the whole set: reading its bytes (from the shards front to back, and from its file),
    and each side's whole item (read and decode, as a DataLoader worker makes it)."""
    from trainbox.streams.shards import Cursor
    from trainbox.tasks import images, shards

    harness.torch_setup(1)
    stream = shards.data(train=str(root / "shards" / "train")).train
    files = images.data(root=str(root / "images"), val_fraction=0, flip=False).train

    def tar_read() -> None:
        cursor = Cursor()
        for shard in stream.manifest.shards:
            for member in range(shard.samples):
                cursor.read(shard, member)
        cursor.close()

    def file_read() -> None:
        for path in files.files:
            Path(path).read_bytes()

    def shard_item() -> None:
        for index in range(len(stream)):
            stream[index]

    def folder_item() -> None:
        for index in range(len(files)):
            files[index]

    timed = {"tar_read": tar_read, "file_read": file_read, "shard_item": shard_item,
             "folder_item": folder_item}  # fmt: skip
    costs: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(passes):
        for name, run in timed.items():
            started = time.perf_counter()
            run()
            costs[name].append((time.perf_counter() - started) / len(files) * 1e6)
    return {name: statistics.median(values) for name, values in costs.items()}


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--batch-size", type=int, default=32)
    mode = parse.add_mutually_exclusive_group()
    mode.add_argument("--breakdown", action="store_true", help="price each cost of the stream")
    mode.add_argument("--sweep", action="store_true", help="compare at each setting of SWEEP")
    harness.worker_options(parse, SIDES)
    parse.add_argument("--window", type=int, default=WINDOW, help=argparse.SUPPRESS)
    parse.add_argument("--workers", type=int, default=-1, help=argparse.SUPPRESS)
    parse.add_argument("--side", type=int, default=SIDE, help=argparse.SUPPRESS)
    parse.add_argument("--per-epoch", type=int, default=0, help=argparse.SUPPRESS)
    args = parse.parse_args()
    if args.worker:
        return worker(args)
    if args.sweep:
        return sweep(args)
    if args.breakdown:
        return breakdown(args)
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    """The two sides at BASE, and the start-up at 10,000 shards."""
    bench = harness.start("stream_pipeline", args, reps=3)
    setting, batches, warmup = _scaled(BASE, quick=args.quick)
    with harness.workdir("streams") as root:
        _write_data(root, setting)
        startup = [start_up(root / f"manifest-{rep}") for rep in range(bench.reps)]
        runs = bench.rounds([
            (s, _side(s, root, setting, batches, warmup, args.batch_size)) for s in SIDES
        ])  # fmt: skip
    settings = _settings(bench, setting, batches, warmup, args.batch_size)
    results = _report(runs, settings, startup)
    bench.judge("shards/folders samples/s", results["shards_vs_folders"], at_least=1.0)
    return bench.finish(
        results, positive=[*results["samples_per_s"].values(), results["startup_s"]]
    )


def breakdown(args: argparse.Namespace) -> int:
    """What each cause of a gap between the sides is worth, at BASE."""
    bench = harness.start("stream_pipeline", args, reps=5, quick_reps=1)
    setting, batches, warmup = _scaled(BASE, quick=args.quick)
    sides = {"shards": ("shards", WINDOW), "shards, window 1": ("shards", 1),
             "folders": ("folders", WINDOW)}  # fmt: skip
    with harness.workdir("streams") as root:
        _write_data(root, setting)
        costs = per_sample_costs(root, passes=bench.reps)
        runs = bench.rounds([
            (name, _side(side, root, setting, batches, warmup, args.batch_size, window=window))
            for name, (side, window) in sides.items()
        ])  # fmt: skip
    rates = harness.column(runs, "samples_per_s")
    stalls = harness.column(runs, "boundary_stall_s")
    cpu = harness.column(runs, "cpu_us_per_sample")
    rows: list[list[Any]] = [["side", "median samples/s", "runs", "stall per epoch start, s",
                              "CPU µs/sample"]]  # fmt: skip
    for name in sides:
        rows.append([name, harness.median(rates[name]), harness.spread(rates[name]),
                     _shown(_median_or_none(stalls[name])),
                     f"{harness.median(cpu[name]):.0f}"])  # fmt: skip
    print(f"\n{setting.label(batches, args.batch_size)}, batch {args.batch_size}")
    print(harness.table(rows))
    worth = _worth(costs, rates, stalls, files=setting.files)
    print("\nper sample, one thread in this process (µs): "
          + ", ".join(f"{name} {value:.0f}" for name, value in costs.items()))  # fmt: skip
    print(harness.table([["cause", "seconds per epoch", "share of the shards' epoch"]]
                        + [[name, f"{s:+.3f}", f"{share:+.1%}"]
                           for name, (s, share) in worth.items()]))  # fmt: skip
    results = {
        "mode": "breakdown",
        "settings": _settings(bench, setting, batches, warmup, args.batch_size),
        "runs": runs,
        "samples_per_s": {name: harness.median(v) for name, v in rates.items()},
        "per_sample_us": costs,
        "worth_s_per_epoch": {name: s for name, (s, _) in worth.items()},
    }
    return bench.finish(results, positive=[*results["samples_per_s"].values(), *costs.values()])


def _worth(
    costs: dict[str, float],
    rates: dict[str, list[float]],
    stalls: dict[str, list[float | None]],
    *,
    files: int,
) -> dict[str, tuple[float, float]]:
    """Each cause in seconds per epoch, and as a share of the shards side's epoch: what an
    epoch start costs with no window to fill (new workers, where each epoch has its own), the
    window fill (at the epoch start: the stall with a window, less that; over the epoch: the
    epoch with a window, less the epoch without), and tar parsing and decoding against the
    folders' file reads and decodes."""
    epoch = {name: files / harness.median(found) for name, found in rates.items()}
    start = _stall(stalls["shards, window 1"])
    decode = ((costs["shard_item"] - costs["tar_read"])
              - (costs["folder_item"] - costs["file_read"])) * files / 1e6  # fmt: skip
    found = {
        "stall at an epoch start, window 1": start,
        "stall at an epoch start, window 64 less window 1":
            _stall(stalls["shards"]) - start,
        "epoch time, window 64 less window 1":
            epoch["shards"] - epoch["shards, window 1"],
        "tar parsing, less reading files": (costs["tar_read"] - costs["file_read"]) * files / 1e6,
        "decoding, less the folders' decode": decode,
        "the folders' stall at an epoch start": _stall(stalls["folders"]),
        "the shards' epoch less the folders' (measured)": epoch["shards"] - epoch["folders"],
    }  # fmt: skip
    return {name: (seconds, seconds / epoch["shards"]) for name, seconds in found.items()}


def _stall(values: Sequence[float | None]) -> float:
    """The median stall of runs that timed an epoch start (every breakdown run does)."""
    found = [value for value in values if value is not None]
    if not found:
        raise RuntimeError("no run timed an epoch start")
    return harness.median(found)


def _median_or_none(values: Sequence[float | None]) -> float | None:
    found = [value for value in values if value is not None]
    return harness.median(found) if found else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def sweep(args: argparse.Namespace) -> int:
    """The two sides at each setting: shards/folders, and the settings below 1.0."""
    # Five a side: single runs here vary by 5-10 %, which three medians do not always hide.
    bench = harness.start("stream_pipeline", args, reps=5)
    rows: list[list[Any]] = [["setting", "shards", "folders", "shards/folders",
                              "90 % interval", "runs shards",
                              "runs folders", "stalls s (shards, folders)",
                              "CPU µs/sample (shards, folders)"]]  # fmt: skip
    found = []
    for setting in QUICK_SWEEP if args.quick else SWEEP:
        scaled, batches, warmup = _scaled(setting, quick=args.quick)
        label = scaled.label(batches, args.batch_size)
        print(f"setting: {label}", file=sys.stderr, flush=True)
        with harness.workdir("streams") as root:
            _write_data(root, scaled)
            runs = bench.rounds([
                (f"{label}: {s}", _side(s, root, scaled, batches, warmup, args.batch_size))
                for s in SIDES
            ])  # fmt: skip
        rates = {side: [r["samples_per_s"] for r in runs[f"{label}: {side}"]] for side in SIDES}
        stalls = {side: _median_or_none([r["boundary_stall_s"] for r in runs[f"{label}: {side}"]])
                  for side in SIDES}  # fmt: skip
        cpu = {side: harness.median(r["cpu_us_per_sample"] for r in runs[f"{label}: {side}"])
               for side in SIDES}  # fmt: skip
        ratio = harness.ratio(rates["shards"], rates["folders"])
        interval = harness.ratio_interval(rates["shards"], rates["folders"])
        found.append({"setting": label, "ratio": ratio, "interval": list(interval),
                      "samples_per_s": rates, "boundary_stall_s": stalls,
                      "cpu_us_per_sample": cpu})  # fmt: skip
        rows.append([label, harness.median(rates["shards"]), harness.median(rates["folders"]),
                     f"{ratio:.3f}", f"{interval[0]:.3f}-{interval[1]:.3f}",
                     harness.spread(rates["shards"]),
                     harness.spread(rates["folders"]),
                     f"{_shown(stalls['shards'])}, {_shown(stalls['folders'])}",
                     f"{cpu['shards']:.0f}, {cpu['folders']:.0f}"])  # fmt: skip
    print(f"\nbatch {args.batch_size}, medians of {bench.reps} runs a side (samples/s)")
    print(harness.table(rows))
    lowest = min(found, key=lambda row: row["ratio"])
    bench.judge(f"lowest shards/folders ({lowest['setting']})", lowest["ratio"], at_least=1.0)
    # Single runs here vary by 10-20 %: a median below 1.0 whose interval holds 1.0 is that
    # noise; one whose whole interval is below 1.0 is a setting where shards are slower.
    below = [row["setting"] for row in found if row["interval"][1] < 1.0]
    print(f"settings whose whole 90 % interval is below 1.0: {'; '.join(below) or 'none'}:"
          f" {bench.verdict(not below)}")  # fmt: skip
    results = {"mode": "sweep", "reps": bench.reps, "batch_size": args.batch_size,
               "sweep": found}  # fmt: skip
    return bench.finish(results, positive=[row["ratio"] for row in found])


def _scaled(setting: Setting, *, quick: bool) -> tuple[Setting, int, int]:
    """The setting, batches and untimed batches of a run: a quick run's are a tenth."""
    if not quick:
        return setting, BATCHES, WARMUP
    return replace(setting, files=min(setting.files, 64)), 8, 2


def _settings(
    bench: harness.Bench, setting: Setting, batches: int, warmup: int, batch_size: int
) -> dict[str, Any]:
    return {"reps": bench.reps, "files": setting.files, "per_shard": setting.per_shard,
            "batches": batches, "warmup": warmup, "batch_size": batch_size,
            "side_px": setting.side, "shuffle_buffer": WINDOW,
            "workers": setting.workers}  # fmt: skip


def _write_data(root: Path, setting: Setting) -> None:
    """The image folders, and the same images as shards (the converter, in this process)."""
    from trainbox.tasks import to_shards

    make_images(root / "images", setting.files, side=setting.side)
    argv = ["images", str(root / "images"), str(root / "shards"), "--val-fraction", "0",
            f"--per-shard={setting.per_shard}"]  # fmt: skip
    to_shards.convert(to_shards.parser().parse_args(argv))


def _report(
    runs: dict[str, list[dict[str, Any]]], settings: dict[str, Any], startup: list[float]
) -> dict[str, Any]:
    """Print the table, the ratio and the start-up time; the results for the JSON line."""
    rates = harness.column(runs, "samples_per_s")
    cpu = harness.column(runs, "cpu_us_per_sample")
    rows: list[list[Any]] = [["side", "threads", "workers", "median samples/s", "runs",
                              "CPU µs/sample (all processes)"]]  # fmt: skip
    for name, found in runs.items():
        rows.append([
            name, found[0]["threads"], found[0]["workers"], harness.median(rates[name]),
            harness.spread(rates[name]), f"{harness.median(cpu[name]):.0f}",
        ])  # fmt: skip
    print(f"\n1 process on {os.cpu_count()} CPUs, {settings['files']} images, batch"
          f" {settings['batch_size']}, {settings['per_shard']} images per shard")  # fmt: skip
    print(harness.table(rows))
    shards_vs_folders = harness.ratio(rates["shards"], rates["folders"])
    low, high = harness.ratio_interval(rates["shards"], rates["folders"])
    median_startup = harness.median(startup)
    print(f"\nshards/folders samples/s: {shards_vs_folders:.3f} (90 % interval {low:.3f}-"
          f"{high:.3f}); start-up at {SHARDS:,} shards (manifest, plan for rank {RANKS - 1} of"
          f" {RANKS}, first batch): {median_startup:.3f} s")  # fmt: skip
    return {
        "settings": settings,
        "runs": runs,
        "samples_per_s": {name: harness.median(v) for name, v in rates.items()},
        "shards_vs_folders": shards_vs_folders,
        "shards_vs_folders_interval": [low, high],
        "startup_s": median_startup,
        "startup_runs_s": startup,
    }


def _side(
    side: str,
    root: Path,
    setting: Setting,
    batches: int,
    warmup: int,
    batch_size: int,
    *,
    window: int = WINDOW,
) -> Callable[[], dict[str, Any]]:
    workers = -1 if setting.workers is None else setting.workers
    argv = [
        sys.executable, str(Path(__file__).resolve()), f"--worker={side}", f"--root={root}",
        f"--batches={batches}", f"--warmup={warmup}", f"--batch-size={batch_size}",
        f"--window={window}", f"--workers={workers}", f"--side={setting.side}",
        f"--per-epoch={setting.files // batch_size}",
    ]  # fmt: skip
    return lambda: harness.result_of(argv, harness.clean_env())


if __name__ == "__main__":
    sys.exit(main())
