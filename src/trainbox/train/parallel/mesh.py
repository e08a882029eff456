"""The device mesh a sharded strategy trains on: fsdp's one dimension of every rank, or hsdp's
two, (replicate, shard): consecutive ranks form a shard group (the ranks of one node are
consecutive under torchrun and srun), and the groups replicate one another."""

from __future__ import annotations

from trainbox.config.schema import TrainConfig
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext

MESH_HINT = (
    "set train.shard_size to a divisor of the world size that divides the ranks per node or is"
    " a whole number of nodes (0: the ranks of one node), or use train.strategy=fsdp"
    " (docs/fsdp.md#hsdp-shard-within-a-node-replicate-across)"
)


def hsdp_mesh_shape(world_size: int, local_world_size: int, shard_size: int) -> tuple[int, int]:
    """(replicate, shard) for hsdp over `world_size` ranks, `local_world_size` per node, shard
    groups of `shard_size` ranks (0: one node's). One UsageError names every problem."""
    shard = shard_size or local_world_size
    where = f"train.shard_size={shard_size}" if shard_size else f"{shard} ranks per node"
    problems = []
    if shard < 1:
        problems.append(f"train.shard_size={shard_size}: a shard group needs at least one rank")
    else:
        if shard > world_size:
            problems.append(f"{where} is more than the world size of {world_size}")
        elif world_size % shard:
            problems.append(f"{where} does not divide the world size of {world_size}")
        if local_world_size % shard and shard % local_world_size:
            problems.append(
                f"{where} would span nodes of {local_world_size} ranks unevenly (neither divides"
                " the other)"
            )
    if problems:
        raise UsageError([f"train.strategy=hsdp: {text}" for text in problems], hint=MESH_HINT)
    return world_size // shard, shard


def mesh_shape(
    train: TrainConfig, *, world_size: int, local_world_size: int
) -> tuple[int, ...] | None:
    """The mesh `train.strategy` shards over: (world,) for fsdp, (replicate, shard) for hsdp,
    None for ddp (no mesh)."""
    if train.strategy == "hsdp":
        return hsdp_mesh_shape(world_size, local_world_size, train.shard_size)
    if train.strategy == "fsdp":
        return (world_size,)
    return None


def node_major(context: LaunchContext) -> bool:
    """Whether this rank sits where consecutive ranks per node put it (rank = node_rank *
    local_world_size + local_rank), so that hsdp's shard groups stay within nodes."""
    return context.rank == context.node_rank * context.local_world_size + context.local_rank
