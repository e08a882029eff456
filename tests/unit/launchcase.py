"""Helpers for table-driven launch tests: a context reduced to the fields a table names."""

from __future__ import annotations

from trainbox.launch import LaunchContext

FIELDS = (
    "launcher",
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
    "spawns_workers",
)


def topology(context: LaunchContext) -> dict[str, object]:
    """The fields every launcher must get right."""
    described = context.describe()
    return {name: described[name] for name in FIELDS}


def expect(
    launcher: str,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
    master_addr: str,
    master_port: int,
    *,
    spawns_workers: bool = False,
) -> dict[str, object]:
    """Expected topology, positional in the order of the table columns."""
    return dict(
        zip(
            FIELDS,
            (
                launcher,
                rank,
                local_rank,
                world_size,
                local_world_size,
                node_rank,
                num_nodes,
                master_addr,
                master_port,
                spawns_workers,
            ),
            strict=True,
        )
    )
