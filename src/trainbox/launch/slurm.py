"""A task of an `srun` step; never the sbatch batch shell, which also carries SLURM_PROCID=0."""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.launch import hostlist, ports
from trainbox.launch.context import LaunchContext
from trainbox.launch.envvars import EnvReader
from trainbox.launch.facts import HostFacts

# Slurm's special step ids (slurm.h): pending 0xfffffffd, extern 0xfffffffc, batch 0xfffffffb,
# interactive 0xfffffffa and below. Real srun steps count up from 0, far below these.
FIRST_SPECIAL_STEP_ID = 0xFFFFFFF0

HINT = "start ranks with srun inside the allocation; if these variables are stale, unset them"


def step_id(env: Mapping[str, str]) -> int | None:
    """The srun step id, or None outside a real task step (batch shell, salloc, extern step)."""
    raw = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    # isascii: str.isdigit() also accepts "²" and other scripts' digits, which int() refuses.
    if raw is None or not (raw.isascii() and raw.isdigit()) or int(raw) >= FIRST_SPECIAL_STEP_ID:
        return None
    return int(raw)


def detect(env: Mapping[str, str], host: HostFacts) -> LaunchContext | None:
    """A task of an srun step, read from the step-scoped variables (never the job-scoped ones)."""
    step = step_id(env)
    if step is None or "SLURM_PROCID" not in env:
        return None
    read = EnvReader(env)
    rank = read.required_int("SLURM_PROCID")
    local_rank = read.required_int("SLURM_LOCALID")
    node_rank = read.required_int("SLURM_NODEID")
    # Step-scoped first: `srun --preserve-env` keeps SLURM_NTASKS/SLURM_NNODES at job values.
    world, world_name = read.int_from("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", minimum=1)
    nodes, nodes_name = read.int_from("SLURM_STEP_NUM_NODES", "SLURM_NNODES", minimum=1)
    read.below("SLURM_PROCID", rank, world_name, world)
    read.below("SLURM_NODEID", node_rank, nodes_name, nodes)
    local_world = _local_world_size(read, node_rank, nodes, nodes_name)
    if local_world is not None:
        read.below("SLURM_LOCALID", local_rank, "SLURM_STEP_TASKS_PER_NODE entry", local_world)
    master_addr = _master_addr(read, host)
    master_port = _master_port(read, step)
    read.raise_if_problems(HINT)
    return LaunchContext(
        launcher="slurm",
        flavor="srun",
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world or 1,
        node_rank=node_rank,
        num_nodes=nodes,
        master_addr=master_addr,
        master_port=master_port,
        notes=_stale_env_notes(env, rank, world, world_name, f"{_job_id(env)}.{step}"),
    )


def _stale_env_notes(
    env: Mapping[str, str], rank: int, world: int, world_name: str, step: str
) -> tuple[str, ...]:
    # The step's values replace them; left over from an outer job they are worth naming.
    stale = [
        f"{name}={env[name]}"
        for name, value in (("RANK", rank), ("WORLD_SIZE", world))
        if name in env and env[name].strip() != str(value)
    ]
    if not stale:
        return ()
    return (
        f"ignoring {', '.join(stale)} from the environment: srun step {step} makes this task"
        f" rank {rank} of {world} (SLURM_PROCID, {world_name})",
    )


def _job_id(env: Mapping[str, str]) -> str:
    return env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", ""))


def _local_world_size(read: EnvReader, node_rank: int, nodes: int, nodes_name: str) -> int | None:
    # Uneven steps exist (`4(x2),3`), so take this node's own entry rather than world // nodes.
    name = read.first_set("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if name is None:
        read.check(False, "SLURM_STEP_TASKS_PER_NODE is not set")
        return None
    try:
        counts = hostlist.task_counts(read.env[name])
    except ValueError as err:
        read.check(False, f"{name}={read.env[name]!r} is not a Slurm task count list ({err})")
        return None
    # This node's entry needs a good node index and node count (known bad: reported already).
    if not read.ok("SLURM_NODEID", nodes_name):
        return None
    if counts.nodes != nodes:
        read.check(
            False, f"{name}={read.env[name]!r} lists {counts.nodes} nodes but {nodes_name}={nodes}"
        )
        return None
    return counts.on_node(node_rank)


def _master_addr(read: EnvReader, host: HostFacts) -> str:
    env = read.env
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    if env.get("SLURM_HOSTFILE") and env.get("SLURM_DISTRIBUTION", "").startswith("arbitrary"):
        # With an arbitrary layout rank 0 runs on the hostfile's first line, not the first node.
        if host.slurm_hostfile_head:
            return host.slurm_hostfile_head
        read.check(False, f"SLURM_HOSTFILE={env['SLURM_HOSTFILE']!r} cannot be read or is empty")
        return ""
    name = read.first_set("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if name is None:
        read.check(False, "SLURM_STEP_NODELIST is not set")
        return ""
    try:
        return hostlist.first_host(env[name])
    except ValueError as err:
        read.check(False, f"{name}={env[name]!r} is not a valid Slurm hostlist ({err})")
        return ""


def _master_port(read: EnvReader, step: int) -> int:
    env = read.env
    if "MASTER_PORT" in env:
        return read.port("MASTER_PORT")
    if env.get("SLURM_STEP_RESV_PORTS"):
        try:
            return ports.first_reserved_port(env["SLURM_STEP_RESV_PORTS"])
        except ValueError as err:
            read.check(False, f"SLURM_STEP_RESV_PORTS: {err}")
            return 0
    # Job id and step id both: two steps of one job sharing a node must not collide.
    return ports.derived_port(_job_id(env), str(step))
