"""Which launcher started this process, read from its environment: one rule per launcher, tried
in PRECEDENCE order, with TRAINBOX_LAUNCHER to force one and a lone process as the fallback."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trainbox.errors import LaunchError
from trainbox.launch import kubeflow, manual, mpi, slurm, torchrun
from trainbox.launch.context import LaunchContext
from trainbox.launch.facts import HostFacts, gather

Detector = Callable[[Mapping[str, str], HostFacts], LaunchContext | None]

# First match wins. The order is the policy, and each place is earned:
PRECEDENCE: tuple[tuple[str, Detector], ...] = (
    # torchrun workers carry variables about this very process, and torchrun itself runs inside
    # srun, mpirun and Kubeflow pods, whose variables then describe the agent, not the worker.
    ("torchrun", torchrun.detect),
    # MPI variables are per process. mpirun inside an sbatch script inherits the batch shell's
    # SLURM_PROCID=0 (and may see its daemons' srun step), so MPI must be read before Slurm.
    ("mpi", mpi.detect),
    # Only a real srun step: the batch shell and salloc also carry SLURM_PROCID but no step id.
    ("slurm", slurm.detect),
    # A PyTorchJob's RANK is a pod index, not a process rank, so Kubeflow must be read before
    # the generic RANK/WORLD_SIZE rule.
    ("kubeflow", kubeflow.detect),
    # RANK/WORLD_SIZE/MASTER_* exported by hand; anything above would have set them too.
    ("env", manual.detect),
)

LAUNCHERS = (*(name for name, _ in PRECEDENCE), "single")

# What each forced launcher needs, for the error when TRAINBOX_LAUNCHER names a missing one.
_NEEDS = {
    "torchrun": "TORCHELASTIC_RUN_ID (a worker started by torchrun)",
    "mpi": "OMPI_COMM_WORLD_SIZE, MV2_COMM_WORLD_SIZE or PMI_SIZE (a rank started by mpirun)",
    "slurm": "SLURM_PROCID and SLURM_STEP_ID (a task of an srun step)",
    "kubeflow": "PET_NNODES or PET_MASTER_ADDR (a PyTorchJob or TrainJob pod)",
    "env": "RANK and WORLD_SIZE",
}


def detect(env: Mapping[str, str], host: HostFacts | None = None) -> LaunchContext:
    """The launch context for `env`; TRAINBOX_LAUNCHER forces one launcher."""
    host = host or HostFacts()
    forced = env.get("TRAINBOX_LAUNCHER", "").strip()
    if forced:
        return _forced(forced, env, host)
    for _, detector in PRECEDENCE:
        context = detector(env, host)
        if context is not None:
            return context
    return single(env)


def from_process(env: Mapping[str, str], *, visible_gpus: int) -> LaunchContext:
    """Detect for a real process: gather host facts (SLURM_HOSTFILE), then detect."""
    return detect(env, gather(env, visible_gpus=visible_gpus))


# Set without RANK/WORLD_SIZE they place nothing: env:// needs those two.
_PLACE_ONLY = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


def single(env: Mapping[str, str]) -> LaunchContext:
    """One process on its own; notes a Slurm allocation not entered with srun, and ignored
    placement variables."""
    notes: list[str] = []
    if "SLURM_JOB_ID" in env and slurm.step_id(env) is None:
        # The batch shell carries SLURM_PROCID=0 and SLURM_NTASKS=N; claiming a rank would hang.
        notes.append(
            f"inside Slurm job {env['SLURM_JOB_ID']} but not in an srun step (batch shell or"
            f" salloc; SLURM_NTASKS={env.get('SLURM_NTASKS', '?')}): running one process;"
            " use srun to start ranks"
        )
    ignored = [f"{name}={env[name]}" for name in _PLACE_ONLY if name in env]
    if ignored and "RANK" not in env and "WORLD_SIZE" not in env:
        notes.append(
            f"ignoring {', '.join(ignored)}: RANK and WORLD_SIZE are not set, so this is one"
            " process on its own (export RANK and WORLD_SIZE too, or start it under a launcher)"
        )
    return LaunchContext(
        launcher="single",
        flavor="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=0,
        notes=tuple(notes),
    )


def _forced(name: str, env: Mapping[str, str], host: HostFacts) -> LaunchContext:
    if name == "single":
        return single(env)
    detector = dict(PRECEDENCE).get(name)
    if detector is None:
        raise LaunchError(
            f"TRAINBOX_LAUNCHER={name!r} is not a launcher",
            hint=f"use one of {', '.join(LAUNCHERS)}, or unset it to detect automatically",
        )
    context = detector(env, host)
    if context is None:
        raise LaunchError(
            f"TRAINBOX_LAUNCHER={name} but this process has no {_NEEDS[name]}",
            hint="unset TRAINBOX_LAUNCHER to detect automatically, or start under that launcher",
        )
    return context
