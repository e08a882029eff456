"""`env://` variables exported by hand on each node (the multi-node recipe many projects use)."""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.launch import ports
from trainbox.launch.context import LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts

HINT = (
    "export RANK and WORLD_SIZE on every process, MASTER_ADDR/MASTER_PORT for more than one"
    " node, and LOCAL_RANK with LOCAL_WORLD_SIZE when a node runs several processes"
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """RANK and WORLD_SIZE set by someone other than a known launcher."""
    del host
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    read = EnvReader(env)
    for name, partner in (("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")):
        if partner not in env:
            read.check(False, f"{name}={env[name]!r} is set but {partner} is not")
            read.raise_if_problems(HINT)
    rank = read.required_int("RANK")
    world = read.required_int("WORLD_SIZE", minimum=1)
    read.below("RANK", rank, "WORLD_SIZE", world)
    master_addr = env.get("MASTER_ADDR", "")
    local_rank, local_world = _local(read, world, master_addr)
    node_rank = read.optional_int("GROUP_RANK") if "GROUP_RANK" in env else None
    if node_rank is None:
        node_rank = read.optional_int("NODE_RANK")
    if read.ok("WORLD_SIZE", "LOCAL_WORLD_SIZE") and local_world:
        read.check(
            world % local_world == 0,
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}",
        )
    num_nodes = max(1, world // local_world) if local_world else 1
    if not master_addr:
        read.check(
            num_nodes == 1,
            f"WORLD_SIZE={world} spans {num_nodes} nodes but MASTER_ADDR is not set",
        )
        master_addr = "127.0.0.1"
    port = read.port("MASTER_PORT") if "MASTER_PORT" in env else ports.DEFAULT_PORT
    read.raise_if_problems(HINT)
    notes = () if "MASTER_PORT" in env else (f"MASTER_PORT not set, using {port}",)
    return LaunchContext(
        launcher="env",
        flavor="manual",
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank if node_rank is not None else rank // local_world,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=port,
        notes=notes,
    )


def _local(read: EnvReader, world: int, master_addr: str) -> tuple[int, int]:
    if "LOCAL_RANK" not in read.env:
        # No local rank at all: the recipe is one process per node.
        return 0, 1
    local_rank = read.required_int("LOCAL_RANK")
    if "LOCAL_WORLD_SIZE" in read.env:
        local_world = read.required_int("LOCAL_WORLD_SIZE", minimum=1)
    elif master_addr in LOOPBACK or not master_addr:
        # A loopback master means every process is on this one node.
        local_world = world
    else:
        read.check(
            False,
            f"LOCAL_RANK={read.env['LOCAL_RANK']!r} is set but LOCAL_WORLD_SIZE is not, so the"
            " processes per node are unknown",
        )
        return 0, 1
    read.below("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    if read.ok("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        read.check(
            local_world <= world,
            f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}",
        )
    return local_rank, local_world or 1
