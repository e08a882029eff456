"""Hypothesis strategies for launch environments: every launcher's variables, real and junk values.

Shared by the detection property test and the CLI property test.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st

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

# A launch environment: any subset of the launchers' variables with any of those values.
ENVIRONMENTS = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=14)

_CAPTURED = Path(__file__).parent / "unit" / "envs"
# Every process of every environment captured from the real launchers (tests/unit/envs).
REAL_PROCESSES = [
    process
    for path in sorted(_CAPTURED.glob("*.json"))
    for process in json.loads(path.read_text())["processes"]
]


@st.composite
def near_real_environments(draw: st.DrawFn) -> dict[str, str]:
    """A real launcher's environment with up to three variables changed or removed."""
    env = dict(draw(st.sampled_from(REAL_PROCESSES)))
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=3)):
        value = draw(st.one_of(st.none(), VALUES))
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
