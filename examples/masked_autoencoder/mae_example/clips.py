"""Synthetic clips (T x C x H x W) mixed from a few moving textures, plus noise.

Every clip is sum_k z_k * pattern_k + noise: the few latent weights z explain most of it, so a
model that learns to fill in masked parts of clips has learned z, and the label of a clip (the
texture with the largest weight) is then easy to read from few labelled clips.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

SHAPE = (4, 2, 8, 8)  # frames, channels, height, width
PATTERNS = 4  # latent textures, each moving its own way; also the number of classes
STEPS = ((0, 1), (1, 0), (0, -1), (1, 1))  # (dy, dx) per frame of each texture


def patterns(seed: int) -> torch.Tensor:
    """PATTERNS smooth random textures, each rolled along its own direction frame by frame."""
    generator = torch.Generator().manual_seed(seed)
    frames, channels, height, width = SHAPE
    rough = torch.randn(PATTERNS, channels, height, width, generator=generator)
    # A 3x3 box blur (circular) makes textures, not pixel noise, so neighbours predict each other.
    smooth = sum(rough.roll((dy, dx), dims=(2, 3)) for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    smooth = smooth / smooth.flatten(1).std(dim=1).view(-1, 1, 1, 1)
    moving = [
        torch.stack([texture.roll((t * dy, t * dx), dims=(1, 2)) for t in range(frames)])
        for texture, (dy, dx) in zip(smooth, STEPS, strict=True)
    ]
    return torch.stack(moving)  # PATTERNS x T x C x H x W


class Clips(Dataset):
    """`size` clips with their labels and, for pretraining, a fixed per-clip token mask."""

    def __init__(self, size: int, *, seed: int, noise: float, tokens: int, masked: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        # One texture leads each clip (its label); the others leak in faintly.
        self.labels = torch.randint(PATTERNS, (size,), generator=generator)
        weights = 0.3 * torch.randn(size, PATTERNS, generator=generator)
        weights[torch.arange(size), self.labels] += 1.0
        # The patterns are shared by every split: they come from a seed of their own.
        mixed = torch.einsum("nk,kthcw->nthcw", weights, patterns(seed=0))
        self.clips = mixed + noise * torch.randn(size, *SHAPE, generator=generator)
        # Drawn here, not in forward: the same clip gets the same mask on every rank and resume.
        order = torch.rand(size, tokens, generator=generator).argsort(dim=1)
        self.masks = order < masked

    def __len__(self) -> int:
        return len(self.clips)


class Unlabelled(Clips):
    """Pretraining items: {"clip", "mask"}, the model's keyword arguments."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"clip": self.clips[index], "mask": self.masks[index]}


class Labelled(Clips):
    """Fine-tuning items: (clip, label) pairs."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.clips[index], self.labels[index]
