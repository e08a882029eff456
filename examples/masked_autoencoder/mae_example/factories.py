"""What the configs name: models, data, steps, optimizer. Plain torch, no trainbox import."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mae_example.clips import Labelled, Unlabelled
from mae_example.nets import Classifier, MaskedAutoencoder, token_count


def pretrain_model(width: int = 48, depth: int = 2, heads: int = 4) -> nn.Module:
    return MaskedAutoencoder(width, depth, heads)


def finetune_model(width: int = 48, depth: int = 2, heads: int = 4) -> nn.Module:
    return Classifier(width, depth, heads)


def unlabelled(size: int = 4096, noise: float = 2.0, mask_ratio: float = 0.5, seed: int = 1) -> Any:
    """Pretraining clips, no validation split."""
    masked = round(mask_ratio * token_count())
    return Unlabelled(size, seed=seed, noise=noise, tokens=token_count(), masked=masked), None


def labelled(train_size: int = 24, val_size: int = 1000, noise: float = 2.0, seed: int = 2) -> Any:
    """Few labelled clips to fine-tune on, many to validate on (other seeds than pretraining's)."""
    split = {"noise": noise, "tokens": token_count(), "masked": 0}
    return Labelled(train_size, seed=seed, **split), Labelled(val_size, seed=seed + 1000, **split)


def pretrain_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    """The model computes its own loss: the whole step is calling it."""
    return model(**batch)


def optimizer(
    model: nn.Module, *, lr: float, head_lr: float | None = None, weight_decay: float = 0.0
) -> Any:
    """AdamW; a fine-tune's `head` (new) may learn faster (head_lr) than the pretrained rest."""
    head = [p for name, p in model.named_parameters() if name.startswith("head.")]
    rest = [p for name, p in model.named_parameters() if not name.startswith("head.")]
    groups = [{"params": rest, "lr": lr}]
    if head:
        groups.append({"params": head, "lr": lr if head_lr is None else head_lr})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def accuracy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """Correct clips and clips seen: trainbox sums both over ranks, then divides.

    Integer counts add up exactly in any order, so val_accuracy is the same at every world size.
    """
    clips, labels = batch
    correct = (model(clips).argmax(dim=1) == labels).sum()
    return {"accuracy": (correct, len(labels))}


def predict(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """One row per clip: the predicted texture, then a probability per texture."""
    clips, _ = batch
    probabilities = model(clips).softmax(dim=1)
    return {"label": probabilities.argmax(dim=1), "probability": probabilities}
