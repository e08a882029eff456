"""Learning-rate policy: scaling by world size, warmup, then cosine or constant."""

from __future__ import annotations

import math


def scaled_lr(base: float, *, world_size: int, grad_accum: int, mode: str) -> float:
    """The peak lr after scaling by the number of samples an optimizer step sees."""
    factor = world_size * grad_accum
    if mode == "linear":
        return base * factor
    if mode == "sqrt":
        return base * math.sqrt(factor)
    return base


def lr_factor(step: int, *, warmup: int, total: int, kind: str, min_ratio: float) -> float:
    """Multiplier on the peak lr for optimizer step `step` (0-based)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
