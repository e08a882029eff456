"""A MASTER_PORT that another program holds on the master's host, under a real srun step.

Rank 0 (the store's host) fails preflight naming host and port; rank 1, which finds a stranger
at that address, ends within dist.timeout_s naming the master: without srun's
--kill-on-bad-exit, nothing else would stop it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TIMEOUT_S = 5
# Job start, process start and the import, on top of the timeout itself.
MARGIN_S = 40


def test_a_busy_master_port_ends_every_rank_with_a_line(
    slurm_cluster: SlurmCluster, tmp_path: Path, busy_port: int
) -> None:
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    name = f"busy-port-{tmp_path.name}"
    argv = ["srun", "-N2", "--ntasks-per-node=1", f"--job-name={name}"]
    argv += [f"--error={tmp_path}/task-%t.err", "trainbox", "exec", f"dist.timeout_s={TIMEOUT_S}"]
    started = time.monotonic()
    proc = slurm_cluster.run(
        [*argv, "--", *command], env={"MASTER_PORT": str(busy_port)}, timeout=120
    )
    elapsed = time.monotonic() - started
    slurm_cluster.wait_gone(name)
    rank0 = (tmp_path / "task-0.err").read_text().splitlines()[-1]
    rank1 = (tmp_path / "task-1.err").read_text().splitlines()[-1]
    assert "task 0: Exited with exit code 3" in proc.stderr, proc.stderr[-3000:]
    assert "task 1: Exited with exit code 4" in proc.stderr, proc.stderr[-3000:]
    assert f"MASTER_PORT {busy_port} is taken on rank 0's host" in rank0
    assert f"n1:{busy_port}" in rank0
    assert "HINT:" in rank0
    assert f"rank 1 could not reach the master at n1:{busy_port} within {TIMEOUT_S} s" in rank1
    assert not marker.exists()
    assert elapsed < TIMEOUT_S + MARGIN_S
