"""torchrun workers: read torchrun's own variables, ignore whatever launcher ran torchrun."""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import detect

from launchcase import expect, topology

WORKER = {
    "TORCHELASTIC_RUN_ID": "abc",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29400",
}
# torchrun started by `srun --ntasks-per-node=1`: SLURM_* describe the agent (one per node).
UNDER_SRUN = {
    **WORKER,
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NODELIST": "n[1-2]",
}
# torchrun started by mpirun: OMPI_COMM_WORLD_* describe the agent.
UNDER_MPIRUN = {
    **WORKER,
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
}
# torchrun inside a PyTorchJob pod (the Kubeflow docs' recommended command).
UNDER_KUBEFLOW = {**WORKER, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4"}


@pytest.mark.parametrize(
    "env",
    [WORKER, UNDER_SRUN, UNDER_MPIRUN, UNDER_KUBEFLOW],
    ids=["plain", "under-srun", "under-mpirun", "under-kubeflow"],
)
def test_torchrun_variables_win_over_the_outer_launcher(env: dict[str, str]) -> None:
    assert topology(detect(env)) == expect("torchrun", 5, 1, 8, 4, 1, 2, "node1", 29400)


def test_stale_outer_variables_are_noted() -> None:
    assert any("SLURM_*" in note for note in detect(UNDER_SRUN).notes)


def test_num_nodes_falls_back_to_world_over_local_world() -> None:
    env = {k: v for k, v in WORKER.items() if k != "GROUP_WORLD_SIZE"}
    assert detect(env).num_nodes == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RANK": "8"}, "RANK=8 must be less than WORLD_SIZE=8"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 must be less than LOCAL_WORLD_SIZE=4"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ],
)
def test_inconsistent_worker_variables_are_rejected(change: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect({**WORKER, **change})
