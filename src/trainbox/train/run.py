"""Assemble a training run from config and launch context, then fit it inside the process group."""

from __future__ import annotations

from typing import Any

import torch

from trainbox import dist, factories
from trainbox.config import Config
from trainbox.launch.context import LaunchContext
from trainbox.train import seeding
from trainbox.train.evaluate import loss_fn
from trainbox.train.trainer import Setup, Trainer


def train(config: Config, context: LaunchContext) -> dict[str, Any]:
    """Build model and data, join the process group, train; returns the summary."""
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
    backend = dist.choose_backend(config.dist.backend, cuda=device.type == "cuda")
    with dist.process_group(
        context, backend=backend, timeout_s=config.dist.timeout_s, device=device
    ):
        setup = Setup(config=config, context=context, device=device, model=model, data=data)
        return Trainer(setup).fit()
