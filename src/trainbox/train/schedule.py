"""Learning-rate policy: scaling by world size, warmup, then cosine or constant."""

from __future__ import annotations

import math
from collections.abc import Callable


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
    return lr_factors(warmup=warmup, total=total, kind=kind, min_ratio=min_ratio)(step)


def lr_factors(*, warmup: int, total: int, kind: str, min_ratio: float) -> Callable[[int], float]:
    """lr_factor with its settings bound, their constant parts worked out once: the schedule
    calls it every optimizer step. The float operations are the same, so the lr is bit for bit."""
    span = max(1, total - warmup)
    constant = kind == "constant"
    half_range = (1 - min_ratio) * 0.5

    def factor(step: int) -> float:
        if step < warmup:  # never when warmup is 0: steps count from 0
            return (step + 1) / warmup
        if constant:
            return 1.0
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + half_range * (1 + math.cos(math.pi * progress))

    return factor
