"""The Python API path (issue 19, item 12): `Trainer(data=(train, val))` trains like a data
factory's tuple, and a run whose model and data came as objects says so in its config.yaml, so
`eval` on it is one clear line instead of rebuilding the built-in task.

Real runs: a small API script, then `trainbox eval` on what it wrote.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runs import clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, torch, trainbox
from torch.utils.data import TensorDataset
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 3, generator=g)
y = (x[:, 0] > 0).long()
config = trainbox.load_config(None, sys.argv[1:])
with trainbox.init_distributed(seed=config.seed) as session:
    data = (TensorDataset(x, y), TensorDataset(x, y))
    trainbox.Trainer(config, session, model=torch.nn.Linear(3, 2), data=data).fit()
"""


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("api") / "run"
    argv = [
        sys.executable,
        "-c",
        SCRIPT,
        f"run_dir={run_dir}",
        "train.max_steps=4",
        "train.eval_every=4",
    ]
    proc = subprocess.run(
        argv, env=clean_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_a_train_val_tuple_trains(api_run: Path) -> None:
    assert summary(api_run)["steps"] == 4


def test_config_yaml_says_the_model_and_data_came_from_the_api(api_run: Path) -> None:
    recorded = yaml.safe_load((api_run / "config.yaml").read_text())
    assert recorded["model"]["factory"] == "<api>"
    assert recorded["data"]["factory"] == "<api>"


def test_eval_of_an_api_run_is_one_line_saying_what_to_name(api_run: Path) -> None:
    proc = subprocess.run(trainbox_argv(1, "eval", "--checkpoint", str(api_run)), env=clean_env(),
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "trained through the Python API" in lines[0]
    assert "model.factory" in lines[0]
    assert "HINT:" in lines[0]


def test_trainbox_run_records_the_factories_it_built(tmp_path: Path) -> None:
    # `run` trains through the same Trainer, with objects its factories built from the config.
    train(tmp_path, "train.max_steps=2", "train.eval_every=2")
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert recorded["model"]["factory"] == "trainbox.tasks.spirals:model"
    assert recorded["data"]["factory"] == "trainbox.tasks.spirals:data"


# Factories that build what SCRIPT trained, for eval to name.
FACTORIES = """
import torch
from torch.utils.data import TensorDataset

def model():
    return torch.nn.Linear(3, 2)

def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, generator=g)
    y = (x[:, 0] > 0).long()
    return TensorDataset(x, y), TensorDataset(x, y)
"""


def test_eval_of_an_api_run_works_once_factories_are_named(api_run: Path, tmp_path: Path) -> None:
    # What the hint says to do: the checkpoint's model config (<api>) is no reason to refuse.
    (tmp_path / "api_run_factories.py").write_text(FACTORIES)
    argv = trainbox_argv(1, "eval", "--checkpoint", str(api_run),
                         "model.factory=api_run_factories:model", "data.factory=api_run_factories:data")  # fmt: skip
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "evaluated step-00000004.pt (step 4) on 256 samples" in proc.stdout
