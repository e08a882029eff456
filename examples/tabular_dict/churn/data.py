"""Synthetic customer records: {"tokens": 6 categorical fields, "numeric": 4 numbers, "label"}.

A hidden scoring rule (an effect per category, weights on the numbers and one interaction)
decides the label, with noise, so no model can be perfect. Everything is drawn from `seed`.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

FIELDS = 6  # plan, region, device, channel, payment, support tier
VALUES = 8  # categories per field
NUMERIC = 4  # tenure, monthly spend, logins, tickets (standardised)
VOCAB = FIELDS * VALUES  # one id space: field f's value v is token f * VALUES + v


class Rule:
    """The hidden score of a record; the same for train and validation (one `seed`)."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.effects = 1.5 * torch.randn(VOCAB, generator=gen)
        self.weights = torch.randn(NUMERIC, generator=gen)
        # The mean score over all records: the threshold that makes about half of them churn.
        self.mean = self.effects.view(FIELDS, VALUES).mean(dim=1).sum()

    def score(self, tokens: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        # An interaction (spend x tickets) a linear model would miss.
        interaction = 1.5 * numeric[:, 1] * numeric[:, 3]
        return self.effects[tokens].sum(dim=1) + numeric @ self.weights + interaction


class Records(Dataset):
    """Item i: {"tokens": int64 [6], "numeric": float32 [4], "label": int64 (1: churns)}."""

    def __init__(self, size: int, *, rule: Rule, noise: float, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        values = torch.randint(VALUES, (size, FIELDS), generator=gen)
        self.tokens = values + VALUES * torch.arange(FIELDS)
        self.numeric = torch.randn(size, NUMERIC, generator=gen)
        score = rule.score(self.tokens, self.numeric)
        noisy = score + noise * torch.randn(size, generator=gen)
        self.label = (noisy > rule.mean).long()

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "tokens": self.tokens[index],
            "numeric": self.numeric[index],
            "label": self.label[index],
        }


def data(
    *, train_size: int = 8192, val_size: int = 1001, noise: float = 2.0, seed: int = 7
) -> tuple[Records, Records]:
    """Train and validation records under one hidden rule, drawn from different seeds."""
    rule = Rule(seed)
    train = Records(train_size, rule=rule, noise=noise, seed=seed + 1)
    val = Records(val_size, rule=rule, noise=noise, seed=seed + 2)
    return train, val
