"""scripts/kernel_bits.py: the per-kernel hashes that show where two machines' bits part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[2] / "scripts" / "kernel_bits.py"


def kernel_bits(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)


def test_a_machine_agrees_with_itself_and_names_a_kernel_that_differs(tmp_path: Path) -> None:
    first = kernel_bits()
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["settings"] == {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                                  "ONEDNN_MAX_CPU_ISA": "AVX2"}  # fmt: skip
    assert {"sqrt", "exp", "mm 64x128x128", "adamw 3 steps"} <= report["kernels"].keys()
    (tmp_path / "same.json").write_text(first.stdout)
    report["kernels"]["sqrt"] = "0" * 12
    (tmp_path / "other.json").write_text(json.dumps(report))

    same = kernel_bits("--diff", str(tmp_path / "same.json"))
    other = kernel_bits("--diff", str(tmp_path / "other.json"))

    assert (same.returncode, same.stdout.splitlines()[-1]) == (
        0,
        "every kernel computed the same bits",
    )
    assert other.returncode == 1
    assert other.stdout.splitlines()[-1].endswith(" here, 000000000000 there")
    assert other.stdout.splitlines()[-1].startswith("sqrt: ")
