"""`train.deterministic`: the one place both `trainbox run` and `trainbox.Trainer` apply it."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

# torch raises on a deterministic cuBLAS matmul unless this is set before cuBLAS starts; the
# larger of the two documented values costs ~24 MiB of GPU memory and is the faster one.
CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE = ":4096:8"


def env_updates(env: Mapping[str, str]) -> dict[str, str]:
    """The variables deterministic mode needs that `env` lacks (a user's own value is kept)."""
    return {} if env.get(CUBLAS_VARIABLE) else {CUBLAS_VARIABLE: CUBLAS_WORKSPACE}


def apply(enabled: bool) -> None:
    """Switch on deterministic kernels (and cuBLAS's workspace) when enabled; else leave all be."""
    if not enabled:
        # Off means "not asked for": a script's own torch settings stay as they are.
        return
    os.environ.update(env_updates(os.environ))
    torch.use_deterministic_algorithms(True)
    # cudnn.benchmark picks kernels by timing them, so two runs may pick different ones.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
