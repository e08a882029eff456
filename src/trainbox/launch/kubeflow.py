"""Kubeflow pods: training-operator v1 PyTorchJob and Trainer v2 TrainJob (a pod is a node).

What the operators inject (the unit tests' Kubeflow tables cite the operators' source for each):
- PyTorchJob v1.7+: RANK = pod index, WORLD_SIZE = pods * nprocPerNode (non-integers count as 1),
  MASTER_ADDR/PORT, and PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT.
- PyTorchJob with elasticPolicy: PET_NNODES = "MIN:MAX", PET_RDZV_BACKEND, PET_RDZV_ENDPOINT,
  and PET_MAX_RESTARTS, PET_RDZV_ID, PET_RDZV_CONF when the policy sets them.
- TrainJob: only PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.launch.context import ElasticNodes, LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts

ELASTIC_HINT = (
    "the training operator sets PET_NNODES and PET_RDZV_* from spec.elasticPolicy: fix"
    " minReplicas/maxReplicas and rdzvHost/rdzvPort there, not in the pod's env"
)
# Rendezvous backends the operator's elasticPolicy accepts.
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
# Values of nprocPerNode that name a device kind instead of a number.
SYMBOLIC_NPROC = ("auto", "gpu", "cpu")


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """A PyTorchJob or TrainJob pod, recognised by the PET_* variables the operators add."""
    if not any(name in env for name in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")):
        return None
    read = EnvReader(env)
    if "PET_RDZV_ENDPOINT" in env or ":" in env.get("PET_NNODES", ""):
        return _elastic(read, host)
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


def _elastic(read: EnvReader, host: HostFacts) -> LaunchContext:
    """An elasticPolicy pod: torchrun's rendezvous places it, so it is always its node's agent."""
    env = read.env
    low, high = _node_range(read)
    endpoint = env.get("PET_RDZV_ENDPOINT", "")
    addr, _, port = endpoint.rpartition(":")
    read.check(
        bool(addr) and port.isascii() and port.isdigit() and 0 < int(port) < 65536,
        f"PET_RDZV_ENDPOINT={endpoint!r} is not host:port",
    )
    backend = env.get("PET_RDZV_BACKEND", "c10d")
    read.check(
        backend in RDZV_BACKENDS,
        f"PET_RDZV_BACKEND={backend!r} is not one of {', '.join(RDZV_BACKENDS)}",
    )
    restarts = read.optional_int("PET_MAX_RESTARTS")
    nproc = _procs_per_node(read, host)
    read.raise_if_problems(ELASTIC_HINT)
    note = (
        f"elastic PyTorchJob: {low} to {high} nodes; torchrun's {backend} rendezvous at"
        f" {endpoint} sets each node's rank and the world size"
    )
    return LaunchContext(
        launcher="kubeflow",
        flavor="pytorchjob",
        rank=0,
        local_rank=0,
        world_size=high * nproc,
        local_world_size=nproc,
        node_rank=0,
        num_nodes=high,
        master_addr=addr,
        master_port=int(port),
        spawns_workers=True,
        notes=(note, *_notes(env, nproc)),
        elastic=ElasticNodes(
            min_nodes=low,
            max_nodes=high,
            backend=backend,
            endpoint=endpoint,
            run_id=env.get("PET_RDZV_ID", ""),
            conf=env.get("PET_RDZV_CONF", ""),
            max_restarts=restarts,
        ),
    )


def _node_range(read: EnvReader) -> tuple[int, int]:
    """PET_NNODES as `MIN:MAX` (a lone N means N:N), with 1 <= MIN <= MAX."""
    raw = read.env.get("PET_NNODES", "")
    low, sep, high = (part.strip() for part in raw.partition(":"))
    bounds = (low, high if sep else low)
    if all(text.isascii() and text.isdigit() for text in bounds):
        first, last = int(bounds[0]), int(bounds[1])
        if 1 <= first <= last:
            return first, last
    read.check(False, f"PET_NNODES={raw!r} is not MIN:MAX nodes with 1 <= MIN <= MAX")
    return 1, 1


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
