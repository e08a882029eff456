"""Assemble a training run from config and the prepared process; fit it in the process group."""

from __future__ import annotations

import errno
import os
import platform
import sys
from typing import Any

import torch

from trainbox import affinity, dist, factories, faults, peers, preempt, supervise, watchdog
from trainbox import config as configuration
from trainbox.bootstrap import Prepared
from trainbox.config import Config
from trainbox.errors import DistributedError, Stopped, StorageError
from trainbox.preempt import Requests
from trainbox.train import seeding
from trainbox.train.evaluate import loss_fn
from trainbox.train.trainer import Setup, Trainer

# A write that failed for want of space or a writable volume (not a missing input file).
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
HANG_HINT = (
    "the named rank's log shows what it was doing: check its host, its data pipeline and the"
    " network between nodes; raise dist.timeout_s if that operation is legitimately slow"
    " (a large checkpoint write, a first compile)"
)


def train(
    config: Config, prepared: Prepared, *, requests: Requests | None = None
) -> dict[str, Any]:
    """Build model and data, join the process group, agree with the peers, train.

    Raises Stopped (exit 143) when a stop signal or the deadline ended training early.
    """
    context, plan = prepared.context, prepared.plan
    if config.train.deterministic:
        torch.use_deterministic_algorithms(True)
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = dist.choose_device(context, cuda_count=cuda_count)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Every rank seeds identically before building, so the initial weights agree everywhere.
    seeding.seed_all(config.seed)
    model = factories.build_model(config.model.factory, config.model.args)
    data = factories.build_data(config.data.factory, config.data.args)
    factories.check_fit(
        model, data, loss=lambda out, target: loss_fn(config.train.loss, out, target)
    )
    if plan is not None:
        if data.max_workers is not None and config.pinning.num_workers == "auto":
            plan = affinity.with_workers(
                plan,
                data.max_workers,
                reason="the dataset holds its samples in memory",
                grow_threads=config.pinning.num_threads == "auto",
            )
        affinity.set_torch_threads(plan)
    backend = dist.choose_backend(config.dist.backend, cuda=device.type == "cuda")
    timeout_s = config.dist.timeout_s
    with (
        dist.process_group(context, backend=backend, timeout_s=timeout_s, device=device),
        watchdog.Watchdog(
            rank=context.rank,
            world_size=context.world_size,
            host=platform.node(),
            timeout_s=timeout_s,
            store=watchdog.connect(
                context.master_addr,
                context.master_port,
                world_size=context.world_size,
                timeout_s=timeout_s,
                attempt=dist.attempt(os.environ),
            ),
            on_hang=_die_of_hang,
        ) as watch,
    ):
        own = (
            prepared.survey.gpus[device.index]
            if device.type == "cuda" and prepared.survey.gpus
            else None
        )
        peers.agree(
            peers.local(
                rank=context.rank,
                config_hash=configuration.fingerprint(config),
                gpu_model=own.name if own else None,
                cpu_count=plan.budget if plan else len(os.sched_getaffinity(0)),
                env=os.environ,
            )
        )
        setup = Setup(
            config=config,
            context=context,
            device=device,
            model=model,
            data=data,
            num_workers=plan.num_workers if plan else 0,
            worker_init=affinity.worker_init(plan) if plan else None,
            requests=requests or Requests(),
            deadline_at=preempt.deadline(os.environ, margin_s=config.train.deadline_margin_s),
            mark=watch.mark,
            faults=faults.from_env(os.environ, rank=context.rank),
        )
        trainer = Trainer(setup)
        try:
            result = trainer.fit()
        except OSError as err:
            if err.errno not in STORAGE_FULL:
                raise
            # metrics.jsonl, run.json or summary.json could not be written (checkpoints
            # report their own): one line, not a traceback. Files already written stay.
            raise StorageError(
                f"rank {context.rank} could not write {err.filename or 'to run_dir'}:"
                f" {err.strerror or err}",
                hint="free space on that volume or point run_dir at another one; the run"
                " resumes from its newest checkpoint",
            ) from err
        except RuntimeError as err:
            if not watchdog.is_comm_failure(err):
                raise
            # A peer died or a collective timed out: say who stopped first, and where.
            raise DistributedError(watch.explain(str(err)), hint=HANG_HINT) from err
        finally:
            trainer.close()
    # Raised only now, after every rank left the process group together.
    if "stopped" in result:
        raise Stopped(
            f"stopped after step {result['steps']} ({result['stopped']}); checkpoint"
            f" {result['checkpoint']}",
            hint="run the same command again to resume from it (the sbatch scripts requeue the"
            " job; Kubeflow restarts the pod on exit code 143)",
        )
    return result


def _die_of_hang(message: str) -> None:
    """Runs on the watchdog thread while the main thread is stuck: this process ends here."""
    error = DistributedError(message, hint=HANG_HINT)
    print(f"trainbox: error: {error.line()}", file=sys.stderr, flush=True)
    supervise.report(os.environ, error.exit_code)
    # The main thread cannot be interrupted inside a C++ collective; only an exit ends it.
    os._exit(error.exit_code)
