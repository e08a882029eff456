"""Seeds and RNG state: the same weights on every rank, distinct dropout per rank, exact resume."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from trainbox.errors import UsageError


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) with one value."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The stream a rank draws dropout and augmentation from, distinct per rank."""
    # A large odd stride keeps rank streams apart even for neighbouring base seeds.
    return (seed + 1_000_003 * (rank + 1)) % 2**63


def capture() -> dict[str, Any]:
    """This process's RNG states, in a form `torch.load(weights_only=True)` accepts."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _plain(random.getstate()),
        "numpy": _numpy_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back what `capture` took."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain(python_state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = python_state
    return [version, list(internal), gauss]


def _numpy_state() -> list[Any]:
    state = np.random.get_state(legacy=True)
    if not isinstance(state, tuple):
        # Only MT19937 has the legacy tuple that a checkpoint records and `restore` sets back.
        raise UsageError(
            f"NumPy's global bit generator is {state.get('bit_generator')}, not MT19937",
            hint="leave np.random's generator as it is; draw from your own np.random.Generator",
        )
    kind, keys, pos, has_gauss, cached = state
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
