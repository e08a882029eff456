"""`train.deterministic` takes effect on both paths: `trainbox run` and `trainbox.Trainer`.

A real one-process script drives the Python API; its model records, inside forward, what torch
and the environment say about determinism, which is what a GPU matmul would see.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, sys
import torch
import trainbox
from trainbox.tasks import spirals

seen = {}

class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = spirals.model()
    def forward(self, x):
        seen["algorithms"] = torch.are_deterministic_algorithms_enabled()
        seen["cudnn_benchmark"] = torch.backends.cudnn.benchmark
        seen["cudnn_deterministic"] = torch.backends.cudnn.deterministic
        seen["cublas"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        return self.net(x)

config = trainbox.load_config(None, sys.argv[1:])
with trainbox.init_distributed(seed=config.seed) as session:
    data = spirals.data(train_size=256, val_size=64)
    trainbox.Trainer(config, session, model=Probe(), data=data).fit()
print(json.dumps(seen))
"""


def probe(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> dict[str, object]:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script), f"run_dir={tmp_path / 'run'}", "train.max_steps=3",
            "train.eval_every=0", "train.ckpt_every=0", *overrides]  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(**(env or {})), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_python_api_applies_train_deterministic(tmp_path: Path) -> None:
    seen = probe(tmp_path, "train.deterministic=true")
    assert seen == {
        "algorithms": True,
        "cudnn_benchmark": False,
        "cudnn_deterministic": True,
        # torch refuses a deterministic cuBLAS matmul on GPU without it.
        "cublas": ":4096:8",
    }


def test_a_workspace_config_of_the_users_own_is_kept(tmp_path: Path) -> None:
    seen = probe(tmp_path, "train.deterministic=true", env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    assert seen["cublas"] == ":16:8"


def test_determinism_stays_off_by_default(tmp_path: Path) -> None:
    seen = probe(tmp_path)
    assert seen["algorithms"] is False
    assert seen["cublas"] is None


def test_trainbox_run_applies_train_deterministic(tmp_path: Path) -> None:
    # The same probe as a model factory: `trainbox run` goes through the same Trainer.
    (tmp_path / "probe_factory.py").write_text(
        SCRIPT.split("config = trainbox")[0]
        + "\ndef model():\n    return Probe()\n\nimport atexit\n"
        + "atexit.register(lambda: print(json.dumps(seen)))\n"
    )
    argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={tmp_path / 'run'}",
            "model.factory=probe_factory:model", "train.max_steps=3", "train.eval_every=0",
            "train.ckpt_every=0", "train.deterministic=true"]  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(PYTHONPATH=str(tmp_path)), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["algorithms"] is True
    assert seen["cublas"] == ":4096:8"
