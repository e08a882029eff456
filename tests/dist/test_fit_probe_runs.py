"""`trainbox run` refuses targets that do not fit `train.loss`, and items that are not pairs,
with exit 2 and one line before the first step (issue 19, items 8 and 9)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runs import clean_env, trainbox_argv

pytestmark = pytest.mark.slow

USER_DATA = """
import torch
from torch.utils.data import TensorDataset

def soft_targets():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, 2, generator=g), torch.rand(256, 3, generator=g)), None

def dict_items():
    item = {"x": torch.zeros(2), "y": torch.tensor(0)}
    return [item] * 256, None

def text():
    return "some text for training", None
"""


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("soft_targets", "train.loss=cross_entropy needs integer class indices as targets, not float32"),
        ("dict_items", "the train dataset's items are dict, not (inputs, target) pairs of tensors"),
        ("text", "the train dataset's items are str, not (inputs, target) pairs of tensors"),
    ],
)  # fmt: skip
def test_data_that_does_not_fit_stops_before_training(
    tmp_path: Path, factory: str, said: str
) -> None:
    (tmp_path / "probe_user_data.py").write_text(USER_DATA)
    argv = trainbox_argv(1, "run", "run_dir=out", "train.max_steps=5", "model.args.classes=3",
                         f"data.factory=probe_user_data:{factory}")  # fmt: skip
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("trainbox: error: ")
    assert said in last
    assert "HINT:" in last
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists() or not any(
        (tmp_path / "out" / "checkpoints").iterdir()
    )
