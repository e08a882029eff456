"""Every training switch runs for real: AMP, compile, clipping, accumulation, SGD, LR scaling."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "options",
    [
        ["train.amp=bf16", "train.compile=true", "train.clip_grad_norm=0.5"],
        ["train.amp=fp16", "train.grad_accum=2", "train.find_unused_parameters=true"],
        ["optim.name=sgd", "optim.lr=0.05", "optim.scale_lr=linear", "optim.schedule=constant"],
        [
            "train.deterministic=true",
            "pinning.num_workers=1",
            "optim.scale_lr=sqrt",
            "optim.warmup_steps=0",
        ],
    ],
    ids=["bf16-compile-clip", "fp16-accum-unused", "sgd-linear-constant", "deterministic-workers"],
)
def test_training_options(tmp_path: Path, options: list[str]) -> None:
    train(tmp_path, *QUICK, *options, nproc=2)
    result = summary(tmp_path)
    assert result["steps"] == 40
    assert math.isfinite(result["final_loss"])


def test_linear_scaling_multiplies_the_peak_lr_by_the_world(tmp_path: Path) -> None:
    train(
        tmp_path,
        *QUICK,
        "optim.scale_lr=linear",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        nproc=2,
    )
    lrs = {
        json.loads(line)["lr"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if '"train"' in line
    }
    assert sorted(lrs) == pytest.approx([2 * 3e-3])
