"""`trainbox doctor --json` and `trainbox exec` under the real launchers this machine can run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tiers
from freeport import free_port
from launchcase import place
from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parents[1] / "scripts"
ALLREDUCE = SCRIPTS / "allreduce_env.py"
# Each process writes its own report and log: launchers interleave a shared stdout. (No `$$`:
# torchrun runs its arguments through string.Template, which turns `$$` into `$`.)
DOCTOR = 'f=$(mktemp "$0/XXXXXX") && exec trainbox doctor --json > "$f.json" 2> "$f.log"'
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _reports(out: Path) -> list[dict[str, object]]:
    reports = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return sorted(reports, key=lambda report: int(str(report["rank"])))


def _rows(reports: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [place(report) for report in reports]


def _doctor_under_torchrun(out: Path, env: dict[str, str]) -> None:
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", "sh", "-c", DOCTOR]
    _run([*argv, str(out)], env)


def test_doctor_under_torchrun(tmp_path: Path, clean_env: dict[str, str]) -> None:
    _doctor_under_torchrun(tmp_path, clean_env)
    reports = _reports(tmp_path)
    assert _rows(reports) == [("torchrun", r, r, 2, 2, 0, 1, "localhost") for r in range(2)]
    assert len({report["master_port"] for report in reports}) == 1


def test_log_lines_are_json_bound_with_rank_node_and_launcher(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    _doctor_under_torchrun(tmp_path, clean_env)
    lines = [
        json.loads(line) for log in tmp_path.glob("*.log") for line in log.read_text().splitlines()
    ]
    launch_lines = [line for line in lines if line["event"] == "launch"]
    assert sorted((line["rank"], line["local_rank"]) for line in launch_lines) == [(0, 0), (1, 1)]
    assert all(line["launcher"] == "torchrun" and line["node"] for line in launch_lines)


def test_doctor_under_mpirun(tmp_path: Path, clean_env: dict[str, str]) -> None:
    tiers.require_commands("mpirun")
    _run([*MPIRUN, "-np", "2", "sh", "-c", DOCTOR, str(tmp_path)], clean_env)
    assert _rows(_reports(tmp_path)) == [("mpi", r, r, 2, 2, 0, 1, "127.0.0.1") for r in range(2)]


def test_doctor_under_srun(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=2", "sh", "-c", DOCTOR, str(tmp_path)]
    )
    assert proc.returncode == 0, proc.stderr + slurm_cluster.diagnostics()
    reports = _reports(tmp_path)
    assert _rows(reports) == [("slurm", r, r % 2, 4, 2, r // 2, 2, "n1") for r in range(4)]
    assert [report["host"] for report in reports] == [reports[0]["host"]] * 4


def test_doctor_in_the_sbatch_shell_does_not_claim_a_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "doctor.sbatch"
    script.write_text(f"#!/bin/sh\n#SBATCH -N2 --ntasks-per-node=2\nsh -c '{DOCTOR}' {tmp_path}\n")
    job = slurm_cluster.sbatch(script, args=[f"--output={tmp_path / 'job.out'}"])
    assert slurm_cluster.wait_job(job) == "COMPLETED", slurm_cluster.diagnostics(job)
    (report,) = _reports(tmp_path)
    assert _rows([report]) == [("single", 0, 0, 1, 1, 0, 1, "127.0.0.1")]
    assert "not in an srun step" in report["notes"][0]


def _allreduce_results(out: Path) -> list[dict[str, float]]:
    results = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return sorted(results, key=lambda result: result["rank"])


def test_exec_runs_a_plain_env_script_under_mpirun(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    tiers.require_commands("mpirun")
    _run(
        [
            *MPIRUN,
            "-np",
            "2",
            "trainbox",
            "exec",
            "--",
            sys.executable,
            str(ALLREDUCE),
            str(tmp_path),
        ],
        clean_env,
    )
    assert _allreduce_results(tmp_path) == [
        {"rank": r, "world_size": 2, "local_rank": r, "sum": 3.0} for r in range(2)
    ]


def test_exec_runs_a_plain_env_script_under_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    argv = [
        "srun",
        "-N2",
        "--ntasks-per-node=2",
        "trainbox",
        "exec",
        "--",
        sys.executable,
        str(ALLREDUCE),
        str(tmp_path),
    ]
    proc = slurm_cluster.run(argv)
    assert proc.returncode == 0, proc.stderr + slurm_cluster.diagnostics()
    assert _allreduce_results(tmp_path) == [
        {"rank": r, "world_size": 4, "local_rank": r % 2, "sum": 10.0} for r in range(4)
    ]


def test_exec_in_a_trainjob_pod_starts_one_worker_per_process_slot(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    # A TrainJob pod as the Trainer v2 torch plugin makes it (torch.go): PET_* only, no ranks.
    pod = clean_env | {
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
        "JOB_COMPLETION_INDEX": "0",
    }
    _run(["trainbox", "exec", "--", sys.executable, str(ALLREDUCE), str(tmp_path)], pod)
    assert _allreduce_results(tmp_path) == [
        {"rank": r, "world_size": 2, "local_rank": r, "sum": 3.0} for r in range(2)
    ]


def test_exec_single_process(tmp_path: Path, clean_env: dict[str, str]) -> None:
    _run(["trainbox", "exec", "--", sys.executable, str(ALLREDUCE), str(tmp_path)], clean_env)
    assert _allreduce_results(tmp_path) == [
        {"rank": 0, "world_size": 1, "local_rank": 0, "sum": 1.0}
    ]
