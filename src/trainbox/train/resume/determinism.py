"""What makes a run repeat itself: seeds, RNG state saved and restored, deterministic kernels.

Seeds give every rank the same initial weights and each rank its own dropout stream; a
checkpoint carries every rank's RNG state so a resume continues the same streams; and
`train.deterministic` switches on the kernels that add in a fixed order.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
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


def step_seed(seed: int, rank: int, step: int) -> int:
    """The stream a rank draws from in step `step` under dist.recovery=in_process: a process
    that takes the rank over mid-run rebuilds it from the step alone."""
    # Another large odd stride per step, on top of the rank's: two (rank, step) pairs share a
    # stream only if their ranks differ by a multiple of 2,000,003.
    return (rank_seed(seed, rank) + 2_000_003 * step) % 2**63


def seed_step(seed: int, rank: int, step: int, device: torch.device) -> None:
    """Seed Python, NumPy, torch's CPU stream and this rank's GPU for step `step` (step_seed)."""
    value = step_seed(seed, rank, step)
    random.seed(value)
    np.random.seed(value % 2**32)
    # The generators themselves: torch.manual_seed also visits every other device kind, which
    # took 130 us a call here against 1.4 us.
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(value)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states, in a form `torch.load(weights_only=True)` accepts."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _plain(random.getstate()),
        "numpy": _numpy_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what `capture_rng` took."""
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
        # Only MT19937 has the legacy tuple that a checkpoint records and `restore_rng` sets back.
        raise UsageError(
            f"NumPy's global bit generator is {state.get('bit_generator')}, not MT19937",
            hint="leave np.random's generator as it is; draw from your own np.random.Generator",
        )
    kind, keys, pos, has_gauss, cached = state
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]


# torch raises on a deterministic cuBLAS matmul unless this is set before cuBLAS starts; the
# larger of the two documented values costs ~24 MiB of GPU memory and is the faster one.
CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE = ":4096:8"


def env_updates(env: Mapping[str, str]) -> dict[str, str]:
    """The variables deterministic mode needs that `env` lacks (a user's own value is kept)."""
    return {} if env.get(CUBLAS_VARIABLE) else {CUBLAS_VARIABLE: CUBLAS_WORKSPACE}


def use_deterministic_kernels(enabled: bool) -> None:
    """Switch on deterministic kernels (and cuBLAS's workspace) when enabled; else leave all be."""
    if not enabled:
        # Off means "not asked for": a script's own torch settings stay as they are.
        return
    os.environ.update(env_updates(os.environ))
    torch.use_deterministic_algorithms(True)
    # cudnn.benchmark picks kernels by timing them, so two runs may pick different ones.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
