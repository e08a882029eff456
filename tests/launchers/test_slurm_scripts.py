"""The shipped sbatch scripts, submitted to the real local Slurm cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

SLURM_DIR = Path(__file__).parents[2] / "slurm"


@pytest.mark.parametrize("trainbox", ["trainbox", f"{sys.executable} -m trainbox"])
def test_doctor_sbatch_reports_every_task(
    slurm_cluster: SlurmCluster, tmp_path: Path, trainbox: str
) -> None:
    output = tmp_path / "doctor.out"
    job = slurm_cluster.sbatch(
        SLURM_DIR / "doctor.sbatch", args=[f"--output={output}"], env={"TRAINBOX": trainbox}
    )
    assert slurm_cluster.wait_job(job) == "COMPLETED", slurm_cluster.diagnostics(job)
    lines = [json.loads(line) for line in output.read_text().splitlines() if line.startswith("{")]
    # The output file also holds the JSON log lines (stderr); reports are the ones with checks.
    reports = [line for line in lines if "checks" in line]
    assert sorted((r["rank"], r["node_rank"], r["launcher"]) for r in reports) == [
        (0, 0, "slurm"),
        (1, 0, "slurm"),
        (2, 1, "slurm"),
        (3, 1, "slurm"),
    ]
