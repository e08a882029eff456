"""Evaluation and prediction in the precision the checkpoint trained in."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainbox.train import objective


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The trainer's mixed precision for `train.amp` (auto: bf16 on a GPU that has it)."""
    # The trainer's own rule, so a checkpoint is evaluated in the precision it trained in.
    return objective.autocast(objective.amp_dtype(amp, device), device)
