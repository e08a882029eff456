"""The Trainer: `trainbox run`'s loop, files and fingerprint for a joined Session."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from trainbox import watchdog
from trainbox.affinity import loader, worker_init
from trainbox.config import Config, factories
from trainbox.config.factories import API_SUPPLIED
from trainbox.distributed.process_group import Session
from trainbox.errors import PreflightError, Stopped, TrainboxError
from trainbox.health.fleet import Fleet
from trainbox.preflight.facts import GpuSurvey
from trainbox.process import bad_nodes, preempt
from trainbox.process.bootstrap import StartupFacts
from trainbox.runtime import group
from trainbox.testing import faults
from trainbox.train import evaluate
from trainbox.train.data import contract
from trainbox.train.data.contract import Datasets, as_datasets, check_fit
from trainbox.train.loop import LoopInputs, StoppedEarly, TrainingLoop
from trainbox.train.resume.determinism import seed_all, use_deterministic_kernels
from trainbox.train.resume.run_dir import TrainSummary
from trainbox.train.steps.functions import loss_fn, probe
from trainbox.train.steps.user_code import choose
from trainbox.train.watch.control import RunControl


def train(
    config: Config, prepared: StartupFacts, *, requests: preempt.StopRequests
) -> TrainSummary:
    """`trainbox run`'s work: build model and data from the config's factories, join, fit.

    Raises Stopped (exit 143) when a stop signal or the deadline ended training early, and
    PreflightError (exit 3) when a GPU fault did.
    """
    # Every rank seeds identically before building, so the initial weights agree everywhere.
    seed_all(config.seed)
    model = factories.build_model(config.model.factory, config.model.args)
    data = contract.build_data(config.data.factory, config.data.args)
    plan = loader.size_threads(
        prepared.plan,
        data.max_workers,
        auto_workers=config.pinning.num_workers == "auto",
        auto_threads=config.pinning.num_threads == "auto",
    )
    with group.init_distributed(
        prepared.context,
        backend=config.dist.backend,
        timeout_s=config.dist.timeout_s,
        plan=plan,
        run_dir=config.output_dir,
        flight_recorder_entries=config.dist.flight_recorder_entries,
    ) as session:
        trainer = Trainer(
            config,
            session,
            model=model,
            data=data,
            num_workers=plan.num_workers if plan else 0,
            worker_init=worker_init(plan) if plan else None,
            cpu_count=plan.budget if plan else None,
            gpu_model=group.own_gpu_model(prepared, session.device),
            survey=prepared.survey,
            requests=requests,
            from_factories=True,
        )
        return trainer.fit()


class Trainer:
    """Trains `model` on `data` in `session` with DDP: `trainbox run`'s loop, files and fingerprint.

    `fit()` returns the TrainSummary (also written to run_dir/summary.json) or raises Stopped (exit
    code 143) after a preemption checkpoint, PreflightError (exit 3) after a GPU fault's.
    `step`, `optim_factory`, `schedule_factory`, `state_factory` and `eval_step` are the
    objects behind the config keys `train.step`, `optim.factory`, `optim.schedule_factory`,
    `train.state_factory` and `train.eval_step` (a keyword wins over the key; see
    docs/your-model.md). The other keyword-only extras are
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
        survey: GpuSurvey | None = None,
        requests: preempt.StopRequests | None = None,
        step: Callable[..., Any] | None = None,
        optim_factory: Callable[..., Any] | None = None,
        schedule_factory: Callable[..., Any] | None = None,
        state_factory: Callable[..., Any] | None = None,
        eval_step: Callable[[Any, Any], Any] | None = None,
        from_factories: bool = False,
    ) -> None:
        self.config, self.session = config, session
        # Resolved now: a config key naming missing code is an exit 2 before anything runs.
        self.user_code = choose(
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
        # NVML's GPUs for this process: telemetry samples this rank's one (none: the process).
        self.survey = survey or GpuSurvey()
        self.requests = requests
        # Whether model and data were built by the config's factories (`trainbox run`): then
        # config.yaml records them as named; else `recorded` says the API passed objects.
        self.from_factories = from_factories

    def fit(self) -> TrainSummary:
        """Check the data fits the model, agree with the peers, train, write the outputs."""
        # Before the first forward: cuBLAS reads its workspace setting when it starts.
        use_deterministic_kernels(self.config.train.deterministic)
        loss = self.config.train.loss
        # The start-up checks run where training will: a large model's probe on the CPU delayed
        # the first step by seconds (docs/gpu-proof.md), where its GPU takes milliseconds.
        device = self.session.device
        self.model.to(device)
        if self.user_code.user_step:
            probe(self.user_code.step, self.model, self.data.train, device=device)
        else:
            check_fit(self.model, self.data, loss=lambda out, target: loss_fn(loss, out, target),
                      device=device)  # fmt: skip
        if self.session.promotion is None:
            # A spare taking over mid-run skips it: the survivors agreed at start-up and its
            # image, config and node are its predecessor's.
            group.agree_with_peers(
                self.config, self.session, cpu_count=self.cpu_count, gpu_model=self.gpu_model
            )
        # A script gets preemption handling for the duration of fit; the CLI has its own.
        requests = self.requests or preempt.StopRequests()
        restore = None if self.requests else requests.install()
        context, device = self.session.context, self.session.device
        # A GPU fault it sees becomes this rank's stop request: the vote stops every rank.
        fleet = Fleet.for_rank(
            self.config.health,
            rank=context.rank,
            device=device,
            survey=self.survey,
            # The survey lists GPUs in CUDA's order; a CPU rank follows its local rank.
            gpu_ordinal=device.index if device.type == "cuda" else context.local_rank,
            on_fault=requests.fault,
        )
        try:
            fleet.start()
            with group.hang_watchdog(self.session, run_dir=self.config.output_dir) as watch:
                result = self._fit(requests, watch, fleet)
        finally:
            fleet.stop()
            if restore:
                restore()
        if isinstance(result, StoppedEarly):
            # Leave together: a rank tearing down while a peer still talks to it upsets gloo.
            torch.distributed.barrier()
            raise self._stop_error(result, requests.gpu_fault)
        return result

    def _stop_error(self, stopped: StoppedEarly, gpu_fault: str | None) -> TrainboxError:
        """stop_error; a GPU fault this rank saw is recorded in run_dir/bad_nodes/ (only it can)."""
        context = self.session.context
        here = bad_nodes.node_name(os.environ)
        cordon = bad_nodes.cordon_hint(here, os.environ, flavor=context.flavor)
        error = stop_error(stopped, gpu_fault=gpu_fault, cordon=cordon)
        if gpu_fault and isinstance(error, PreflightError):
            record = bad_nodes.event(
                os.environ, reason=bad_nodes.GPU_FAULT, detail=gpu_fault,
                exit_code=error.exit_code, rank=context.rank, now=time.time(),
            )  # fmt: skip
            bad_nodes.write(self.config.output_dir, record)
        return error

    def _fit(
        self,
        requests: preempt.StopRequests,
        watch: watchdog.Watchdog,
        fleet: Fleet,
    ) -> TrainSummary | StoppedEarly:
        context, config = self.session.context, self.config
        setup = LoopInputs(
            # config.yaml records where model and data came from; that is not a default factory.
            config=config if self.from_factories else recorded(config),
            context=context,
            device=self.session.device,
            model=self.model,
            data=self.data,
            num_workers=self.num_workers,
            worker_init=self.worker_init,
            control=RunControl(
                requests=requests,
                deadline_at=preempt.deadline(os.environ, margin_s=config.train.deadline_margin_s),
                mark=watch.mark,
                faults=faults.from_env(os.environ, rank=context.rank),
            ),
            fleet=fleet,
            user_code=self.user_code,
            eval_step=self.eval_step,
            generations=self.session.generations,
            promotion=self.session.promotion,
        )
        loop = TrainingLoop(setup)
        try:
            with group.training_failures_said(context.rank, watch, flavor=context.flavor):
                return loop.fit()
        finally:
            loop.close()


def stop_error(stopped: StoppedEarly, *, gpu_fault: str | None, cordon: str = "") -> TrainboxError:
    """The error an agreed stop ends with: Stopped (exit 143) for a signal or the deadline,
    PreflightError (exit 3) naming the GPU and host for a GPU fault (`cordon`: Kubernetes' part
    of the hint, on the rank that saw it)."""
    done = f"stopped after step {stopped.step} ({stopped.reason}); checkpoint {stopped.checkpoint}"
    if stopped.reason != preempt.REASONS[preempt.GPU_FAULT]:
        return Stopped(
            done,
            hint="run the same command again to resume from it (the sbatch scripts requeue"
            " the job; Kubeflow restarts the pod on exit code 143)",
        )
    # Only the rank that saw the fault knows the GPU; the others point at its line.
    culprit = gpu_fault or "a GPU of another rank failed (its error line names GPU and host)"
    return PreflightError(
        f"{done}: {culprit}",
        hint="run the same command again without that GPU's host: it resumes from the"
        " checkpoint (the sbatch scripts requeue the job without it, run_dir/bad_nodes/ names"
        " it); health.stop_on_gpu_fault=false only logs GPU faults" + (cordon if gpu_fault else ""),
    )


def recorded(config: Config) -> Config:
    """The config a run through the API writes: a factory it never called is not recorded.

    The API trains the objects it was given. A factory the config leaves at the built-in
    default would claim the built-in task trained; `<api>` says no factory builds them, so
    `trainbox eval` asks for one instead of rebuilding the wrong model. A factory the config
    names is kept: the user declares that it builds the same objects.
    """
    defaults = Config()
    model, data = config.model, config.data
    if model.factory == defaults.model.factory:
        model = dataclasses.replace(model, factory=API_SUPPLIED)
    if data.factory == defaults.data.factory:
        data = dataclasses.replace(data, factory=API_SUPPLIED)
    return dataclasses.replace(config, model=model, data=data)
