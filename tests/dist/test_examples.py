"""The shipped examples train through `trainbox run` exactly as their READMEs say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runs import summary, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_user_model_package_trains_mounted_on_pythonpath(tmp_path: Path) -> None:
    # The package is only put on PYTHONPATH, as a mounted directory would be; trainbox is untouched.
    config = EXAMPLES / "user_model" / "config.yaml"
    train(tmp_path, "--config", str(config), "train.max_steps=20", "train.eval_every=10",
          pythonpath=EXAMPLES / "user_model", nproc=2)  # fmt: skip
    result = summary(tmp_path)
    assert result["steps"] == 20
    assert 0.0 <= result["val_metrics"]["val_accuracy"] <= 1.0


def test_tabular_csv_example(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(EXAMPLES / "tabular" / "make_csv.py"), str(tmp_path)], check=True
    )
    train(
        tmp_path / "run", "--config", str(EXAMPLES / "tabular" / "config.yaml"),
        f"data.args.train_csv={tmp_path / 'train.csv'}", f"data.args.val_csv={tmp_path / 'val.csv'}",
    )  # fmt: skip
    assert summary(tmp_path / "run")["val_metrics"]["val_accuracy"] > 0.6
