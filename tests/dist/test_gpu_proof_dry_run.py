"""`scripts/gpu-proof --cpu-dry-run`: every stage of the GPU proof runs here, so it cannot rot.

CI has no GPU. The dry run takes the script's own code paths on the CPU: gloo with 2 ranks, the
fake NVML module for doctor, and tiny models. What needs a GPU runs only on a GPU machine
(docs/gpu-proof.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-proof"


def test_every_stage_runs_and_every_check_holds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(SCRIPT), "--cpu-dry-run", "--out", str(out)],
        env=clean_env(TRAINBOX_PYTHON=sys.executable), capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    record = json.loads((out / "gpu_proof.json").read_text())
    failed = [(stage, c) for stage, found in record["stages"].items()
              for c in found["checks"] if not c["ok"]]  # fmt: skip
    assert failed == [], proc.stdout[-4000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    stages = ["doctor", "fabric", "train", "health", "hang", "throughput", "fsdp", "hsdp",
              "checkpoint", "pinning", "store", "recovery"]  # fmt: skip
    assert list(record["stages"]) == stages
    # test_benchmarks_run.py leaves these three benchmarks' quick runs to this one.
    ran = [record["stages"]["hsdp"]["hsdp_traffic"],
           record["stages"]["checkpoint"]["checkpoint_cost"],
           record["stages"]["pinning"]["input_pipeline"]["2"]]  # fmt: skip
    assert [(r["benchmark"], r["sane"]) for r in ran] == [
        ("hsdp_traffic", True),
        ("checkpoint_cost", True),
        ("input_pipeline", True),
    ]
    # The benchmark's own facts, which its sane includes: counted equals predicted, and less.
    assert all(record["stages"]["hsdp"]["hsdp_traffic"]["holds"].values())
    assert (out / "gpu_proof.md").read_text().startswith("# GPU proof: PASS (CPU dry run)")


def test_without_a_gpu_it_stops_with_a_hint(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(SCRIPT), "--out", str(tmp_path)], env=clean_env(TRAINBOX_PYTHON=sys.executable),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 3
    assert "no CUDA GPU is visible to torch" in proc.stderr
    assert "HINT: " in proc.stderr
