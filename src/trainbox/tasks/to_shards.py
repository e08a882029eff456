"""Convert a built-in task's data (an image folder, CSV files) to tar shards and manifests:
`python -m trainbox.tasks.to_shards images ROOT OUT` or `... csv TRAIN.csv OUT --target label`.

OUT/train/ (and OUT/val/ where there is a validation set) each get shard-NNNNNN.tar files and
a manifest.json, which `trainbox.tasks.shards:data` reads.
"""

from __future__ import annotations

import argparse
import functools
import io
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainbox.errors import UsageError
from trainbox.streams.shards import Sample, write_shards
from trainbox.tasks import images, tabular


def image_samples(dataset: images.ImageFiles, seed: int | None = None) -> Iterator[Sample]:
    """Each image's own bytes (KEY.png or KEY.jpg) and its class index (KEY.cls), in an order
    shuffled from `seed` (None: the folder's order)."""
    pairs = list(zip(dataset.files, dataset.labels, strict=True))
    if seed is not None:
        # A folder lists its images class by class, and a stream reads shards front to back:
        # written in that order, a stream's batches would hold one class each.
        random.Random(seed).shuffle(pairs)
    for number, (path, label) in enumerate(pairs):
        ext = Path(path).suffix.lower().lstrip(".")
        yield f"{number:08d}", {ext: Path(path).read_bytes(), "cls": str(label).encode()}


def row_samples(dataset: tabular.TensorPairs) -> Iterator[Sample]:
    """Each row's features as float32 KEY.npy, its class as KEY.cls or its value as KEY.json."""
    for number in range(len(dataset)):
        inputs, target = dataset[number]
        buffer = io.BytesIO()
        np.save(buffer, inputs.numpy().astype(np.float32), allow_pickle=False)
        if dataset.classes:
            label = ("cls", str(int(target)).encode())
        else:
            label = ("json", repr(target.tolist()).encode())
        yield f"{number:08d}", {"npy": buffer.getvalue(), label[0]: label[1]}


def convert(options: argparse.Namespace) -> list[Path]:
    """Write the shards the options ask for; the manifests written."""
    if options.per_shard < 1:
        raise UsageError(
            f"--per-shard {options.per_shard} must be at least 1",
            hint="give a positive number of samples per shard",
        )
    sets: Any
    samples: Callable[[Any], Iterator[Sample]]
    train_samples: Callable[[Any], Iterator[Sample]]
    if options.source == "images":
        sets = images.data(root=options.input, val_fraction=options.val_fraction, seed=options.seed)
        samples = image_samples
        train_samples = functools.partial(image_samples, seed=options.seed)
    else:
        sets = tabular.data(
            train_csv=options.input,
            val_csv=options.val_csv,
            target=options.target,
            task=options.task,
        )
        samples = train_samples = row_samples
    out = Path(options.output)
    written = [write_shards(out / "train", train_samples(sets.train), per_shard=options.per_shard)]
    if sets.val is not None:
        written.append(write_shards(out / "val", samples(sets.val), per_shard=options.per_shard))
    return written


def parser() -> argparse.ArgumentParser:
    """The converter's options."""
    made = argparse.ArgumentParser(
        prog="python -m trainbox.tasks.to_shards",
        description="Write an image folder or CSV files as tar shards with a manifest.",
    )
    made.add_argument("source", choices=("images", "csv"), help="what INPUT is")
    made.add_argument("input", help="the image folder, or the train CSV file")
    made.add_argument("output", help="folder for train/ and val/ shards")
    made.add_argument("--per-shard", type=int, default=1000, help="samples per shard (1000)")
    made.add_argument("--val-fraction", type=float, default=0.1, help="images: held out (0.1)")
    made.add_argument(
        "--seed", type=int, default=0, help="images: the held-out draw's and the order's seed"
    )
    made.add_argument("--val-csv", default=None, help="csv: the validation file")
    made.add_argument("--target", default="label", help="csv: the target column (label)")
    made.add_argument("--task", default="classification", choices=tabular.TASKS)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """Convert, print each manifest written; exit 2 with one line on bad input."""
    options = parser().parse_args(argv)
    try:
        written = convert(options)
    except UsageError as err:
        print(f"error: {err.line()}", file=sys.stderr)
        return err.exit_code
    for manifest in written:
        print(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
