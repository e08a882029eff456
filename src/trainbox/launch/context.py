"""LaunchContext: what the launcher told this process about its place in the job."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticNodes:
    """An elastic job's node range and rendezvous, which its node agent hands to torchrun."""

    # Fewest nodes the job trains with; below it torchrun waits for nodes.
    min_nodes: int
    # Most nodes it grows to.
    max_nodes: int
    # torchrun's rendezvous backend (c10d, etcd, etcd-v2).
    backend: str
    # host:port of the rendezvous.
    endpoint: str
    # The rendezvous id every node of the job shares ("": torchrun's default).
    run_id: str = ""
    # Extra rendezvous settings as `k1=v1,k2=v2` ("": none).
    conf: str = ""
    # Worker-group restarts the job spec allows (None: dist.max_restarts decides).
    max_restarts: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchContext:
    """This process's place in the job, normalised to torchrun's vocabulary."""

    # Launcher family, the value TRAINBOX_LAUNCHER accepts: torchrun|mpi|slurm|kubeflow|env|single.
    launcher: str
    # Which member of the family: e.g. openmpi, mpich, mvapich, pytorchjob, trainjob.
    flavor: str
    # Global rank; for a node agent (spawns_workers) the rank of its first worker.
    rank: int
    # Rank among the processes on this node; 0 for a node agent.
    local_rank: int
    # Number of worker processes in the whole job.
    world_size: int
    # Number of worker processes on this node.
    local_world_size: int
    # Index of this node, 0 ≤ node_rank < num_nodes.
    node_rank: int
    # Number of nodes in the job.
    num_nodes: int
    # Host that serves the TCPStore (it runs rank 0).
    master_addr: str
    # TCP port of that store.
    master_port: int
    # True when this process is one per node and must start local_world_size workers itself.
    spawns_workers: bool = False
    # Non-fatal observations worth a log line (stale variables ignored, assumptions made).
    notes: tuple[str, ...] = ()
    # LOCAL_RANK as the launcher set it where that is not local_rank (torchrun
    # --virtual-local-rank: 0 in every worker, the index of its one visible GPU); None: the same.
    launcher_local_rank: int | None = None
    # An elastic job (node agent only): torchrun's rendezvous, not this context, then sets the
    # node's rank and the world size, which stand here at their largest.
    elastic: ElasticNodes | None = None

    def to_env(self) -> dict[str, str]:
        """Torchrun-style variables that make `init_process_group("env://")` work for a worker."""
        return {
            "RANK": str(self.rank),
            # The script's device index: keep what the launcher said.
            "LOCAL_RANK": str(
                self.local_rank if self.launcher_local_rank is None else self.launcher_local_rank
            ),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.num_nodes),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def describe(self) -> dict[str, object]:
        """The context as plain JSON-able data (doctor output and log binding)."""
        return {
            "launcher": self.launcher,
            "flavor": self.flavor,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "spawns_workers": self.spawns_workers,
            "notes": list(self.notes),
            **({"elastic": asdict(self.elastic)} if self.elastic else {}),
        }
