"""torchrun / TorchElastic workers: the agent already wrote torchrun's variables for us."""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.launch.context import LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts

HINT = "torchrun sets these for every worker; do not override them in the worker's environment"


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """A worker started by torchrun, recognised by TORCHELASTIC_RUN_ID as torch itself does."""
    del host  # torchrun has already resolved every count
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    read = EnvReader(env)
    rank = read.int("RANK")
    local_rank = read.int("LOCAL_RANK")
    world = read.int("WORLD_SIZE", minimum=1)
    local_world = read.int("LOCAL_WORLD_SIZE", minimum=1)
    group_rank = read.int("GROUP_RANK")
    group_world = read.optional_int("GROUP_WORLD_SIZE", minimum=1)
    port = read.port("MASTER_PORT")
    read.check(bool(env.get("MASTER_ADDR")), "MASTER_ADDR is not set")
    read.below("RANK", rank, "WORLD_SIZE", world)
    read.below("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    read.raise_if_problems(HINT)
    return LaunchContext(
        launcher="torchrun",
        flavor="torchelastic",
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=group_rank,
        num_nodes=group_world or max(1, world // local_world),
        master_addr=env["MASTER_ADDR"],
        master_port=port,
        notes=_stale_launcher_notes(env),
    )


def _stale_launcher_notes(env: Mapping[str, str]) -> tuple[str, ...]:
    # torchrun under srun or mpirun leaves the outer launcher's variables describing the agents.
    outer = [
        prefix
        for prefix, marker in (
            ("SLURM_*", "SLURM_PROCID"),
            ("OMPI_COMM_WORLD_*", "OMPI_COMM_WORLD_RANK"),
        )
        if marker in env
    ]
    if not outer:
        return ()
    return (f"ignoring {', '.join(outer)}: they describe the torchrun agents, not this worker",)
