"""Synthetic tiles: noise in 4 channels, and in half of them a Gaussian blob at a random position.

Every tile is a pure function of (seed, index), so every rank and every restart sees the same
samples, and a tile is drawn only when asked for (no dataset held in memory).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

SIZE = 64
CHANNELS = 4


class Tiles(Dataset):
    """Item i: {"image": [4, 64, 64], "present": 0.0 or 1.0, "position": [x, y] in pixels}."""

    def __init__(self, size: int, *, seed: int, noise: float, sigma: float) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.size, self.seed, self.noise, self.sigma = size, seed, noise, sigma
        # Exactly half the tiles hold a blob, in a seeded order.
        self.present = (torch.randperm(size, generator=gen) < size // 2).float()
        # Centres keep the blob's core inside the tile; absent tiles keep theirs (unused).
        margin = 2 * sigma
        self.position = margin + (SIZE - 1 - 2 * margin) * torch.rand(size, 2, generator=gen)
        # Each channel sees the blob with its own strength, so no single channel is enough.
        self.strength = 0.7 + 0.8 * torch.rand(size, CHANNELS, generator=gen)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        # A generator of its own per tile: the same pixels whichever rank or epoch asks.
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = self.noise * torch.randn(CHANNELS, SIZE, SIZE, generator=gen)
        if self.present[index]:
            blob = gaussian(self.position[index], sigma=self.sigma, size=SIZE)
            image += self.strength[index].view(CHANNELS, 1, 1) * blob
        return {
            "image": image,
            "present": self.present[index],
            "position": self.position[index],
        }


def gaussian(centre: torch.Tensor, *, sigma: float, size: int) -> torch.Tensor:
    """A [size, size] Gaussian of peak 1 at centre (x, y), in the units of the grid."""
    grid = torch.arange(size, dtype=torch.float32)
    dx = (grid - centre[0]) ** 2
    dy = (grid - centre[1]) ** 2
    return torch.exp(-(dy[:, None] + dx[None, :]) / (2 * sigma**2))


def data(
    *,
    train_size: int = 4096,
    val_size: int = 499,
    noise: float = 1.0,
    sigma: float = 2.0,
    seed: int = 2024,
) -> tuple[Tiles, Tiles]:
    """Train and validation tiles from different seeds: validation is on unseen tiles."""
    train = Tiles(train_size, seed=seed, noise=noise, sigma=sigma)
    val = Tiles(val_size, seed=seed + 1, noise=noise, sigma=sigma)
    return train, val
