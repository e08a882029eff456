"""The Python API example under real launchers: examples/api_script.py behind `trainbox exec`
under mpirun and srun gives the params_sha256 of its `trainbox run` twin (world size 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiers
from launchers.slurm_cluster import SlurmCluster
from runs import clean_env, summary, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"
USER_MODEL = EXAMPLES / "user_model"
OVERRIDES = [
    "train.max_steps=20",
    "train.log_every=10",
    "train.eval_every=0",
    "train.ckpt_every=10",
]
# Ranks and job steps find `trainbox` and this venv's python first on PATH.
VENV_BIN = Path(sys.executable).parent


def script_argv(run_dir: Path) -> list[str]:
    script = [sys.executable, str(EXAMPLES / "api_script.py"), f"run_dir={run_dir}", *OVERRIDES]
    return ["trainbox", "exec", "--", *script]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fingerprint of `trainbox run` with the same config under torchrun, 2 processes."""
    run_dir = tmp_path_factory.mktemp("twin")
    train(
        run_dir,
        "--config",
        str(USER_MODEL / "config.yaml"),
        *OVERRIDES,
        nproc=2,
        pythonpath=USER_MODEL,
    )
    return str(summary(run_dir)["params_sha256"])


def test_under_mpirun(twin: str, tmp_path: Path) -> None:
    tiers.require_commands("mpirun")
    env = clean_env(
        PATH=f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}", PYTHONPATH=str(USER_MODEL)
    )
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "2",
        "-x",
        "PYTHONPATH",
        *script_argv(tmp_path),
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (summary(tmp_path)["launcher"], summary(tmp_path)["world_size"]) == ("mpi", 2)
    assert summary(tmp_path)["params_sha256"] == twin


def test_under_srun(twin: str, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    argv = ["srun", "-N2", "--ntasks-per-node=1", *script_argv(tmp_path)]
    proc = slurm_cluster.run(
        argv, env={"PYTHONPATH": str(USER_MODEL), "OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + slurm_cluster.diagnostics()
    assert (summary(tmp_path)["launcher"], summary(tmp_path)["world_size"]) == ("slurm", 2)
    assert summary(tmp_path)["params_sha256"] == twin
