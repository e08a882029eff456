"""The Python API: what `trainbox run` is built from, for scripts with their own model and data.

    config = trainbox.load_config("train.yaml", ["train.max_steps=500"])
    with trainbox.init_distributed(seed=config.seed) as session:
        model, data = MyNet(), trainbox.Datasets(train=my_train, val=my_val)
        summary = trainbox.Trainer(config, session, model=model, data=data).fit()

Run the script under any launcher through `trainbox exec -- python script.py` (or torchrun).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import platform
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from trainbox import config as configuration
from trainbox import dist, faults, launch, logs, peers, preempt, supervise, watchdog
from trainbox.config import Config
from trainbox.errors import DistributedError, Stopped, StorageError
from trainbox.factories import API_SUPPLIED, Datasets, as_datasets, check_fit
from trainbox.launch.context import LaunchContext
from trainbox.train import determinism, evaluate, seeding
from trainbox.train.evaluate import loss_fn
from trainbox.train.hooks import Hooks
from trainbox.train.loop import TrainingLoop
from trainbox.train.objective import probe
from trainbox.train.seams import choose
from trainbox.train.setup import Setup

# A write that failed for want of space or a writable volume (not a missing input file).
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
HANG_HINT = (
    "the named rank's log shows what it was doing: check its host, its data pipeline and the"
    " network between nodes; raise dist.timeout_s if that operation is legitimately slow"
    " (a large checkpoint write, a first compile)"
)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """The run configuration from an optional YAML file and `key.sub=value` overrides."""
    return configuration.load(str(path) if path else None, list(overrides))


def launch_context(env: Mapping[str, str] | None = None) -> LaunchContext:
    """Where this process sits in the job (rank, world, master), detected from the environment."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return launch.from_process(os.environ if env is None else env, visible_gpus=visible)


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A joined process group: what a Trainer needs to know about this process."""

    # Where this process sits in the job.
    context: LaunchContext
    # This rank's device (its local rank's GPU, or the CPU).
    device: torch.device
    # The process group's backend (nccl or gloo).
    backend: str
    # Seconds a collective may wait (dist.timeout_s); also the hang watchdog's limit.
    timeout_s: float


@contextmanager
def init_distributed(
    context: LaunchContext | None = None,
    *,
    backend: str = "auto",
    timeout_s: float = 600.0,
    seed: int | None = None,
) -> Iterator[Session]:
    """Join the job's process group (env://) and leave it again; seed torch on entry if asked.

    Seeding here (every rank the same seed) makes a model built inside the block start from
    the same weights as `trainbox run` builds with the same `seed`.
    """
    context = context or launch_context()
    if not structlog.is_configured():
        # A script's first call into trainbox; the CLI has configured logging already.
        logs.configure(os.environ)
    logs.bind(context)
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = dist.choose_device(context, cuda_count=cuda_count)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # env:// reads these; under torchrun or `trainbox exec` they are set already.
    for name, value in context.to_env().items():
        os.environ.setdefault(name, value)
    chosen = dist.choose_backend(backend, cuda=device.type == "cuda")
    with dist.process_group(context, backend=chosen, timeout_s=timeout_s, device=device):
        if seed is not None:
            seeding.seed_all(seed)
        yield Session(context=context, device=device, backend=chosen, timeout_s=timeout_s)


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
            config_hash=configuration.fingerprint(config),
            gpu_model=gpu_model,
            cpu_budget=cpu_count,
            env=os.environ,
        )
    )


class Trainer:
    """Trains `model` on `data` in `session` with DDP: `trainbox run`'s loop, files and fingerprint.

    `fit()` returns the summary (also written to run_dir/summary.json) or raises Stopped (exit
    code 143) after a preemption checkpoint. `step`, `optim_factory`, `schedule_factory`,
    `state_factory` and `eval_step` are the objects behind the config keys `train.step`,
    `optim.factory`, `optim.schedule_factory`, `train.state_factory` and `train.eval_step`
    (a keyword wins over the key; see docs/your-model.md). The other keyword-only extras are
    what the CLI decides from its CPU plan and NVML; scripts can leave them.
    """

    def __init__(
        self,
        config: Config,
        session: Session,
        *,
        model: torch.nn.Module,
        data: Datasets | tuple[Any, Any],
        num_workers: int = 0,
        worker_init: Callable[[int], None] | None = None,
        cpu_count: int | None = None,
        gpu_model: str | None = None,
        requests: preempt.Requests | None = None,
        step: Callable[..., Any] | None = None,
        optim_factory: Callable[..., Any] | None = None,
        schedule_factory: Callable[..., Any] | None = None,
        state_factory: Callable[..., Any] | None = None,
        eval_step: Callable[[Any, Any], Any] | None = None,
        from_factories: bool = False,
    ) -> None:
        self.config, self.session = config, session
        # Resolved now: a config key naming missing code is an exit 2 before anything runs.
        self.seams = choose(
            config,
            step=step,
            optim_factory=optim_factory,
            schedule_factory=schedule_factory,
            state_factory=state_factory,
        )
        self.eval_step = (
            evaluate.step_of(eval_step)
            if eval_step is not None
            else evaluate.eval_step(config.train.eval_step, kind=config.train.loss)
        )
        self.model = model
        self.data = as_datasets(
            data,
            origin="Trainer(data=...) got",
            check_hint="pass the datasets to train on as Trainer(data=(train, val))",
        )
        self.num_workers, self.worker_init = num_workers, worker_init
        self.cpu_count = cpu_count or len(os.sched_getaffinity(0))
        if gpu_model is None and session.device.type == "cuda":
            gpu_model = torch.cuda.get_device_name(session.device)
        self.gpu_model = gpu_model
        self.requests = requests
        # Whether model and data were built by the config's factories (`trainbox run`): then
        # config.yaml records them as named; else `recorded` says the API passed objects.
        self.from_factories = from_factories

    def fit(self) -> dict[str, Any]:
        """Check the data fits the model, agree with the peers, train, write the outputs."""
        # Before the first forward: cuBLAS reads its workspace setting when it starts.
        determinism.apply(self.config.train.deterministic)
        loss = self.config.train.loss
        if self.seams.user_step:
            probe(self.seams.step, self.model, self.data.train)
        else:
            check_fit(self.model, self.data, loss=lambda out, target: loss_fn(loss, out, target))
        agree_with_peers(
            self.config, self.session, cpu_count=self.cpu_count, gpu_model=self.gpu_model
        )
        # A script gets preemption handling for the duration of fit; the CLI has its own.
        requests = self.requests or preempt.Requests()
        restore = None if self.requests else requests.install()
        try:
            with self._watchdog() as watch:
                result = self._fit(requests, watch)
        finally:
            if restore:
                restore()
        if "stopped" in result:
            # Leave together: a rank tearing down while a peer still talks to it upsets gloo.
            torch.distributed.barrier()
            raise Stopped(
                f"stopped after step {result['steps']} ({result['stopped']}); checkpoint"
                f" {result['checkpoint']}",
                hint="run the same command again to resume from it (the sbatch scripts requeue"
                " the job; Kubeflow restarts the pod on exit code 143)",
            )
        return result

    def _fit(self, requests: preempt.Requests, watch: watchdog.Watchdog) -> dict[str, Any]:
        context, config = self.session.context, self.config
        setup = Setup(
            # config.yaml records where model and data came from; that is not a default factory.
            config=config if self.from_factories else recorded(config),
            context=context,
            device=self.session.device,
            model=self.model,
            data=self.data,
            num_workers=self.num_workers,
            worker_init=self.worker_init,
            hooks=Hooks(
                requests=requests,
                deadline_at=preempt.deadline(os.environ, margin_s=config.train.deadline_margin_s),
                mark=watch.mark,
                faults=faults.from_env(os.environ, rank=context.rank),
            ),
            seams=self.seams,
            eval_step=self.eval_step,
        )
        loop = TrainingLoop(setup)
        try:
            return loop.fit()
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
            loop.close()

    def _watchdog(self) -> watchdog.Watchdog:
        context, timeout_s = self.session.context, self.session.timeout_s
        return watchdog.Watchdog(
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
        )


def recorded(config: Config) -> Config:
    """The config a run through the API writes: a factory it never called is not recorded.

    The API trains the objects it was given. A factory the config leaves at the built-in
    default would claim the built-in task trained; `<api>` says no factory builds them, so
    `trainbox eval` asks for one instead of rebuilding the wrong model. A factory the config
    names is kept: the user declares that it builds the same objects.
    """
    defaults = configuration.Config()
    model, data = config.model, config.data
    if model.factory == defaults.model.factory:
        model = dataclasses.replace(model, factory=API_SUPPLIED)
    if data.factory == defaults.data.factory:
        data = dataclasses.replace(data, factory=API_SUPPLIED)
    return dataclasses.replace(config, model=model, data=data)


def _die_of_hang(message: str) -> None:
    """Runs on the watchdog thread while the main thread is stuck: this process ends here."""
    error = DistributedError(message, hint=HANG_HINT)
    print(f"trainbox: error: {error.line()}", file=sys.stderr, flush=True)
    supervise.report(os.environ, error.exit_code)
    # The main thread cannot be interrupted inside a C++ collective; only an exit ends it.
    os._exit(error.exit_code)
