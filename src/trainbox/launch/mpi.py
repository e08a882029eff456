"""Ranks started by mpirun/mpiexec, from each MPI's per-process variables (never starting MPI)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainbox.launch import ports, slurm
from trainbox.launch.context import LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts


@dataclass(frozen=True, kw_only=True, slots=True)
class Vocabulary:
    """The names one MPI implementation gives to rank, size, local rank and local size."""

    # Implementation name reported as the context's flavor.
    flavor: str
    # Global rank and world size.
    rank: str
    size: str
    # Local rank and number of ranks on this node; alternatives in order of preference.
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    # The flag that forwards MASTER_ADDR to every rank, for the hint.
    export_flag: str


# Order: the names unique to one implementation first. PMI_RANK/PMI_SIZE are shared by MPICH,
# Intel MPI, Cray PMI and Slurm's pmi2 plugin, so they come last and need a local-rank name.
VOCABULARIES = (
    Vocabulary(
        flavor="openmpi",
        rank="OMPI_COMM_WORLD_RANK",
        size="OMPI_COMM_WORLD_SIZE",
        local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
        local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
        export_flag="mpirun -x MASTER_ADDR=$(hostname)",
    ),
    Vocabulary(
        flavor="mvapich",
        rank="MV2_COMM_WORLD_RANK",
        size="MV2_COMM_WORLD_SIZE",
        local_rank=("MV2_COMM_WORLD_LOCAL_RANK",),
        local_size=("MV2_COMM_WORLD_LOCAL_SIZE",),
        export_flag="mpirun_rsh ... MASTER_ADDR=$(hostname)",
    ),
    Vocabulary(
        flavor="mvapich3",
        rank="MVP_COMM_WORLD_RANK",
        size="MVP_COMM_WORLD_SIZE",
        local_rank=("MVP_COMM_WORLD_LOCAL_RANK",),
        local_size=("MVP_COMM_WORLD_LOCAL_SIZE",),
        export_flag="mpiexec -genv MASTER_ADDR $(hostname)",
    ),
    Vocabulary(
        flavor="mpich",
        rank="PMI_RANK",
        size="PMI_SIZE",
        # Hydra (MPICH, Intel MPI) first, then Cray PMI / PALS.
        local_rank=("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PALS_LOCAL_RANKID"),
        local_size=("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE"),
        export_flag="mpiexec -genv MASTER_ADDR $(hostname)",
    ),
)

# Default ranks-per-node layout: mpirun places consecutive ranks on a node (by slot).
LAYOUT_HINT = "keep mpirun's default placement of consecutive ranks per node (no --map-by node)"


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """A rank started by an MPI launcher, or None (also for srun's pmi2 plugin: that is Slurm)."""
    del host
    vocab = next((v for v in VOCABULARIES if v.size in env), None)
    if vocab is None or _is_srun_pmi(env, vocab):
        return None
    read = EnvReader(env)
    rank = read.required_int(vocab.rank)
    world = read.required_int(vocab.size, minimum=1)
    local_rank_name = read.first_set(*vocab.local_rank) or vocab.local_rank[0]
    local_size_name = read.first_set(*vocab.local_size) or vocab.local_size[0]
    local_rank = read.required_int(local_rank_name)
    local_world = read.required_int(local_size_name, minimum=1)
    read.below(vocab.rank, rank, vocab.size, world)
    read.below(local_rank_name, local_rank, local_size_name, local_world)
    names = (vocab.rank, vocab.size, local_rank_name, local_size_name)
    if read.ok(*names):
        # MPI names no node index; it is rank // local size only for uniform block placement.
        read.check(
            world % local_world == 0,
            f"{vocab.size}={world} is not a multiple of {local_size_name}={local_world}, so the"
            " node index cannot be derived",
        )
        read.check(
            rank % local_world == local_rank,
            f"{vocab.rank}={rank} with {local_rank_name}={local_rank} and {local_size_name}="
            f"{local_world} means ranks are not placed consecutively per node",
        )
    read.raise_if_problems(f"start the same number of ranks on every node and {LAYOUT_HINT}")
    num_nodes = world // local_world
    master_addr = env.get("MASTER_ADDR") or ("127.0.0.1" if num_nodes == 1 else "")
    read.check(
        bool(master_addr),
        f"multi-node MPI job ({vocab.size}={world}, {local_size_name}={local_world}) but"
        " MASTER_ADDR is not set",
    )
    port = read.port("MASTER_PORT") if "MASTER_PORT" in env else _derived_port(env)
    read.raise_if_problems(
        f"MPI does not say which host runs rank 0; export it to every rank: {vocab.export_flag}"
    )
    return LaunchContext(
        launcher="mpi",
        flavor=vocab.flavor,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=rank // local_world,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=port,
    )


def _is_srun_pmi(env: Mapping[str, str], vocab: Vocabulary) -> bool:
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE in every task; when they match the step it is srun.
    return (
        vocab.flavor == "mpich"
        and slurm.step_id(env) is not None
        and env.get("PMI_RANK") == env.get("SLURM_PROCID")
        and env.get("PMI_SIZE") == env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS"))
    )


def _derived_port(env: Mapping[str, str]) -> int:
    # Every rank of one mpirun sees the same job identity: Open MPI's PMIx namespace, or the
    # Slurm job it runs in. Without one, torch's default port.
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"):
        if env.get(name):
            return ports.derived_port(name, env[name])
    return ports.DEFAULT_PORT
