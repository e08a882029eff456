"""A detected context handed on: to the workers this process starts in node mode (`promote`),
or to a command behind `trainbox exec` (`exported`)."""

from __future__ import annotations

from dataclasses import replace

from trainbox.launch import ports
from trainbox.launch.context import LaunchContext


def exported(context: LaunchContext) -> LaunchContext:
    """The context to hand a child process: a lone process gets a real MASTER_PORT.

    Inside trainbox a single process's store binds port 0 and picks its own, but a command
    behind `trainbox exec` reads MASTER_PORT itself, and 0 is no port to env:// or to trainbox's
    own detection in that child (it sees RANK/WORLD_SIZE and expects a port).
    """
    if context.launcher != "single" or context.master_port:
        return context
    return replace(context, master_port=ports.free_port(context.master_addr))


def promote(
    context: LaunchContext, *, procs_per_node: int | str, visible_gpus: int
) -> LaunchContext:
    """This process as its node's agent for `procs_per_node` workers, or unchanged.

    Only a lone process per node is promoted (srun --ntasks-per-node=1, a pod, mpirun with one
    rank per node, `docker run`); torchrun workers and per-GPU launches stay as they are, and a
    Kubeflow pod's own nprocPerNode has already been applied by detection.
    """
    if context.launcher == "torchrun" or context.spawns_workers or context.local_world_size != 1:
        return context
    # `auto`: one worker per visible GPU; a CPU-only node keeps its one process.
    wanted = procs_per_node if isinstance(procs_per_node, int) else max(1, visible_gpus)
    if wanted <= 1:
        return context
    note = f"node mode: this process starts {wanted} workers per node under torchrun"
    return replace(
        context,
        rank=context.node_rank * wanted,
        local_rank=0,
        world_size=context.num_nodes * wanted,
        local_world_size=wanted,
        spawns_workers=True,
        notes=(*context.notes, note),
    )
