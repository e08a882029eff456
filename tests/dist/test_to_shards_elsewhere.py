"""Tar shards made elsewhere train: members named as WebDataset writers name them
(KEY.input.npy, KEY.label.cls), train and val shards in one folder, each split indexed by
`python -m trainbox.tasks.to_shards index`, then one short `trainbox run` that evaluates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env, summary, train
from stream_shards import webdataset, write_tar

pytestmark = pytest.mark.slow

SPLITS = {"train": (13, 40, 7), "val": (5, 9)}


def write_split(folder: Path, split: str, sizes: tuple[int, ...], first: int) -> int:
    """ds-SPLIT-NNNNNN.tar files of `sizes` samples; the number after the last sample."""
    for number, size in enumerate(sizes):
        samples = webdataset(first, size)
        members = [(f"{key}.{ext}", data) for key, parts in samples for ext, data in parts.items()]
        write_tar(folder / f"ds-{split}-{number:06d}.tar", members)
        first += size
    return first


def test_shards_made_elsewhere_are_indexed_and_train_with_their_validation_set(
    tmp_path: Path,
) -> None:
    data, first = tmp_path / "data", 0
    for split, sizes in SPLITS.items():
        first = write_split(data, split, sizes, first)
        command = [sys.executable, "-m", "trainbox.tasks.to_shards", "index",
                   str(data / f"{split}.json"), str(data / f"ds-{split}-*.tar")]  # fmt: skip
        done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "run"
    train(
        run_dir,
        "data.factory=trainbox.tasks.shards:data",
        f"data.args.train={data / 'train.json'}",
        f"data.args.val={data / 'val.json'}",
        "model.factory=trainbox.tasks.mlp:mlp",
        "model.args.in_features=2",
        "model.args.out_features=3",
        "train.batch_size=8",
        "train.max_steps=6",
        "train.eval_every=6",
        "train.ckpt_every=6",
    )
    done = summary(run_dir)
    assert done["steps"] == 6
    assert done["val_metrics"]["val_samples"] == sum(SPLITS["val"])
