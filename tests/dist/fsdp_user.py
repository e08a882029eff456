"""A user's state object beside a sharded model, as a package that knows nothing of trainbox.

tests/dist/test_fsdp_state.py copies this file onto PYTHONPATH and names `ema` in
`train.state_factory`: an exponential moving average of the whole weights, kept as full tensors
(the same on every rank), so a checkpoint's one copy of it is everyone's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class FullEma:
    """The weights' moving average as whole tensors, updated after every optimizer step."""

    def __init__(self, model: nn.Module, decay: float = 0.8) -> None:
        self.model, self.decay, self.updates = model, decay, 0
        self.shadow = self.whole()

    def whole(self) -> dict[str, torch.Tensor]:
        # full_tensor() gathers a parameter's shards: every rank calls it, every rank gets it.
        return {
            name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
            for name, value in self.model.state_dict().items()
        }

    def after_step(self, step: int) -> None:
        del step
        self.updates += 1
        for name, value in self.whole().items():
            self.shadow[name].mul_(self.decay).add_(value, alpha=1 - self.decay)

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = {name: value.clone() for name, value in state["shadow"].items()}
        self.updates = state["updates"]


def ema(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    del optimizer
    return {"ema": FullEma(model)}
