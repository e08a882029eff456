"""A small fully convolutional net: a heatmap of where the blob is, and a presence logit."""

from __future__ import annotations

import torch
from torch import nn

# The heatmap has one cell per STRIDE x STRIDE pixels of the tile.
STRIDE = 4


def conv(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.GroupNorm(4, c_out),
        nn.ReLU(),
    )


class Locator(nn.Module):
    """[B, 4, 64, 64] -> {"heatmap": [B, 16, 16], "presence": [B] logits}."""

    def __init__(self, *, in_channels: int = 4, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv(in_channels, width, 2),
            conv(width, 2 * width, 2),
            conv(2 * width, 2 * width, 1),
        )
        self.heatmap = nn.Conv2d(2 * width, 1, 1)
        # Presence reads the strongest feature responses and the heatmap's own peak.
        self.presence = nn.Linear(2 * width + 1, 1)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.body(image)
        heatmap = self.heatmap(features).squeeze(1)
        # Max pooling, not mean: the blob may be in any corner and covers few cells.
        peaks = torch.cat([features.amax(dim=(2, 3)), heatmap.amax(dim=(1, 2))[:, None]], dim=1)
        return {"heatmap": heatmap, "presence": self.presence(peaks).squeeze(1)}


def model(*, in_channels: int = 4, width: int = 16) -> nn.Module:
    """The locator network."""
    return Locator(in_channels=in_channels, width=width)
