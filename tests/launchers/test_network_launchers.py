"""`trainbox doctor --network` under real mpirun and srun: the ring each launcher's layout gives."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any

import pytest

import tiers
from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

# Small and forgiving: this box's CPUs are shared, and these tests prove the path each launcher
# takes to the verdict; tests/container proves a slowed node is found and named.
NETWORK = [
    sys.executable, "-m", "trainbox", "doctor", "--network", "--json",
    "--network-max-bytes", "16K", "--network-min-fraction", "0.001",
]  # fmt: skip
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def _only_rank_0_printed(stdout: str) -> dict[str, Any]:
    (line,) = stdout.splitlines()
    found: dict[str, Any] = json.loads(line)
    return found


def _links(found: dict[str, Any]) -> list[tuple[int, int, int]]:
    return sorted((k["lane"], k["source"], k["target"]) for k in found["links"])


def test_three_mpi_ranks_on_one_node_form_a_ring_of_ranks(clean_env: dict[str, str]) -> None:
    tiers.require_commands("mpirun")
    proc = subprocess.run(
        [*MPIRUN, "-np", "3", *NETWORK], env=clean_env, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = _only_rank_0_printed(proc.stdout)
    assert [row["size"] for row in found["sweep"]] == [1024, 4096, 16384]
    assert found["ring"] == {"size": 3, "of": "ranks", "lanes": 1, "link_bytes": 16384}
    assert _links(found) == [(0, 0, 1), (0, 1, 2), (0, 2, 0)]
    assert found["verdict"]["ok"] is True


def test_two_slurm_nodes_form_one_ring_per_local_rank(
    slurm_cluster: SlurmCluster,
) -> None:
    proc = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", *NETWORK], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm_cluster.diagnostics()
    found = _only_rank_0_printed(proc.stdout)
    assert found["world_size"] == 4
    # Two nodes share one link per lane; local rank l of n1 pairs with local rank l of n2.
    assert found["ring"] == {"size": 2, "of": "nodes", "lanes": 2, "link_bytes": 16384}
    assert _links(found) == [(0, 0, 1), (1, 0, 1)]
    assert found["verdict"]["ok"] is True


def test_a_cyclic_slurm_layout_forms_one_ring_of_ranks(slurm_cluster: SlurmCluster) -> None:
    # `-m cyclic` deals ranks 0 and 2 to one node, 1 and 3 to the other: lanes of a node ring
    # would pair the wrong ranks, so every rank joins one ring and each link crosses nodes.
    proc = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=2", "-m", "cyclic", *NETWORK], timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm_cluster.diagnostics()
    found = _only_rank_0_printed(proc.stdout)
    assert found["ring"] == {"size": 4, "of": "ranks", "lanes": 1, "link_bytes": 16384}
    assert _links(found) == [(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 0)]
    # In a ring of ranks a slow link names ranks, with their hosts (one host name here: both
    # local Slurm nodes run on this machine).
    (first,) = [k for k in found["links"] if k["source"] == 0]
    assert (first["source_name"], first["target_name"]) == (
        f"rank 0 on {socket.gethostname()}",
        f"rank 1 on {socket.gethostname()}",
    )
    assert found["verdict"]["ok"] is True
