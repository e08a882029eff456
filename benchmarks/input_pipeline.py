"""Decoding and augmenting image files: trainbox's CPU plan against PyTorch's defaults.

    .venv/bin/python benchmarks/input_pipeline.py            # 3 repetitions per side
    .venv/bin/python benchmarks/input_pipeline.py --quick    # 1 short repetition (CI)

The benchmark writes real files first (128x128 JPEG and PNG, 10 classes, in a temp dir), then
trains a linear model on 8x8-pooled pixels (a step that, like a GPU's, costs the CPU little)
from them through trainbox.tasks.images (PIL decode, random 112 crop, flip), one rank under
torchrun. The sides, run interleaved, differ only in the CPU plan:

* plan: the real path: bootstrap.prepare + bootstrap.pin before torch starts, then
  affinity.set_torch_threads, and train/data.TrainBatches with the plan's workers,
  affinity.worker_init, pin_memory on CUDA only, one DataLoader whose workers persist
  across epochs, and PyTorch's prefetch_factor (2 per worker).
* default: DataLoader(shuffle=True, drop_last=True) as PyTorch ships it: num_workers=0,
  no pinning, torch's own thread count.

Reported: steady-state samples/s (after `warmup` batches; epoch ends and the plan's worker
starts are counted), their ratio, and the CPU-seconds one sample costs to decode
and augment, measured alone on one thread: the input for the 64-CPU projection in README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sidebyside as sbs

SIDES = ("plan", "default")
SIDE = 128  # pixels of each generated image
CROP = 112
CLASSES = 10


def make_images(root: Path, count: int) -> None:
    """`count` smooth-noise images, half JPEG, half PNG, spread over CLASSES subdirectories."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        coarse = rng.integers(0, 256, (SIDE // 8, SIDE // 8, 3), dtype=np.uint8)
        # Upscaled noise compresses like a photograph, not like white noise.
        image = Image.fromarray(coarse).resize((SIDE, SIDE), Image.Resampling.BICUBIC)
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


def worker(setting: str, *, root: str, batches: int, warmup: int, batch_size: int, out: str) -> int:
    """One side, one rank under torchrun: pin if the plan says so, then time the loop."""
    plan, run_dir = None, tempfile.mkdtemp(prefix="trainbox-bench-input-")
    if setting == "plan":
        from trainbox import bootstrap, config

        settings = config.load(None, ["preflight.gpus=off", f"run_dir={run_dir}"])
        prepared = bootstrap.prepare(os.environ, settings)
        bootstrap.pin(prepared, os.environ)  # before torch starts its thread pools
        plan = prepared.plan
    import torch

    from trainbox import affinity
    from trainbox.tasks import images
    from trainbox.train.data import Position, TrainBatches

    dataset = images.data(root=root, crop=CROP, val_fraction=0).train
    workers = 0
    if plan is not None:
        affinity.set_torch_threads(plan)
        workers = plan.num_workers
        loader = TrainBatches(
            dataset, batch_size=batch_size, rank=0, world_size=1, seed=0, num_workers=workers,
            pin_memory=torch.cuda.is_available(), worker_init=affinity.worker_init(plan),
        ).iterate(Position(epoch=0, batch=0))  # fmt: skip
    else:
        loader = _epochs(torch.utils.data.DataLoader(dataset, batch_size, True, drop_last=True))
    torch.manual_seed(0)
    # A step that costs the CPU little, as a GPU's does: the input pipeline is what is measured.
    model = torch.nn.Sequential(
        torch.nn.AvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(3 * 14 * 14, CLASSES)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = 0.0
    for index, (inputs, targets) in enumerate(loader):
        if index == warmup:
            started = time.perf_counter()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index + 1 == batches:
            break
    elapsed = time.perf_counter() - started
    Path(out).write_text(
        json.dumps({
            "samples_per_s": (batches - warmup) * batch_size / elapsed,
            "threads": torch.get_num_threads(),
            "workers": workers,
            "cpus": len(os.sched_getaffinity(0)),
        })
    )  # fmt: skip
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def _epochs(loader: Any) -> Any:
    while True:
        yield from loader


def main() -> int:
    parse = sbs.parser(__doc__)
    parse.add_argument("--batch-size", type=int, default=32)
    parse.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parse.add_argument("--root", help=argparse.SUPPRESS)
    parse.add_argument("--batches", type=int, default=0, help=argparse.SUPPRESS)
    parse.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parse.add_argument("--out", help=argparse.SUPPRESS)
    args = parse.parse_args()
    if args.worker:
        return worker(
            args.worker, root=args.root, batches=args.batches, warmup=args.warmup,
            batch_size=args.batch_size, out=args.out,
        )  # fmt: skip
    reps = args.reps or (1 if args.quick else 3)
    count, batches, warmup = (128, 12, 3) if args.quick else (640, 80, 10)
    root = sbs.scratch("images")
    try:
        make_images(root, count)
        cost = decode_cost(root, 64 if args.quick else 320)
        sides = [(s, _side(s, root, batches, warmup, args.batch_size)) for s in SIDES]
        runs = sbs.interleave(reps, sides, quiet=not args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rates = {name: [r["samples_per_s"] for r in found] for name, found in runs.items()}
    rows = [["side", "threads", "workers", "CPUs pinned", "median samples/s", "runs"]]
    for name, found in runs.items():
        rows.append([
            name, found[0]["threads"], found[0]["workers"], found[0]["cpus"],
            sbs.median(rates[name]), " ".join(f"{r:.0f}" for r in rates[name]),
        ])  # fmt: skip
    print(f"\n1 rank on {os.cpu_count()} CPUs, {count} files, batch {args.batch_size}")
    print(sbs.table(rows))
    plan_vs_default = sbs.ratio(rates["plan"], rates["default"])
    print(f"\nplan/default samples/s: {plan_vs_default:.3f};"
          f" decode+augment: {cost * 1e3:.2f} ms CPU per sample")  # fmt: skip
    results = {
        "settings": {"reps": reps, "files": count, "batches": batches, "warmup": warmup,
                     "batch_size": args.batch_size, "side_px": SIDE, "crop_px": CROP},
        "runs": runs,
        "samples_per_s": {name: sbs.median(v) for name, v in rates.items()},
        "plan_vs_default": plan_vs_default,
        "decode_cpu_s_per_sample": cost,
    }  # fmt: skip
    positive = [*results["samples_per_s"].values(), cost]
    return sbs.finish(
        "input_pipeline", results, positive=positive, quick=args.quick, save=args.save
    )


def _side(
    setting: str, root: Path, batches: int, warmup: int, batch_size: int
) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        work = sbs.scratch("input")
        try:
            out = work / "result.json"
            argv = sbs.torchrun(
                1, str(Path(__file__).resolve()), f"--worker={setting}", f"--root={root}",
                f"--batches={batches}", f"--warmup={warmup}", f"--batch-size={batch_size}",
                f"--out={out}",
            )  # fmt: skip
            sbs.run(argv, sbs.clean_env())
            return json.loads(out.read_text())
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return run


if __name__ == "__main__":
    sys.exit(main())
