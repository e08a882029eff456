"""Helpers for launch tests: the fields a context must get right, and an srun task's variables."""

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
# The fields that do not depend on which port a launcher happened to pick.
PLACE = FIELDS[:8]


def topology(context: LaunchContext) -> dict[str, object]:
    """The fields every launcher must get right."""
    described = context.describe()
    return {name: described[name] for name in FIELDS}


def place(report: dict[str, object]) -> tuple[object, ...]:
    """A context's or doctor report's PLACE fields as a row."""
    return tuple(report[name] for name in PLACE)


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
    values = (launcher, rank, local_rank, world_size, local_world_size, node_rank, num_nodes,
              master_addr, master_port, spawns_workers)  # fmt: skip
    return dict(zip(FIELDS, values, strict=True))


def srun_task(
    *,
    procid: int,
    localid: int,
    nodeid: int,
    tasks: int,
    nodes: int,
    tasks_per_node: str,
    nodelist: str,
    job: str = "9",
    step: str = "0",
) -> dict[str, str]:
    """The step variables srun gives one task (names as in tests/unit/envs/srun_*.json)."""
    return {
        "SLURM_JOB_ID": job, "SLURM_STEP_ID": step, "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_STEP_NODELIST": nodelist,
    }  # fmt: skip
