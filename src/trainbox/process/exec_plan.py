"""What `trainbox exec` hands over to: the user's command, or torchrun around it in node mode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainbox.launch.context import ElasticNodes, LaunchContext

# torchrun's agent dies on SIGUSR1 unless told to handle it; Slurm preemption sends USR1.
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# Set to 1, torchrun's agents give each round's workers a store of their own (rank 0 hosts it).
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# Lightning and Fabric read LOCAL_RANK as "an outside launcher started every process": with no
# launcher, `devices=2` then waited forever for a second process nobody started. A lone process
# gets only what env:// needs for a world of one, and its libraries start workers as they would
# under plain python.
PLACEMENT = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK")


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecPlan:
    """A process image to exec: argv and its complete environment."""

    # argv[0] is looked up on PATH.
    argv: tuple[str, ...]
    # The whole environment of the new process.
    env: dict[str, str]
    # Workers torchrun starts on this node (node mode); 0 for a plain exec.
    workers: int = 0


def plan(
    context: LaunchContext,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    python: str,
    max_restarts: int = 0,
) -> ExecPlan:
    """Exec `command` with torchrun-style variables, or under torchrun when this is a node agent."""
    if not context.spawns_workers:
        return ExecPlan(argv=tuple(command), env={**_inherited(context, env), **variables(context)})
    agent_env = {**env, "TORCHELASTIC_SIGNALS_TO_HANDLE": AGENT_SIGNALS}
    if context.elastic is not None:
        # torch 2.13's agents publish the workers' shared store address for the first round
        # only: a node joining a later round waits for it until the rendezvous times out.
        agent_env.setdefault(UNSHARED_STORE, "1")
    argv = torchrun_argv(context, python=python, max_restarts=max_restarts)
    return ExecPlan(argv=(*argv, *command), env=agent_env, workers=context.local_world_size)


def variables(context: LaunchContext) -> dict[str, str]:
    """The torchrun-style variables a command started for `context` is given."""
    exported = context.to_env()
    if context.launcher == "single":
        return {name: value for name, value in exported.items() if name not in PLACEMENT}
    return exported


def describe(target: ExecPlan, context: LaunchContext) -> dict[str, object]:
    """What exec hands over, for its log line: the world, and where it was read from."""
    source = context.launcher
    if context.flavor != context.launcher:
        source = f"{context.launcher} ({context.flavor})"
    if target.workers:
        given = {"workers": target.workers, "world_size": context.world_size}
        return {"from": source, **given, "by": "torchrun (node mode)"}
    exported = {name: target.env[name] for name in context.to_env() if name in target.env}
    return {"from": source, "world_size": context.world_size, "variables": exported}


def _inherited(context: LaunchContext, env: Mapping[str, str]) -> dict[str, str]:
    # A lone process's stale placement (ignored by detection) must not reach the command either.
    if context.launcher != "single":
        return dict(env)
    return {name: value for name, value in env.items() if name not in PLACEMENT}


def torchrun_argv(context: LaunchContext, *, python: str, max_restarts: int = 0) -> list[str]:
    """`python -m torch.distributed.run` with the node's place taken from the detected context."""
    if context.elastic is not None:
        where = elastic_args(context.elastic)
        # The job spec's restart budget (elasticPolicy.maxRestarts) is the job's own word.
        if context.elastic.max_restarts is not None:
            max_restarts = context.elastic.max_restarts
    elif context.num_nodes == 1:
        # One node: torchrun picks a free port itself, so two jobs on one box never collide.
        where = ["--standalone"]
    else:
        where = [
            f"--nnodes={context.num_nodes}",
            f"--node-rank={context.node_rank}",
            f"--master-addr={context.master_addr}",
            f"--master-port={context.master_port}",
        ]
    return [
        python,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={context.local_world_size}",
        f"--max-restarts={max_restarts}",
        "--no-python",
    ]


def elastic_args(elastic: ElasticNodes) -> list[str]:
    """torchrun's options for an elastic node range: its rendezvous places every node."""
    found = [
        f"--nnodes={elastic.min_nodes}:{elastic.max_nodes}",
        f"--rdzv-backend={elastic.backend}",
        f"--rdzv-endpoint={elastic.endpoint}",
    ]
    if elastic.run_id:
        found.append(f"--rdzv-id={elastic.run_id}")
    if elastic.conf:
        found.append(f"--rdzv-conf={elastic.conf}")
    return found
