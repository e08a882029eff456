"""torchrun workers: read torchrun's own variables, ignore whatever launcher ran torchrun."""

from __future__ import annotations

import pytest

from trainbox.affinity import CpuFacts, plan
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


# `torchrun --nnodes 2 --nproc-per-node 4 --virtual-local-rank`: LOCAL_RANK=0 in every worker.
def virtual_worker(rank: int, **change: str) -> dict[str, str]:
    """Worker `rank` of a 2x4 virtual-local-rank job; its node is rank // 4."""
    return WORKER | {
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "GROUP_RANK": str(rank // 4),
        "CUDA_VISIBLE_DEVICES": str(rank % 4),
    } | change  # fmt: skip


def test_virtual_local_rank_workers_get_their_place_on_the_node() -> None:
    assert [detect(virtual_worker(rank)).local_rank for rank in range(8)] == [0, 1, 2, 3] * 2


def test_virtual_local_rank_workers_keep_local_rank_0_for_their_scripts() -> None:
    # Each worker sees one GPU, as cuda:0: a script's LOCAL_RANK must stay the device index.
    assert {detect(virtual_worker(rank)).to_env()["LOCAL_RANK"] for rank in range(8)} == {"0"}


def test_virtual_local_rank_workers_get_disjoint_cpus() -> None:
    node = frozenset(range(8))
    facts = CpuFacts(affinity=node, online=node)
    contexts = [detect(virtual_worker(rank)) for rank in range(4)]
    pinned = [
        plan(facts, local_rank=c.local_rank, local_world_size=c.local_world_size, gpu_cpus=[])
        for c in contexts
    ]
    assert [p.cpus for p in pinned] == [frozenset({i, i + 1}) for i in range(0, 8, 2)]


def test_virtual_local_rank_on_nodes_of_different_sizes_is_noted() -> None:
    # 3 workers here, 5 on the other node: RANK no longer tells the place on this node.
    env = virtual_worker(4, WORLD_SIZE="8", LOCAL_WORLD_SIZE="3")
    context = detect(env)
    assert context.local_rank == 0
    assert any("--virtual-local-rank" in note for note in context.notes)
