"""The training seams: the step on dict batches, metrics, prediction columns, and an EMA.

Each function is named in config.yaml (`train.step: churn.train:step`, ...).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

Batch = dict[str, torch.Tensor]


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """float32 logits whatever the autocast dtype, so losses and probabilities are float32."""
    return model(batch["tokens"], batch["numeric"]).float()


def step(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy on the label; the batch's accuracy is logged beside the loss."""
    out = logits(model, batch)
    accuracy = (out.argmax(dim=1) == batch["label"]).float().mean()
    return F.cross_entropy(out, batch["label"]), {"train_accuracy": accuracy.detach()}


def eval_step(model: nn.Module, batch: Batch) -> dict[str, tuple[Any, Any]]:
    """Accuracy and log loss, each summed over the batch's records and counted in records."""
    out = logits(model, batch)
    correct = (out.argmax(dim=1) == batch["label"]).sum()
    log_loss = F.cross_entropy(out, batch["label"], reduction="sum")
    return {"accuracy": (correct, len(out)), "log_loss": (log_loss.double(), len(out))}


def predict_step(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Per record: the churn probability and the predicted label."""
    probability = torch.softmax(logits(model, batch), dim=1)[:, 1]
    return {"churn_probability": probability, "churns": (probability > 0.5).long()}


def whole(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor: under train.strategy=fsdp a weight is a DTensor holding this rank's
    shard, and a checkpoint keeps user state whole (every rank gathers it: a collective)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


class Ema:
    """An exponential moving average of the weights, updated after every optimizer step.

    Deploy `shadow` rather than the raw weights: it averages out the last steps' noise.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model, self.decay, self.updates = model, decay, 0
        self.shadow = {k: whole(v).detach().clone() for k, v in model.state_dict().items()}

    def after_step(self, step: int) -> None:  # noqa: ARG002 (the count of its own suffices)
        self.updates += 1
        # Warm up the decay, so early shadows are not dominated by the random start.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                self.shadow[key].lerp_(whole(value), 1 - decay)

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow, "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = {k: v.clone() for k, v in state["shadow"].items()}
        self.updates, self.decay = state["updates"], state["decay"]


def state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:  # noqa: ARG001
    """State kept beside the model in every checkpoint."""
    return {"ema": Ema(model, decay=0.99)}
