"""Convert a built-in task's data (an image folder, CSV files) to tar shards and manifests:
`python -m trainbox.tasks.to_shards images ROOT OUT` or `... csv TRAIN.csv OUT --target label`;
or write the manifest of tar shards made elsewhere: `... index OUT [SHARDS ...]`.

OUT/train/ (and OUT/val/ where there is a validation set) each get shard-NNNNNN.tar files and
a manifest.json, which `trainbox.tasks.shards:data` reads.
"""

from __future__ import annotations

import argparse
import functools
import glob
import io
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from trainbox.errors import UsageError
from trainbox.streams.shards import (
    CHECKS,
    MANIFEST,
    Sample,
    Shard,
    ShardFault,
    index_shard,
    write_manifest,
    write_shards,
)
from trainbox.tasks import images, tabular
from trainbox.tasks.problems import Problems

INDEX_HINT = (
    "index whole, uncompressed tar files (listed, or a folder or a quoted pattern of them)"
    " whose samples are runs of members named KEY.EXT with one KEY, as WebDataset writes them;"
    " OUT is the manifest's folder or a path ending in .json"
)


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
    """Write the shards (or for `index`, only the manifest) the options ask for; the manifests
    written."""
    if options.source == "index":
        return [index(options.output, options.shards)]
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


def index(output: str, specs: Sequence[str]) -> Path:
    """The manifest of the tars `specs` name (files, folders of *.tar, glob patterns), written
    at `output` (a .json path, or a folder for manifest.json) only when every one is whole."""
    problems = Problems()
    manifest = manifest_path(output, problems)
    if not specs and not Path(output).is_dir():
        problems.add(f"{output} is not a folder: list the shards after it")
    elif not specs:
        specs = [output]
    paths = shard_paths(specs, problems)
    with ThreadPoolExecutor(max_workers=CHECKS) as pool:
        # Threads: reading headers waits on the file system (a parallel one, often).
        indexed = list(pool.map(_indexed_or_fault, paths))
    shards = [shard for shard in indexed if isinstance(shard, Shard)]
    for fault in indexed:
        if isinstance(fault, ShardFault):
            problems.add(fault.line)
    problems.raise_any(INDEX_HINT)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    return write_manifest(manifest.parent, shards, name=manifest.name)


def manifest_path(output: str, problems: Problems) -> Path:
    """Where the manifest goes: `output`/manifest.json for a folder (one to make, unless the
    name ends in .json), else `output` itself."""
    path = Path(output)
    if path.is_dir():
        return path / MANIFEST
    if output.endswith(".json"):
        return path
    if path.exists():
        problems.add(f"{output} is a file: give a folder for {MANIFEST}, or a path ending in .json")
    return path / MANIFEST


def shard_paths(specs: Sequence[str], problems: Problems) -> list[Path]:
    """The tar files `specs` name, in the order given, each folder's or pattern's by name."""
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            tars = sorted(p for p in path.glob("*.tar") if p.is_file())
            if not tars:
                problems.add(f"{spec} holds no .tar files")
        elif any(char in spec for char in "*?[") and not path.exists():
            tars = sorted(Path(p) for p in glob.glob(spec) if Path(p).is_file())
            if not tars:
                problems.add(f"{spec} matches no file")
        else:
            tars = [path]
        found.extend(tars)
    seen: set[str] = set()
    for path in found:
        real = os.path.realpath(path)
        if real in seen:
            problems.add(f"{path} is listed twice")
        seen.add(real)
    return found


def _indexed_or_fault(path: Path) -> Shard | ShardFault:
    try:
        return index_shard(path)
    except ShardFault as fault:
        return fault


def parser() -> argparse.ArgumentParser:
    """The converter's options."""
    made = argparse.ArgumentParser(
        prog="python -m trainbox.tasks.to_shards",
        description="Write an image folder or CSV files as tar shards with a manifest, or"
        " write the manifest of tar shards made elsewhere.",
    )
    commands = made.add_subparsers(dest="source", required=True)
    converting = argparse.ArgumentParser(add_help=False)
    converting.add_argument("input", help="the image folder, or the train CSV file")
    converting.add_argument("output", help="folder for train/ and val/ shards")
    converting.add_argument("--per-shard", type=int, default=1000, help="samples per shard (1000)")
    from_images = commands.add_parser(
        "images", parents=[converting], help="convert an image folder (a subfolder per class)"
    )
    from_images.add_argument("--val-fraction", type=float, default=0.1, help="held out (0.1)")
    from_images.add_argument(
        "--seed", type=int, default=0, help="the held-out draw's and the order's seed"
    )
    from_csv = commands.add_parser("csv", parents=[converting], help="convert CSV files")
    from_csv.add_argument("--val-csv", default=None, help="the validation file")
    from_csv.add_argument("--target", default="label", help="the target column (label)")
    from_csv.add_argument("--task", default="classification", choices=tabular.TASKS)
    indexing = commands.add_parser(
        "index",
        help="write the manifest of existing tar shards",
        description="Count the samples of existing tar shards (WebDataset layout), check that"
        " each is whole, and write their manifest; nothing is written when one is not.",
    )
    indexing.add_argument(
        "output", metavar="OUT", help="the manifest: a folder (for manifest.json) or a .json path"
    )
    indexing.add_argument(
        "shards",
        nargs="*",
        metavar="SHARDS",
        help="tar files, folders (their *.tar) or quoted glob patterns, in manifest order;"
        " none: the tars in the folder OUT",
    )
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
