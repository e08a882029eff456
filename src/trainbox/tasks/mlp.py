"""A plain multi-layer perceptron, the model factory for the built-in and tabular tasks."""

from __future__ import annotations

import torch
from torch import nn


def mlp(
    *, in_features: int, out_features: int, hidden: int = 128, layers: int = 2, dropout: float = 0.0
) -> nn.Module:
    """`layers` hidden layers of width `hidden` with ReLU (and dropout), then a linear head."""
    blocks: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU()]
        if dropout:
            blocks.append(nn.Dropout(dropout))
        width = hidden
    blocks.append(nn.Linear(width, out_features))
    return nn.Sequential(*blocks)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
