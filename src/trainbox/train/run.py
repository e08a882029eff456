"""Assemble a training run from config and the prepared process; fit it in the process group."""

from __future__ import annotations

import os
from typing import Any

import torch

from trainbox import affinity, dist, factories, peers
from trainbox import config as configuration
from trainbox.bootstrap import Prepared
from trainbox.config import Config
from trainbox.train import seeding
from trainbox.train.evaluate import loss_fn
from trainbox.train.trainer import Setup, Trainer


def train(config: Config, prepared: Prepared) -> dict[str, Any]:
    """Build model and data, join the process group, agree with the peers, train."""
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
    with dist.process_group(
        context, backend=backend, timeout_s=config.dist.timeout_s, device=device
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
        )
        trainer = Trainer(setup)
        try:
            return trainer.fit()
        finally:
            trainer.close()
