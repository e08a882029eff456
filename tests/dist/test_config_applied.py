"""A real `trainbox run` trains what its overrides say, and config.yaml says what was trained.

Issue 19, item 1: `model.args={hidden: 32}` was dropped (default width, `args: {}` in config.yaml,
exit 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from runs import train

pytestmark = pytest.mark.slow

SHORT = ["train.max_steps=5", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0"]


def test_a_whole_mapping_override_is_trained_and_recorded(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, *SHORT, "model.args={hidden: 32}", "model.args.layers=1")
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["model"]["args"] == {"hidden": 32, "layers": 1}
    checkpoint = torch.load(run_dir / "checkpoints" / "latest", weights_only=True)
    shapes = {name: tuple(tensor.shape) for name, tensor in checkpoint["model"].items()}
    # One hidden layer 2 -> 32, then the head 32 -> 5 classes.
    assert shapes == {"0.weight": (32, 2), "0.bias": (32,), "2.weight": (5, 32), "2.bias": (5,)}
