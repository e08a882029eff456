"""An embedding per categorical token, concatenated with the numbers, then an MLP."""

from __future__ import annotations

import torch
from torch import nn

from churn.data import FIELDS, NUMERIC, VOCAB


class ChurnNet(nn.Module):
    """(tokens [B, 6], numeric [B, 4]) -> logits [B, 2]."""

    def __init__(self, *, dim: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.mlp = nn.Sequential(
            nn.Linear(FIELDS * dim + NUMERIC, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, 2),
        )

    def forward(self, tokens: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        embedded = self.embed(tokens).flatten(1)
        # Under bf16 autocast the embedding stays float32: match it before concatenating.
        return self.mlp(torch.cat([embedded, numeric.to(embedded.dtype)], dim=1))


def model(*, dim: int = 8, hidden: int = 64) -> nn.Module:
    """The churn classifier."""
    return ChurnNet(dim=dim, hidden=hidden)
