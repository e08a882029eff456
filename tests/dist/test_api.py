"""The Python API: a script that trains its own model and data objects gives the same
params_sha256 as its `trainbox run` twin (examples/api_script.py vs examples/user_model).

Real runs: `torchrun --no-python trainbox exec -- python examples/api_script.py` and
`torchrun -m trainbox run --config examples/user_model/config.yaml`, 2 processes each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env, summary, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"
OVERRIDES = [
    "train.max_steps=30",
    "train.log_every=10",
    "train.eval_every=15",
    "train.ckpt_every=10",
]


def run_api_script(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    trainbox = [sys.executable, "-m", "trainbox"]
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--no-python",
    ]
    argv = [*torchrun, *trainbox, "exec", "--", sys.executable, str(EXAMPLES / "api_script.py"),
            f"run_dir={run_dir}", *OVERRIDES, *extra]  # fmt: skip
    env = clean_env(PYTHONPATH=str(EXAMPLES / "user_model"))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_api_script_matches_its_trainbox_run_twin(tmp_path: Path) -> None:
    script = run_api_script(tmp_path / "api")
    assert script.returncode == 0, script.stderr[-3000:]
    config = EXAMPLES / "user_model" / "config.yaml"
    train(
        tmp_path / "run",
        "--config",
        str(config),
        *OVERRIDES,
        nproc=2,
        pythonpath=EXAMPLES / "user_model",
    )
    ours, twin = summary(tmp_path / "api"), summary(tmp_path / "run")
    assert ours["params_sha256"] == twin["params_sha256"]
    assert ours["val_metrics"] == twin["val_metrics"]
    assert f"params_sha256={ours['params_sha256']}" in script.stdout
    # The same run files, from the same loop.
    assert {p.name for p in (tmp_path / "api").iterdir()} >= {
        "config.yaml",
        "run.json",
        "metrics.jsonl",
        "checkpoints",
    }


def test_the_api_script_is_preempted_like_run(tmp_path: Path) -> None:
    # One process, no launcher: the script's Trainer installs the stop handlers during fit.
    env_fault = clean_env(
        PYTHONPATH=str(EXAMPLES / "user_model"), TRAINBOX_FAULT="signal:rank=0:step=12:sig=TERM"
    )
    argv = [
        sys.executable,
        str(EXAMPLES / "api_script.py"),
        f"run_dir={tmp_path / 'stopped'}",
        *OVERRIDES,
    ]
    stopped = subprocess.run(
        argv, env=env_fault, capture_output=True, text=True, timeout=300, check=False
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert re.search(r"api_script: stopped after step (1[3-9]|2[0-9]) \(SIGTERM\)", stopped.stderr)


def test_import_trainbox_stays_free_of_torch() -> None:
    # The CLI pins CPUs before torch starts its thread pools; the API must not import it early.
    code = "import sys, trainbox; assert 'torch' not in sys.modules; trainbox.Trainer; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env())
