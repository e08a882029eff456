"""A user's own training code, as a package that knows nothing of trainbox (issue 14).

tests/dist/test_your_training.py copies this file into a temporary package on PYTHONPATH and
names its functions in config: dict batches, a step with extra scalars, a param-group optimizer,
a one-cycle schedule, an EMA kept beside the model, and deliberately bad variants of each.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, width), nn.Tanh())
        self.head = nn.Linear(width, 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(features))


class Wrapped(nn.Module):
    """Net under `net.`: init_from with init_prefix=net takes its weights into a plain Net."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


def wrapped() -> nn.Module:
    return Wrapped()


def plain(width: int = 16) -> nn.Module:
    return Net(width)


class Records:
    """Samples as dicts: features, a class label, a per-sample weight and a name (not a tensor)."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, 4, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long() + (self.x[:, 0] > 1).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "features": self.x[index],
            "label": self.y[index],
            "weight": torch.tensor(1.0),
            "name": f"record-{index}",
        }


def records(size: int = 512) -> tuple[Records, None]:
    return Records(size), None


def step(model: nn.Module, batch: dict[str, Any]) -> Any:
    assert isinstance(batch["name"][0], str)  # non-tensor leaves arrive as the collate made them
    logits = model(batch["features"])
    losses = F.cross_entropy(logits, batch["label"], reduction="none")
    loss = (losses * batch["weight"]).mean()
    accuracy = (logits.argmax(dim=-1) == batch["label"]).float().mean()
    return loss, {"train_accuracy": accuracy.detach(), "constant": 2.0}


def groups(model: nn.Module, lr: float, head_lr: float) -> torch.optim.Optimizer:
    body, head = model.net.body, model.net.head  # type: ignore[union-attr]
    return torch.optim.SGD(
        [{"params": body.parameters(), "lr": lr}, {"params": head.parameters(), "lr": head_lr}],
        lr=lr,
        momentum=0.9,
    )


def one_group(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def tensor_lr(model: nn.Module) -> torch.optim.Optimizer:
    # torch accepts a 0-d tensor as the learning rate (for capturable and fused optimizers).
    return torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))


def one_cycle(optimizer: torch.optim.Optimizer, max_steps: int, peak: float) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peak, total_steps=max_steps)


class Ema:
    """Exponential moving average of the weights, updated after every optimizer step."""

    def __init__(self, model: nn.Module, decay: float = 0.8) -> None:
        self.model, self.decay, self.updates = model, decay, 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def after_step(self, step: int) -> None:
        self.updates += 1
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                self.shadow[key].mul_(self.decay).add_(value, alpha=1 - self.decay)

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = {k: v.clone() for k, v in state["shadow"].items()}
        self.updates = state["updates"]


def ema(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"ema": Ema(model)}


CALLS = {"n": 0}


def nan_later(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Finite for a while, then NaN: the run must stop and keep its last good checkpoint."""
    CALLS["n"] += 1
    loss = F.cross_entropy(model(batch["features"]), batch["label"])
    return loss * float("nan") if CALLS["n"] > 14 else loss


# Bad user code: each must be one exit-2 line naming the function.
def vector_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["features"]), batch["label"], reduction="none")


def rank_named(model: nn.Module, batch: dict[str, Any]) -> Any:
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return F.cross_entropy(model(batch["features"]), batch["label"]), {f"rank{rank}": 1.0}


def not_an_optimizer(model: nn.Module) -> str:
    return "adam"


def not_a_schedule(optimizer: torch.optim.Optimizer, max_steps: int) -> None:
    return None


def not_a_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[int]:
    return [1]
