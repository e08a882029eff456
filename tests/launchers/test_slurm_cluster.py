"""The local two-node Slurm cluster starts, runs srun/sbatch steps, cancels, and tears down."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster, start_cluster

pytestmark = pytest.mark.slow

# Job steps must run the venv's python; srun/sbatch pass the caller's PATH on to them.
VENV_BIN = Path(sys.executable).parent


def _check(cluster: SlurmCluster, argv: list[str]) -> str:
    """Run a client command that must succeed; return its stdout."""
    proc = cluster.run(argv, timeout=60)
    assert proc.returncode == 0, (
        f"{argv} failed (rc={proc.returncode})\n{proc.stdout}{proc.stderr}\n"
        + cluster.diagnostics()
    )
    return proc.stdout


def test_srun_two_tasks_per_node_ranks_span_both_nodes(slurm_cluster: SlurmCluster) -> None:
    out = _check(
        slurm_cluster,
        [
            "srun",
            "-N2",
            "--ntasks-per-node=2",
            "--label",
            "printenv",
            "SLURM_PROCID",
            "SLURM_NODEID",
        ],
    )
    # --label prefixes "<task>: "; printenv prints the two values in argument order.
    values: dict[str, list[str]] = defaultdict(list)
    for line in out.splitlines():
        label, _, value = line.partition(":")
        values[label.strip()].append(value.strip())
    ranks = sorted(int(v[0]) for v in values.values())
    node_ids = {v[1] for v in values.values()}
    assert ranks == [0, 1, 2, 3], out
    assert node_ids == {"0", "1"}, out
    # Block distribution: ranks 0,1 on node 0 and 2,3 on node 1, like torchrun expects.
    assert all(int(v[0]) // 2 == int(v[1]) for v in values.values()), out


def test_srun_one_task_per_node_runs_venv_python(slurm_cluster: SlurmCluster) -> None:
    code = (
        "import os, socket, sys; "
        "print(os.environ['SLURM_NODEID'], os.environ['SLURMD_NODENAME'], "
        "socket.gethostbyname(os.environ['SLURMD_NODENAME']), sys.prefix)"
    )
    out = _check(slurm_cluster, ["srun", "-N2", "--ntasks-per-node=1", "python", "-c", code])
    rows = sorted(line.split() for line in out.splitlines())
    assert [row[:3] for row in rows] == [["0", "n1", "127.0.0.1"], ["1", "n2", "127.0.0.1"]], out
    assert {row[3] for row in rows} == {sys.prefix}, out


def test_sbatch_job_completes_and_writes_output(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=1\nset -euo pipefail\nsrun hostname\n",
        encoding="utf-8",
    )
    output = tmp_path / "job.out"
    job_id = slurm_cluster.sbatch(script, args=[f"--output={output}"])
    state = slurm_cluster.wait_job(job_id, timeout=60)
    assert state == "COMPLETED", slurm_cluster.diagnostics(job_id)
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2, lines


def test_scancel_cancels_running_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1 -n1\nsrun sleep 300\n", encoding="utf-8")
    job_id = slurm_cluster.sbatch(script, args=[f"--output={tmp_path / 'sleep.out'}"])
    slurm_cluster.wait_running(job_id, timeout=60)
    _check(slurm_cluster, ["scancel", str(job_id)])
    start = time.monotonic()
    assert slurm_cluster.wait_job(job_id, timeout=60) == "CANCELLED"
    # KillWait=2 in slurm.conf: the cancel should not take anywhere near Slurm's default 30s.
    assert time.monotonic() - start < 20


def test_second_cluster_starts_and_tears_down_cleanly(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Runs beside the session cluster: proves ports are not fixed and teardown is complete.
    for _ in range(2):
        with start_cluster(tmp_path_factory.mktemp("slurm2"), python_bin_dir=VENV_BIN) as other:
            assert other.conf != slurm_cluster.conf
            out = _check(other, ["srun", "-N2", "--ntasks-per-node=1", "printenv", "SLURM_NODEID"])
            assert sorted(out.split()) == ["0", "1"]
        assert _processes_using(other.conf) == [], "daemons or steps outlived the cluster"


def _processes_using(conf: Path) -> list[int]:
    """PIDs of live processes that run with SLURM_CONF=`conf` or name it on their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(conf).encode() in blob:
            found.append(int(entry.name))
    return found
