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
    rank = read.required_int("RANK")
    local_rank = read.required_int("LOCAL_RANK")
    world = read.required_int("WORLD_SIZE", minimum=1)
    local_world = read.required_int("LOCAL_WORLD_SIZE", minimum=1)
    group_rank = read.required_int("GROUP_RANK")
    group_world = read.optional_int("GROUP_WORLD_SIZE", minimum=1)
    port = read.port("MASTER_PORT")
    read.check(bool(env.get("MASTER_ADDR")), "MASTER_ADDR is not set")
    read.below("RANK", rank, "WORLD_SIZE", world)
    read.below("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    read.raise_if_problems(HINT)
    num_nodes = group_world or max(1, world // local_world)
    # Virtual mode also narrows CUDA_VISIBLE_DEVICES to this worker's one GPU.
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    one_gpu = bool(visible) and "," not in visible
    even = world == num_nodes * local_world
    place, notes = _place_on_node(
        rank, local_rank, local_world, group_rank, even=even, one_gpu=one_gpu
    )
    return LaunchContext(
        launcher="torchrun",
        flavor="torchelastic",
        rank=rank,
        local_rank=place,
        world_size=world,
        local_world_size=local_world,
        node_rank=group_rank,
        num_nodes=num_nodes,
        master_addr=env["MASTER_ADDR"],
        master_port=port,
        notes=(*_stale_launcher_notes(env), *notes),
        launcher_local_rank=None if place == local_rank else local_rank,
    )


def _place_on_node(
    rank: int, local_rank: int, local_world: int, node: int, *, even: bool, one_gpu: bool
) -> tuple[int, tuple[str, ...]]:
    """This worker's rank among its node's workers, and a note when it cannot be known.

    `torchrun --virtual-local-rank` sets LOCAL_RANK=0 in every worker. torchrun numbers a node's
    workers consecutively after the workers of the nodes before it, so on equal nodes the place
    is RANK - GROUP_RANK * LOCAL_WORLD_SIZE; the CPU plan needs it to keep workers apart.
    """
    if local_rank != 0 or local_world == 1:
        return local_rank, ()
    place = rank - node * local_world
    if even and 0 <= place < local_world:
        return place, ()
    if not one_gpu:
        return 0, ()
    return 0, (
        f"LOCAL_RANK=0 in one of {local_world} workers with one GPU each, on nodes of different"
        " sizes: under --virtual-local-rank its place on the node is unknown and its CPUs may"
        " overlap another worker's (set pinning.mode=node or off)",
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
