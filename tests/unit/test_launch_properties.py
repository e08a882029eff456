"""Over random environments, detection gives a consistent context or raises LaunchError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.errors import LaunchError
from trainbox.launch import HostFacts, detect

NAMES = [
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TRAINBOX_LAUNCHER",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "PMI_LOCAL_RANK",
    "PMI_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_RESV_PORTS",
    "SLURM_HOSTFILE",
    "SLURM_DISTRIBUTION",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_RDZV_ENDPOINT",
]

# Values that look like what launchers write, plus junk and edge values.
VALUES = st.one_of(
    st.integers(min_value=-3, max_value=12).map(str),
    st.sampled_from(
        [
            "",
            "auto",
            "gpu",
            "cpu",
            "4294967291",
            "70000",
            "1:4",
            "2(x2)",
            "4(x2),3",
            "n[1-2]",
            "gpu[01-04,07],cpu3",
            "rack[1-2]-node[01-04]",
            "n[",
            "x]",
            "arbitrary",
            "slurm",
            "mpi",
            "single",
            "torchrun",
            "kubeflow",
            "env",
            "nope",
            "12000-12003",
        ]
    ),
    st.text(max_size=6),
)


@settings(max_examples=1500, deadline=None)
@given(
    env=st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=14),
    gpus=st.integers(min_value=0, max_value=8),
    hostfile_head=st.one_of(st.none(), st.just("h1")),
)
def test_detect_returns_a_consistent_context_or_raises_launch_error(
    env: dict[str, str], gpus: int, hostfile_head: str | None
) -> None:
    try:
        context = detect(env, HostFacts(visible_gpus=gpus, slurm_hostfile_head=hostfile_head))
    except LaunchError as err:
        error = err
    else:
        error = None
    if error is not None:
        assert error.problems
        assert error.hint
        return
    assert 0 <= context.rank < context.world_size
    assert 0 <= context.local_rank < context.local_world_size <= context.world_size
    assert 0 <= context.node_rank < context.num_nodes
    assert context.master_addr
    assert 0 <= context.master_port < 65536
    assert all(isinstance(value, str) for value in context.to_env().values())
