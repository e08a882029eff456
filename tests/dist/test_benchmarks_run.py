"""Every benchmark of benchmarks/run_all.py runs in its quick mode and ends with a sane result.

Quick mode judges no timing (the other test worker shares the CPUs); it keeps each benchmark's
code from rotting. One test per benchmark, in the test pool: run one after another before the
pool, they held the machine's second CPU idle for about 4 minutes.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env

pytestmark = pytest.mark.slow

RUN_ALL = Path(__file__).resolve().parents[2] / "benchmarks" / "run_all.py"
# Benchmarks that start mpirun as root: that shares the machine (tests/conftest.py).
ON_THE_MACHINE = frozenset({"exec_overhead"})
# The GPU proof's dry run (test_gpu_proof_dry_run.py) runs these quick, as run_all.py would,
# and checks the same: exit 0 and a sane closing JSON line. Once is enough.
IN_THE_GPU_PROOF = frozenset({"input_pipeline", "checkpoint_cost", "hsdp_traffic"})


def _names() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("run_all", RUN_ALL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names: tuple[str, ...] = module.BENCHMARKS
    return names


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xdist_group("system")) if name in ON_THE_MACHINE
        else name
        for name in _names()
        if name not in IN_THE_GPU_PROOF
    ],
)  # fmt: skip
def test_the_benchmark_runs_quick_and_its_result_is_sane(name: str) -> None:
    # run_all.py checks the exit code and the closing JSON line, as for a full run.
    proc = subprocess.run(
        [sys.executable, str(RUN_ALL), "--quick", name], env=clean_env(),
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "1/1 benchmarks ran" in proc.stdout, proc.stdout[-2000:]
