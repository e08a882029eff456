"""Joining the job's process group, agreeing with the peers, the watchdog, error translation."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import structlog
import torch

from trainbox import launch, logs, watchdog
from trainbox.affinity import CpuPlan, set_torch_threads
from trainbox.config import Config, fingerprint
from trainbox.distributed import flight_recorder, peers
from trainbox.distributed.process_group import (
    Session,
    attempt,
    choose_backend,
    choose_device,
    process_group,
)
from trainbox.errors import DistributedError, StorageError
from trainbox.launch.context import LaunchContext
from trainbox.process import bad_nodes, supervise
from trainbox.process.bootstrap import StartupFacts
from trainbox.train.resume.determinism import seed_all

# A write that failed for want of space or a writable volume (not a missing input file).
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
HANG_HINT = (
    "the named rank's log shows what it was doing: check its host, its data pipeline and the"
    " network between nodes; raise dist.timeout_s if that operation is legitimately slow"
    " (a large checkpoint write, a first compile)"
)


def launch_context(env: Mapping[str, str] | None = None) -> LaunchContext:
    """Where this process sits in the job (rank, world, master), detected from the environment."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return launch.from_process(os.environ if env is None else env, visible_gpus=visible)


@contextmanager
def init_distributed(
    context: LaunchContext | None = None,
    *,
    backend: str = "auto",
    timeout_s: float = 600.0,
    seed: int | None = None,
    plan: CpuPlan | None = None,
    run_dir: Path | None = None,
    flight_recorder_entries: int = 0,
) -> Iterator[Session]:
    """Join the job's process group (env://) and leave it again; seed torch on entry if asked.

    On nccl with `run_dir` and `flight_recorder_entries`, the NCCL Flight Recorder dumps into
    run_dir/hang/ when a collective times out (distributed/flight_recorder.py).

    Seeding here (every rank the same seed) makes a model built inside the block start from
    the same weights as `trainbox run` builds with the same `seed`.
    """
    context = context or launch_context()
    if not structlog.is_configured():
        # A script's first call into trainbox; the CLI has configured logging already.
        logs.configure(os.environ)
    logs.bind(context)
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = choose_device(context, cuda_count=cuda_count)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # env:// reads these; under torchrun or `trainbox exec` they are set already.
    for name, value in context.to_env().items():
        os.environ.setdefault(name, value)
    chosen = choose_backend(backend, cuda=device.type == "cuda")
    if run_dir is not None:
        evidence_dir = (run_dir / watchdog.EVIDENCE_DIR).absolute()
        recorder = flight_recorder.nccl_env(
            os.environ, backend=chosen, evidence_dir=evidence_dir, entries=flight_recorder_entries
        )
        if recorder:
            # ProcessGroupNCCL reads them when the group is made; torch writes the dumps there.
            evidence_dir.mkdir(parents=True, exist_ok=True)
            os.environ.update(recorder)
            logs.log.info("nccl flight recorder", set=recorder)
    with process_group(context, backend=chosen, timeout_s=timeout_s, device=device) as joined:
        if seed is not None:
            seed_all(seed)
        yield Session(
            context=context, device=device, backend=chosen, timeout_s=timeout_s, plan=plan,
            generations=joined.generations, promotion=joined.promotion,
        )  # fmt: skip


def agree_with_peers(
    config: Config, session: Session, *, cpu_count: int, gpu_model: str | None
) -> None:
    """Rank 0 compares every rank's versions, image, config, GPU model and CPUs; exit 4 on a
    difference.

    `cpu_count` is this rank's CPU budget: shown in rank 0's table, never compared (peers.py).
    """
    peers.agree(
        peers.local(
            rank=session.context.rank,
            config_hash=fingerprint(config),
            gpu_model=gpu_model,
            cpu_budget=cpu_count,
            env=os.environ,
        )
    )


def own_gpu_model(prepared: StartupFacts, device: torch.device) -> str | None:
    """NVML's name for this rank's GPU (None on the CPU or without a survey)."""
    if device.type != "cuda" or not prepared.survey.gpus:
        return None
    return prepared.survey.gpus[device.index].name


@contextmanager
def joined(config: Config, prepared: StartupFacts, *, work: str) -> Iterator[Session]:
    """Size torch's threads, join the group and check the peers agree: the CLI's way in.

    A collective that fails inside (a dead peer, a timeout) becomes a DistributedError (exit 4).
    """
    context, plan = prepared.context, prepared.plan
    if plan is not None:
        set_torch_threads(plan)
    with init_distributed(
        context, backend=config.dist.backend, timeout_s=config.dist.timeout_s, plan=plan
    ) as session:
        agree_with_peers(
            config,
            session,
            cpu_count=plan.budget if plan else len(os.sched_getaffinity(0)),
            gpu_model=own_gpu_model(prepared, session.device),
        )
        with lost_peers_said(context.rank, work=work):
            yield session


@contextmanager
def lost_peers_said(rank: int, *, work: str) -> Iterator[None]:
    """A dead peer or a timed-out collective during `work` as one line (exit 4)."""
    try:
        yield
    except RuntimeError as err:
        if not watchdog.is_comm_failure(err):
            raise
        first = str(err).strip().splitlines()[0]
        raise DistributedError(
            f"rank {rank} lost its peers during {work}: {first}",
            hint="the other ranks' logs say which one stopped first; rerun the command"
            " (predict reuses the parts already written)",
        ) from err


@contextmanager
def training_failures_said(
    rank: int, watch: watchdog.Watchdog, *, flavor: str = ""
) -> Iterator[None]:
    """A full volume or a failed collective during training as one line, not a traceback."""
    try:
        yield
    except OSError as err:
        if err.errno not in STORAGE_FULL:
            raise
        # metrics.jsonl, run.json or summary.json could not be written (checkpoints
        # report their own): one line, not a traceback. Files already written stay.
        raise StorageError(
            f"rank {rank} could not write {err.filename or 'to run_dir'}: {err.strerror or err}",
            hint="free space on that volume or point run_dir at another one; the run"
            " resumes from its newest checkpoint",
        ) from err
    except RuntimeError as err:
        if not watchdog.is_comm_failure(err):
            raise
        # A peer died or a collective timed out: say who stopped first, and where.
        message = watch.explain(str(err), err.__traceback__)
        hint = HANG_HINT + dead_node_hint(watch, flavor=flavor)
        raise DistributedError(message, hint=hint) from err


def dead_node_hint(watch: watchdog.Watchdog, *, flavor: str) -> str:
    """Under Kubeflow, the cordon for the node whose rank died ("" otherwise)."""
    blame = watch.verdict
    if blame is None or not blame.died:
        return ""
    return bad_nodes.cordon_hint(blame.host, os.environ, flavor=flavor)


def hang_watchdog(session: Session, *, run_dir: Path | None = None) -> watchdog.Watchdog:
    """Heartbeats through the job's store; a stuck collective ends this process (exit 4),
    leaving its stacks in run_dir/hang/ (watchdog/evidence.py)."""
    context, timeout_s = session.context, session.timeout_s
    return watchdog.Watchdog(
        rank=context.rank,
        world_size=context.world_size,
        # The scheduler's name for the node: what a verdict names is what an exclude list takes.
        host=bad_nodes.node_name(os.environ),
        timeout_s=timeout_s,
        store=watchdog.connect(
            context.master_addr,
            context.master_port,
            world_size=context.world_size,
            timeout_s=timeout_s,
            attempt=attempt(os.environ),
        ),
        on_hang=_die_of_hang,
        # Started by hand, rank 0 serves the store (under torchrun its agent does).
        hosts_store=context.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
        evidence_dir=None if run_dir is None else run_dir / watchdog.EVIDENCE_DIR,
        on_verdict=lambda blame: record_dead_ranks(blame, rank=context.rank, run_dir=run_dir),
    )


def record_dead_ranks(blame: watchdog.Blame, *, rank: int, run_dir: Path | None) -> None:
    """The node of a rank that died, recorded by the one survivor every rank agrees on."""
    if blame.rank is None or not blame.died or rank != bad_nodes.dead_ranks_recorder(blame.rank):
        return
    record = bad_nodes.event(
        os.environ, reason=bad_nodes.RANKS_DIED, detail=blame.text,
        exit_code=DistributedError.exit_code, rank=rank, now=time.time(), host=blame.host,
    )  # fmt: skip
    bad_nodes.write(run_dir, record)


def _die_of_hang(message: str) -> None:
    """Runs on the watchdog thread while the main thread is stuck: this process ends here."""
    error = DistributedError(message, hint=HANG_HINT)
    try:
        logs.say(f"trainbox: error: {error.line()}")
        supervise.record_exit_code(os.environ, error.exit_code)
    finally:
        # The main thread cannot be interrupted inside a C++ collective; only an exit ends
        # it, even when the line cannot be written (a killed launcher took stderr's reader).
        os._exit(error.exit_code)
