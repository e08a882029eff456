"""What the training loop is given by the layer above it (api.Trainer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainbox.config import Config
from trainbox.factories import Datasets
from trainbox.launch.context import LaunchContext
from trainbox.train.hooks import Hooks
from trainbox.train.objective import Step
from trainbox.train.seams import Seams


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """Everything the loop needs that the outer layer decided."""

    # The resolved run configuration.
    config: Config
    # Where this process sits in the job.
    context: LaunchContext
    # This rank's device.
    device: torch.device
    # The model as the factory built it (identical on every rank: same seed).
    model: torch.nn.Module
    # Train and validation datasets from the data factory.
    data: Datasets
    # DataLoader workers per rank (the pinning plan's), and their start-up hook.
    num_workers: int = 0
    worker_init: Callable[[int], None] | None = None
    # Watchdog marks, the stop vote's inputs (signals, deadline) and test faults.
    hooks: Hooks = field(default_factory=Hooks)
    # User code at the named seams (train.step, optim.factory...); None: from the config's keys.
    seams: Seams | None = None
    # What validation measures; None: `train.eval_step` of the config (or the built-in one).
    eval_step: Step | None = None
