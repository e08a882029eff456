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


def test_doctor_sbatch_keeps_every_long_report_on_one_line(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # srun forwards a task's output in pieces of at most 1 KiB, so a longer report (many GPUs or
    # NICs; here a long NCCL setting the report repeats) could be cut by another task's output.
    output = tmp_path / "doctor.out"
    long_value = ",".join(f"mlx5_{index}:1" for index in range(600))
    job = slurm_cluster.sbatch(
        SLURM_DIR / "doctor.sbatch", args=[f"--output={output}"], env={"NCCL_IB_HCA": long_value}
    )
    assert slurm_cluster.wait_job(job) == "COMPLETED", slurm_cluster.diagnostics(job)
    lines = output.read_text().splitlines()
    reports = [json.loads(line) for line in lines if line.startswith('{"trainbox"')]
    assert sorted(report["rank"] for report in reports) == [0, 1, 2, 3]
    assert all(len(json.dumps(report)) > 4096 for report in reports)
