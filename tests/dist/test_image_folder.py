"""A folder of PNG files trains end to end through `trainbox run data.factory=...images:data`.

Decoding and augmentation happen in DataLoader workers; the parameters must not depend on how
many there are, and a resumed run must reproduce the uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow


def make_folder(root: Path) -> Path:
    """Two classes told apart by brightness, 24 noisy 16x16 PNGs each, a val/ tree of 6 each."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("val", 6)):
        for name, level in (("dark", 70), ("light", 180)):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(level + rng.normal(0, 30, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


def config(root: Path, workers: int) -> list[str]:
    return [
        *QUICK,
        "data.factory=trainbox.tasks.images:data",
        f"data.args.root={root}",
        "data.args.crop=12",
        "model.factory=trainbox.tasks.images:model",
        "model.args.classes=2",
        "train.batch_size=8",
        f"pinning.num_workers={workers}",
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The image folder and one uninterrupted two-process run decoding in the main process."""
    root = make_folder(tmp_path_factory.mktemp("images"))
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *config(root, 0), nproc=2)
    return root, run_dir


def test_an_image_folder_trains_and_evaluates(reference: tuple[Path, Path]) -> None:
    result = summary(reference[1])
    assert result["steps"] == 40
    assert result["val_metrics"]["val_accuracy"] > 0.9


def test_worker_processes_give_the_same_parameters(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    root, run_dir = reference
    train(tmp_path, *config(root, 2), nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(run_dir)["params_sha256"]


def test_resuming_reproduces_the_run(reference: tuple[Path, Path], tmp_path: Path) -> None:
    root, run_dir = reference
    middle = run_dir / "checkpoints" / "step-00000021.pt"
    train(tmp_path, *config(root, 1), f"train.resume={middle}", nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(run_dir)["params_sha256"]


def test_a_worker_stuck_in_its_fork_is_replaced_and_the_run_is_unchanged(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    # Rank 0's validation worker at step 20 blocks in its fork, as one caught by CPython's fork
    # deadlock does (train/data/workers.py); dist.timeout_s=40 makes it count as stuck after 10 s.
    root, run_dir = reference
    proc = train(
        tmp_path, *config(root, 1), "dist.timeout_s=40", nproc=2,
        env={"TRAINBOX_FAULT": "fork:rank=0:step=20"},
    )  # fmt: skip
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    stuck = [e for e in events if e["event"].startswith("data loader worker stuck at start")]
    assert [(e["rank"], e["attempt"]) for e in stuck] == [(0, 1)]
    assert summary(tmp_path)["params_sha256"] == summary(run_dir)["params_sha256"]
    assert summary(tmp_path)["val_metrics"] == summary(run_dir)["val_metrics"]
