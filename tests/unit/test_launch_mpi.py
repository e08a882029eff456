"""MPI ranks from each implementation's variables; MPI before Slurm; node rank when derivable."""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import detect, ports

from launchcase import expect, topology


def openmpi(rank: int, local: int, size: int, local_size: int, **extra: str) -> dict[str, str]:
    """Variables Open MPI's mpirun gives one rank (names from the Open MPI 5 docs)."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        # Not a node index: the rank among all jobs' processes on this node.
        "OMPI_COMM_WORLD_NODE_RANK": "7",
        "PMIX_NAMESPACE": "1303642113",
        **extra,
    }


NAMESPACE_PORT = ports.derived_port("PMIX_NAMESPACE", "1303642113")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (openmpi(1, 1, 2, 2), expect("mpi", 1, 1, 2, 2, 0, 1, "127.0.0.1", NAMESPACE_PORT)),
        (
            openmpi(5, 1, 8, 4, MASTER_ADDR="h0", MASTER_PORT="4000"),
            expect("mpi", 5, 1, 8, 4, 1, 2, "h0", 4000),
        ),
        # MPICH / Intel MPI (Hydra).
        (
            {
                "PMI_RANK": "3",
                "PMI_SIZE": "4",
                "MPI_LOCALRANKID": "1",
                "MPI_LOCALNRANKS": "2",
                "MASTER_ADDR": "h0",
            },
            expect("mpi", 3, 1, 4, 2, 1, 2, "h0", ports.DEFAULT_PORT),
        ),
        # Cray PMI.
        (
            {
                "PMI_RANK": "2",
                "PMI_SIZE": "4",
                "PMI_LOCAL_RANK": "0",
                "PMI_LOCAL_SIZE": "2",
                "MASTER_ADDR": "h0",
            },
            expect("mpi", 2, 0, 4, 2, 1, 2, "h0", ports.DEFAULT_PORT),
        ),
        # MVAPICH2 and MVAPICH 3.
        (
            {
                "MV2_COMM_WORLD_RANK": "1",
                "MV2_COMM_WORLD_SIZE": "2",
                "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "2",
            },
            expect("mpi", 1, 1, 2, 2, 0, 1, "127.0.0.1", 29500),
        ),
        (
            {
                "MVP_COMM_WORLD_RANK": "0",
                "MVP_COMM_WORLD_SIZE": "1",
                "MVP_COMM_WORLD_LOCAL_RANK": "0",
                "MVP_COMM_WORLD_LOCAL_SIZE": "1",
            },
            expect("mpi", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500),
        ),
    ],
    ids=[
        "openmpi-one-node",
        "openmpi-two-nodes",
        "mpich-hydra",
        "cray-pmi",
        "mvapich2",
        "mvapich3",
    ],
)
def test_mpi_vocabularies(env: dict[str, str], expected: dict[str, object]) -> None:
    assert topology(detect(env)) == expected


def test_flavor_names_the_implementation() -> None:
    assert detect(openmpi(0, 0, 1, 1)).flavor == "openmpi"


def test_mpirun_inside_sbatch_ignores_the_batch_shells_slurm_variables() -> None:
    # The batch shell is task 0 of the batch step; mpirun's ranks inherit its SLURM_PROCID=0.
    stale = {
        "SLURM_JOB_ID": "99",
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "n[1-2]",
    }
    context = detect(openmpi(3, 1, 4, 2, MASTER_ADDR="n1", **stale))
    assert topology(context) == expect("mpi", 3, 1, 4, 2, 1, 2, "n1", NAMESPACE_PORT)


def test_mpirun_whose_daemons_run_in_an_srun_step_is_still_mpi() -> None:
    # Open MPI may start its per-node daemons with srun: ranks then see that step's variables.
    daemon_step = {
        "SLURM_JOB_ID": "99",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": "n[1-2]",
    }
    assert detect(openmpi(3, 1, 4, 2, MASTER_ADDR="n1", **daemon_step)).launcher == "mpi"


def test_ompi_mca_alone_is_not_a_rank() -> None:
    # Kubeflow's MPI runtime sets OMPI_MCA_* in its sshd pods, which are not ranks.
    assert detect({"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile"}).launcher == "single"


def test_pmi_variables_without_a_matching_srun_step_are_mpi() -> None:
    env = {
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "SLURM_JOB_ID": "5",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
    }
    assert detect(env).launcher == "mpi"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            openmpi(2, 0, 4, 2),
            r"multi-node MPI job \(OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_SIZE=2\)"
            " but MASTER_ADDR is not set",
        ),
        (
            openmpi(4, 0, 5, 2, MASTER_ADDR="h"),
            "OMPI_COMM_WORLD_SIZE=5 is not a multiple of OMPI_COMM_WORLD_LOCAL_SIZE=2",
        ),
        # `--map-by node`: rank 1 is local rank 0 on the second node.
        (openmpi(1, 0, 4, 2, MASTER_ADDR="h"), "ranks are not placed consecutively per node"),
        (openmpi(2, 0, 2, 1), "OMPI_COMM_WORLD_RANK=2 must be less than OMPI_COMM_WORLD_SIZE=2"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, "MPI_LOCALRANKID is not set"),
        ({"OMPI_COMM_WORLD_SIZE": "two"}, "OMPI_COMM_WORLD_SIZE='two' is not an integer"),
    ],
    ids=["no-master", "uneven", "map-by-node", "rank-too-big", "pmi-without-local", "non-numeric"],
)
def test_bad_mpi_environments(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect(env)


def test_missing_master_hint_names_the_export_flag() -> None:
    with pytest.raises(LaunchError) as caught:
        detect(openmpi(2, 0, 4, 2))
    assert "mpirun -x MASTER_ADDR" in caught.value.hint
