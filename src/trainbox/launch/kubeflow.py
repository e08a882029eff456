"""Kubeflow pods: training-operator v1 PyTorchJob and Trainer v2 TrainJob (a pod is a node).

What the operators inject (the unit tests' Kubeflow tables cite the operators' source for each):
- PyTorchJob v1.7+: RANK = pod index, WORLD_SIZE = pods * nprocPerNode (non-integers count as 1),
  MASTER_ADDR/PORT, and PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT.
- TrainJob: only PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.launch.context import LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts

# Values of nprocPerNode that name a device kind instead of a number.
SYMBOLIC_NPROC = ("auto", "gpu", "cpu")


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """A PyTorchJob or TrainJob pod, recognised by the PET_* variables the operators add."""
    if not any(name in env for name in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")):
        return None
    read = EnvReader(env)
    if "PET_RDZV_ENDPOINT" in env or ":" in env.get("PET_NNODES", ""):
        read.check(
            False,
            f"elastic PyTorchJob (PET_RDZV_ENDPOINT={env.get('PET_RDZV_ENDPOINT')!r},"
            f" PET_NNODES={env.get('PET_NNODES')!r}) has no fixed node rank",
        )
        read.raise_if_problems("drop elasticPolicy, or make the container command `torchrun ...`")
    flavor = "pytorchjob" if "MASTER_ADDR" in env or "RANK" in env else "trainjob"
    addr_name = "MASTER_ADDR" if flavor == "pytorchjob" else "PET_MASTER_ADDR"
    port_name = "MASTER_PORT" if flavor == "pytorchjob" else "PET_MASTER_PORT"
    num_nodes = read.required_int("PET_NNODES", minimum=1)
    node_rank = read.required_int("PET_NODE_RANK")
    read.below("PET_NODE_RANK", node_rank, "PET_NNODES", num_nodes)
    master_addr = env.get(addr_name) or env.get("PET_MASTER_ADDR", "")
    read.check(
        bool(master_addr),
        f"Kubeflow pod (PET_NNODES={env.get('PET_NNODES')!r}) but neither MASTER_ADDR nor"
        " PET_MASTER_ADDR is set",
    )
    port = read.port(port_name if port_name in env else "PET_MASTER_PORT")
    nproc = _procs_per_node(read, host)
    if flavor == "pytorchjob":
        _check_pytorchjob(read, num_nodes=num_nodes, node_rank=node_rank, nproc=nproc)
    read.raise_if_problems(
        "give the PyTorchJob a Master replica (replicas: 1) so the operator sets the master"
        " address, and do not override RANK/WORLD_SIZE/PET_* in the pod spec"
    )
    return LaunchContext(
        launcher="kubeflow",
        flavor=flavor,
        rank=node_rank * nproc,
        local_rank=0,
        world_size=num_nodes * nproc,
        local_world_size=nproc,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=port,
        spawns_workers=nproc > 1,
        notes=_notes(env, nproc),
    )


def _procs_per_node(read: EnvReader, host: HostFacts) -> int:
    raw = read.env.get("PET_NPROC_PER_NODE", "auto").strip()
    if raw in ("auto", "gpu"):
        # torchrun's `auto` is one per GPU; with no GPU we run one process that owns all CPUs.
        return max(1, host.visible_gpus)
    if raw == "cpu":
        return 1
    value = read.required_int("PET_NPROC_PER_NODE", minimum=1)
    return value or 1


def _check_pytorchjob(read: EnvReader, *, num_nodes: int, node_rank: int, nproc: int) -> None:
    # The operator counts a symbolic nprocPerNode as 1 in WORLD_SIZE (envvar.go).
    symbolic = read.env.get("PET_NPROC_PER_NODE", "auto").strip() in SYMBOLIC_NPROC
    per_pod = 1 if symbolic else nproc
    rank = read.required_int("RANK")
    world = read.required_int("WORLD_SIZE", minimum=1)
    if read.ok("RANK", "PET_NODE_RANK"):
        read.check(rank == node_rank, f"RANK={rank} differs from PET_NODE_RANK={node_rank}")
    if read.ok("WORLD_SIZE", "PET_NNODES", "PET_NPROC_PER_NODE"):
        read.check(
            world == num_nodes * per_pod,
            f"WORLD_SIZE={world} is not PET_NNODES={num_nodes} * nprocPerNode={per_pod}",
        )


def _notes(env: Mapping[str, str], nproc: int) -> tuple[str, ...]:
    raw = env.get("PET_NPROC_PER_NODE", "auto").strip()
    if raw in SYMBOLIC_NPROC:
        return (f"PET_NPROC_PER_NODE={raw!r} resolved to {nproc} process(es) per pod",)
    return ()
