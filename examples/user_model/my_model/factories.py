"""Factories trainbox calls by name (`my_model.factories:model`, `my_model.factories:data`).

Nothing here imports trainbox: a model factory returns a `torch.nn.Module`, a data factory
returns `(train, val)` map-style datasets whose items are `(inputs, target)` pairs.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset

# The four kinds of signal the model learns to tell apart; the target is the index in here.
REGIMES = ("slow", "fast", "chirp", "burst")


class Signals(Dataset):
    """Noisy 1-D signals, one regime each, generated once from `seed`; item i is (x [1, L], y)."""

    def __init__(self, size: int, *, length: int, noise: float, seed: int) -> None:
        # A private generator: the same seed gives the same data on every rank and in every run,
        # whatever else has touched torch's global RNG.
        gen = torch.Generator().manual_seed(seed)

        def uniform(low: float, high: float) -> torch.Tensor:
            return low + (high - low) * torch.rand(size, 1, generator=gen)

        t = torch.linspace(0.0, 1.0, length).expand(size, length)
        self.targets = torch.randint(len(REGIMES), (size,), generator=gen)
        slow, fast = uniform(1.5, 3.0), uniform(6.0, 10.0)
        phase, amplitude = uniform(0.0, 2 * math.pi), uniform(0.5, 1.5)
        centre = uniform(0.2, 0.8)
        waves = torch.stack(
            [
                torch.sin(2 * math.pi * slow * t + phase),
                torch.sin(2 * math.pi * fast * t + phase),
                # Frequency sweeps from `slow` at the start to `fast` at the end.
                torch.sin(2 * math.pi * (slow * t + (fast - slow) * t**2 / 2) + phase),
                torch.sin(2 * math.pi * fast * t + phase) * torch.exp(-(((t - centre) / 0.1) ** 2)),
            ]
        )
        chosen = waves[self.targets, torch.arange(size)]
        signal = amplitude * chosen + noise * torch.randn(size, length, generator=gen)
        self.inputs = signal.unsqueeze(1).float()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def data(
    *,
    train_size: int = 4000,
    val_size: int = 1000,
    length: int = 128,
    noise: float = 1.0,
    seed: int = 1234,
) -> tuple[Signals, Signals]:
    """Train and validation sets from different seeds, so validation is on unseen signals."""
    train = Signals(train_size, length=length, noise=noise, seed=seed)
    val = Signals(val_size, length=length, noise=noise, seed=seed + 1)
    return train, val


class ResidualBlock(nn.Module):
    """Two dilated convolutions added back onto their input."""

    def __init__(self, width: int, *, dilation: int, kernel_size: int = 5) -> None:
        super().__init__()
        padding = dilation * (kernel_size - 1) // 2
        self.body = nn.Sequential(
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size, padding=padding, dilation=dilation),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size, padding=padding, dilation=dilation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class SignalNet(nn.Module):
    """Stem conv, residual blocks with growing dilation, mean over time, linear head."""

    def __init__(self, *, in_channels: int, num_classes: int, width: int, blocks: int) -> None:
        super().__init__()
        self.stem = nn.Conv1d(in_channels, width, kernel_size=7, padding=3)
        self.blocks = nn.Sequential(*(ResidualBlock(width, dilation=2**i) for i in range(blocks)))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x))
        return self.head(torch.relu(features).mean(dim=-1))


def model(
    *, in_channels: int = 1, num_classes: int = len(REGIMES), width: int = 32, blocks: int = 3
) -> nn.Module:
    """The classifier: input [B, in_channels, L], output logits [B, num_classes]."""
    return SignalNet(in_channels=in_channels, num_classes=num_classes, width=width, blocks=blocks)
