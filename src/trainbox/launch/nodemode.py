"""Node mode: a launcher that starts one process per node, when the job wants more workers."""

from __future__ import annotations

import dataclasses

from trainbox.launch.context import LaunchContext


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
    return dataclasses.replace(
        context,
        rank=context.node_rank * wanted,
        local_rank=0,
        world_size=context.num_nodes * wanted,
        local_world_size=wanted,
        spawns_workers=True,
        notes=(*context.notes, note),
    )
