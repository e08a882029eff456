"""The built-in image-folder and CSV examples trained from shards against from their files: the
same validation metric, within a tolerance measured from the folder runs' own seed spread.

    .venv/bin/python benchmarks/stream_parity.py            # 10 seeds a side for csv, 40 for images
    .venv/bin/python benchmarks/stream_parity.py --quick    # 1 seed, a few steps (CI)

Two examples, each written once as files and once as tar shards by the converter
(`trainbox.tasks.to_shards`, in this process):

* csv: examples/tabular's data (make_csv.py, 3,000 train and 1,000 val rows) and config
  (an MLP, 300 steps of 64, AdamW 3e-3), from the CSV files (`trainbox.tasks.tabular:data`,
  `--config examples/tabular/config.yaml`) and from 250-row shards (`trainbox.tasks.shards:data`
  with the same model, optimizer and steps, the command docs/streamed-data.md gives).
* images: a folder of 16x16 PNGs in four classes (a grating's orientation under heavy noise;
  1,200 train and 400 val images in train/ and val/ trees), the built-in CNN
  (`trainbox.tasks.images:model`), 300 steps of 32, from the folder
  (`trainbox.tasks.images:data`, no flip: the shards' decode does none) and from 100-image
  shards. After 300 steps most seeds are near 1.0 but some have only begun to leave the first
  plateau, so its accuracy spreads widely over seeds and needs 40 a side.

Each run is `trainbox run` in one process, decoding in the main process
(`pinning.num_workers=0`: the metric does not depend on the worker count, which
tests/dist/test_image_folder.py and test_streams.py check, and workers would only add start-up
time); the shards side reads with a 256-sample shuffle buffer. A sampler and a stream give the
samples in different orders, so the runs are not bit-equal; each seed (`seed=`: the model's
initialisation and the order) runs on both sides, the sides interleaved. The verdict compares
the mean `val_accuracy` of the two sides, within STANDARD_ERRORS standard errors.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import numpy as np

SIDES = ("files", "shards")
TASKS = ("csv", "images")
# The tolerance on |mean over seeds, shards - files| of val_accuracy, in standard errors of that
# difference (each side's spread over seeds / sqrt(seeds), combined): a change of seed alone
# moves a run's accuracy by that spread (benchmarks/README.md), so only a difference beyond
# about two standard errors says the data source, not the seeds, made it.
STANDARD_ERRORS = 2.0
CLASSES, SIDE = 4, 16
# Steps of a full run: examples/tabular's own, and the image example's (at 600 steps nearly every
# run of either side reaches 1.0, where the two can no longer be told apart).
STEPS = {"csv": 300, "images": 300}
# Seeds a side in a full run. The image runs leave their first plateau at very different steps
# (sd 0.10-0.15 over seeds at 300 steps), so ten a side put a true difference of 0 anywhere
# within about 0.13; forty bring the tolerance to about 0.06.
SEEDS = {"csv": 10, "images": 40}


def make_images(root: Path, per_class: dict[str, int]) -> None:
    """Noisy gratings at one of four orientations, PNG, in ROOT/train/CLASS and ROOT/val/CLASS."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    for split, count in per_class.items():
        for label in range(CLASSES):
            folder = root / split / f"angle{label}"
            folder.mkdir(parents=True)
            angle = np.pi * label / CLASSES
            for index in range(count):
                phase = rng.uniform(0, 2 * np.pi)
                wave = np.sin(0.9 * (x * np.cos(angle) + y * np.sin(angle)) + phase)
                pixels = 128 + 40 * wave[..., None] + rng.normal(0, 60, (SIDE, SIDE, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
                image.save(folder / f"{index}.png")


def make_data(root: Path, *, quick: bool) -> None:
    """Both examples' files, and the same data as shards."""
    from trainbox.tasks import to_shards

    rows = ["--train-rows", "300", "--val-rows", "101"] if quick else []
    harness.run([sys.executable, str(harness.ROOT / "examples" / "tabular" / "make_csv.py"),
             str(root / "csv"), *rows], harness.clean_env())  # fmt: skip
    make_images(root / "images", {"train": 40, "val": 25} if quick else {"train": 300, "val": 100})
    for argv in (
        ["csv", str(root / "csv" / "train.csv"), str(root / "csv-shards"), "--val-csv",
         str(root / "csv" / "val.csv"), "--target", "label", "--per-shard", "250"],
        ["images", str(root / "images"), str(root / "images-shards"), "--per-shard", "100"],
    ):  # fmt: skip
        to_shards.convert(to_shards.parser().parse_args(argv))


def arguments(task: str, side: str, root: Path) -> list[str]:
    """The `trainbox run` arguments of one example from one side, without the steps."""
    if side == "shards":
        source = ["data.factory=trainbox.tasks.shards:data",
                  f"data.args.train={root / f'{task}-shards' / 'train'}",
                  f"data.args.val={root / f'{task}-shards' / 'val'}",
                  "data.args.shuffle_buffer=256"]  # fmt: skip
    elif task == "csv":
        return ["--config", str(harness.ROOT / "examples" / "tabular" / "config.yaml"),
                f"data.args.train_csv={root / 'csv' / 'train.csv'}",
                f"data.args.val_csv={root / 'csv' / 'val.csv'}"]  # fmt: skip
    else:
        source = ["data.factory=trainbox.tasks.images:data",
                  f"data.args.root={root / 'images'}", "data.args.flip=false"]  # fmt: skip
    if task == "csv":  # examples/tabular/config.yaml's model, optimizer and batch
        return [*source, "model.factory=trainbox.tasks.mlp:mlp", "model.args.in_features=6",
                "model.args.out_features=3", "model.args.hidden=64", "model.args.layers=2",
                "train.batch_size=64", "optim.name=adamw", "optim.lr=3e-3",
                "optim.warmup_steps=20"]  # fmt: skip
    return [*source, "model.factory=trainbox.tasks.images:model", f"model.args.classes={CLASSES}",
            "train.batch_size=32", "optim.name=adamw", "optim.lr=3e-3",
            "optim.warmup_steps=20"]  # fmt: skip


def side(task: str, name: str, root: Path, seed: int, steps: int) -> Callable[[], dict[str, Any]]:
    """One `trainbox run` of the example from one side; its val_metrics."""

    def run() -> dict[str, Any]:
        with harness.workdir("parity-run") as run_dir:
            argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={run_dir}",
                    *arguments(task, name, root), f"seed={seed}", f"train.max_steps={steps}",
                    f"train.eval_every={steps}", f"train.ckpt_every={steps}",
                    "train.log_every=50", "preflight.gpus=off",
                    "pinning.num_workers=0"]  # fmt: skip
            harness.run(argv, harness.clean_env())
            found: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
            return dict(found["val_metrics"])

    return run


def compare(
    runs: dict[str, dict[str, list[dict[str, Any]]]], bench: harness.Bench
) -> dict[str, Any]:
    """Print each example's table and verdict; the figures for the JSON line."""
    out: dict[str, Any] = {}
    for task, sides in runs.items():
        accuracy = harness.column(sides, "val_accuracy")
        means = {name: statistics.fmean(values) for name, values in accuracy.items()}
        spread = {name: statistics.stdev(v) if len(v) > 1 else 0.0 for name, v in accuracy.items()}
        difference = means["shards"] - means["files"]
        error = math.sqrt(sum(sd**2 for sd in spread.values()) / len(accuracy["files"]))
        tolerance = STANDARD_ERRORS * error
        rows: list[list[Any]] = [["side", "mean val_accuracy", "sd over seeds", "per seed"]]
        for name in SIDES:
            rows.append([name, round(means[name], 4), round(spread[name], 4),
                         harness.spread(accuracy[name], ".4f")])  # fmt: skip
        verdict = bench.verdict(abs(difference) <= tolerance)
        print(f"\n{task}:\n{harness.table(rows)}")
        print(f"shards - files: {difference:+.4f} (tolerance {STANDARD_ERRORS:g} standard errors:"
              f" {tolerance:.4f}): {verdict}")  # fmt: skip
        losses = harness.column(sides, "val_loss")
        out[task] = {"val_accuracy": accuracy, "mean": means, "sd": spread,
                     "difference": difference, "tolerance": tolerance, "verdict": verdict,
                     "val_loss": losses}  # fmt: skip
    return out


def main() -> int:
    parse = harness.parser(__doc__)
    args = parse.parse_args()
    # Seeds a side: --reps, one when quick, else each task's own (SEEDS).
    bench = harness.start("stream_parity", args, reps=0)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with harness.workdir("parity") as root:
        make_data(root, quick=args.quick)
        for task in TASKS:
            found: dict[str, list[dict[str, Any]]] = {name: [] for name in SIDES}
            for seed in range(bench.reps or SEEDS[task]):
                steps = 30 if args.quick else STEPS[task]
                sides = [(name, side(task, name, root, seed, steps)) for name in SIDES]
                for name, result in harness.interleave(1, sides).items():
                    found[name] += result
            runs[task] = found
    seeds = {t: len(runs[t]["files"]) for t in TASKS}
    results = {"settings": {"seeds": seeds, "standard_errors": STANDARD_ERRORS,
                            "steps": {t: 30 if args.quick else STEPS[t] for t in TASKS}},
               **compare(runs, bench)}  # fmt: skip
    return bench.finish(
        results, positive=[v for task in TASKS for v in results[task]["mean"].values()]
    )


if __name__ == "__main__":
    sys.exit(main())
