"""What `trainbox exec` hands over to: the user's command, or torchrun around it in node mode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainbox.launch.context import LaunchContext

# torchrun's agent dies on SIGUSR1 unless told to handle it; Slurm preemption sends USR1.
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass(frozen=True, kw_only=True, slots=True)
class Handoff:
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
) -> Handoff:
    """Exec `command` with torchrun-style variables, or under torchrun when this is a node agent."""
    if not context.spawns_workers:
        return Handoff(argv=tuple(command), env={**env, **context.to_env()})
    agent_env = {**env, "TORCHELASTIC_SIGNALS_TO_HANDLE": AGENT_SIGNALS}
    argv = torchrun_argv(context, python=python, max_restarts=max_restarts)
    return Handoff(argv=(*argv, *command), env=agent_env, workers=context.local_world_size)


def torchrun_argv(context: LaunchContext, *, python: str, max_restarts: int = 0) -> list[str]:
    """`python -m torch.distributed.run` with the node's place taken from the detected context."""
    if context.num_nodes == 1:
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
