"""The process group: backend and device choice (pure), init/teardown, and the joined Session."""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from trainbox.affinity import CpuPlan
from trainbox.distributed.regroup import MOST_ATTEMPTS, Generations, await_promotion
from trainbox.errors import DistributedError
from trainbox.launch.context import LaunchContext
from trainbox.process.keeper import ROLE, Promotion
from trainbox.testing import faults


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A joined process group: what training, evaluation and prediction know of this process."""

    # Where this process sits in the job.
    context: LaunchContext
    # This rank's device (its local rank's GPU, or the CPU).
    device: torch.device
    # The process group's backend (nccl or gloo).
    backend: str
    # Seconds a collective may wait (dist.timeout_s); also the hang watchdog's limit.
    timeout_s: float
    # This rank's CPU plan (None: not planned by the CLI, e.g. a script through the API).
    plan: CpuPlan | None = None
    # dist.recovery=in_process: the group's generations (None: the group is never re-formed).
    generations: Generations | None = None
    # A spare that took over its rank: what it was told (None: this rank's first process).
    promotion: Promotion | None = None

    @property
    def rank0(self) -> bool:
        """Whether this rank writes the outputs."""
        return self.context.rank == 0


def choose_backend(configured: str, *, cuda: bool) -> str:
    """`auto` is nccl when this process drives a GPU, else gloo; an explicit choice stands."""
    if configured != "auto":
        return configured
    return "nccl" if cuda else "gloo"


def choose_device(context: LaunchContext, *, cuda_count: int) -> torch.device:
    """This rank's device: its local rank's GPU, wrapping when fewer GPUs are visible than ranks."""
    if cuda_count == 0:
        return torch.device("cpu")
    # One visible GPU per task (srun --gpus-per-task, torchrun virtual local rank): it is ours.
    return torch.device("cuda", context.local_rank % cuda_count)


@dataclass(frozen=True, kw_only=True, slots=True)
class Joined:
    """How this process joined: what a kept trainer or spare knows besides the Session's facts."""

    # dist.recovery=in_process: the group's generations (None: not kept).
    generations: Generations | None = None
    # A spare: what its keeper told it when it took over (None: not a spare).
    promotion: Promotion | None = None


@contextmanager
def process_group(
    context: LaunchContext, *, backend: str, timeout_s: float, device: torch.device
) -> Iterator[Joined]:
    """Join the job's process group through env:// and always leave it again.

    A process its keeper runs (dist.recovery=in_process) joins a generation of the group
    (distributed/regroup.py); a spare first waits to be promoted.
    """
    # init_method env:// reads these; the CLI's outer layer is the only place that sets them.
    missing = [
        name
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        if name not in os.environ
    ]
    if missing:
        raise RuntimeError(f"process_group needs {missing} in os.environ (set by the CLI)")
    timeout = timedelta(seconds=timeout_s)
    joined = Joined()
    try:
        if ROLE in os.environ:
            joined = _join_kept(context, backend=backend, timeout_s=timeout_s, device=device)
        else:
            store = restart_store(context, os.environ, timeout=timeout)
            torch_dist.init_process_group(
                backend=backend,
                init_method=None if store else "env://",
                store=store,
                rank=context.rank,
                world_size=context.world_size,
                timeout=timeout,
                device_id=device if device.type == "cuda" else None,
            )
    except torch_dist.DistError as err:
        raise startup_error(context, str(err), timeout_s=timeout_s) from err
    try:
        yield joined
        # Leave together: a rank that tears down while a peer still talks to it can abort
        # gloo's transport threads ("terminate called without an active exception").
        torch_dist.barrier()
    finally:
        # Objects holding the group (DDP's reducer) must be gone before the group is.
        gc.collect()
        torch_dist.destroy_process_group()


def _join_kept(
    context: LaunchContext, *, backend: str, timeout_s: float, device: torch.device
) -> Joined:
    """A kept trainer joins generation 0; a spare waits for its promotion, then follows the
    rank's earlier holders to the generation the survivors form."""
    client = torch_dist.TCPStore(
        context.master_addr,
        context.master_port,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    generations = Generations(
        client, f"trainbox/attempt-{attempt(os.environ)}", rank=context.rank,
        world_size=context.world_size, backend=backend, timeout_s=timeout_s, device=device,
    )  # fmt: skip
    promotion = None
    if os.environ[ROLE] == "spare":
        faults.from_env(os.environ, rank=context.rank).at_recovery("spare")
        promotion = await_promotion(os.environ)
        if promotion is None:
            # The keeper let its spare go: the rank's trainer finished; nothing to do.
            raise SystemExit(0)
        target = generations.target_for_spare(promotion.predecessors)
        generations.join_first_formed(target, attempts=MOST_ATTEMPTS)
    else:
        generations.join(0)
    return Joined(generations=generations, promotion=promotion)


def restart_store(
    context: LaunchContext, env: Mapping[str, str], *, timeout: timedelta
) -> torch_dist.Store | None:
    """The agent's store under a prefix of this restart attempt, when torchrun shares its store.

    torchrun keeps one store across restarts and re-forms, so without the prefix a restarted
    worker can read a dead worker's address left by the previous round and fail to connect.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = torch_dist.TCPStore(
        context.master_addr, context.master_port, is_master=False, timeout=timeout
    )
    return torch_dist.PrefixStore(f"trainbox/attempt-{attempt(env)}", client)


def attempt(env: Mapping[str, str]) -> str:
    """Which round of the worker group this is: torchrun's restart count and the world size.

    A failure (a peer lost) counts a restart; a node joining an elastic job re-forms the group
    without counting one, but always into a larger world, so the pair names each round once.
    """
    restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return f"{restarts}-w{int(env.get('WORLD_SIZE', '1') or 1)}"


def startup_error(context: LaunchContext, message: str, *, timeout_s: float) -> DistributedError:
    """Turn torch's rendezvous failure into one line naming the address, port and what to check."""
    where = f"{context.master_addr}:{context.master_port}"
    if "EADDRINUSE" in message or "address already in use" in message:
        return DistributedError(
            f"rank {context.rank}: port {context.master_port} is already in use on this host,"
            f" so the master cannot listen on {where}",
            hint="another job or a leftover process holds it"
            f" (ss -ltnp 'sport = :{context.master_port}'); pick another MASTER_PORT,"
            " or unset it to let trainbox derive one per job",
        )
    joined = re.search(r"(\d+)/(\d+) clients joined", message)
    if joined:
        return DistributedError(
            f"only {joined[1]} of {joined[2]} ranks reached the master {where} within"
            f" {timeout_s:g} s",
            hint="check that every rank started (scheduler logs) and can reach"
            f" {where}; raise dist.timeout_s if ranks start slowly",
        )
    if "connect" in message:
        return DistributedError(
            f"rank {context.rank} could not reach the master at {where} within {timeout_s:g} s",
            hint=f"check that rank 0 runs on {context.master_addr}, that MASTER_ADDR/MASTER_PORT"
            " agree on every rank, and that no firewall blocks the port",
        )
    return DistributedError(
        f"rank {context.rank} could not join the process group at {where}: {message}",
        hint="check MASTER_ADDR/MASTER_PORT on every rank and dist.timeout_s",
    )
