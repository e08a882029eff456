"""Every training switch runs for real: AMP, compile, clipping, accumulation, SGD, LR scaling."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow


def finished_well(run_dir: Path) -> None:
    result = summary(run_dir)
    assert result["steps"] == 40
    assert math.isfinite(result["final_loss"])


@pytest.mark.parametrize(
    "options",
    [
        ["train.amp=bf16", "train.compile=true", "train.clip_grad_norm=0.5"],
        ["train.amp=fp16", "train.grad_accum=2", "train.find_unused_parameters=true"],
        [
            "train.deterministic=true",
            "pinning.num_workers=1",
            "optim.scale_lr=sqrt",
            "optim.warmup_steps=0",
        ],
    ],
    ids=["bf16-compile-clip", "fp16-accum-unused", "deterministic-workers"],
)
def test_training_options(tmp_path: Path, options: list[str]) -> None:
    train(tmp_path, *QUICK, *options, nproc=2)
    finished_well(tmp_path)


@pytest.fixture(scope="module")
def sgd_linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SGD at a constant, linearly scaled LR: one run for the switch and for the scaling."""
    run_dir = tmp_path_factory.mktemp("sgd-linear-constant")
    train(
        run_dir,
        *QUICK,
        "optim.name=sgd",
        "optim.lr=0.05",
        "optim.scale_lr=linear",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        nproc=2,
    )
    return run_dir


def test_sgd_at_a_constant_linearly_scaled_lr_trains(sgd_linear: Path) -> None:
    finished_well(sgd_linear)


def test_linear_scaling_multiplies_the_peak_lr_by_the_world(sgd_linear: Path) -> None:
    lrs = {
        json.loads(line)["lr"]
        for line in (sgd_linear / "metrics.jsonl").read_text().splitlines()
        if '"train"' in line
    }
    assert sorted(lrs) == pytest.approx([2 * 0.05])
