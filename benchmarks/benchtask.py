"""Model and data factories shared by trainbox runs and the raw loops of the benchmarks.

trainbox loads them as `model.factory=benchtask:model data.factory=benchtask:data` (the
benchmarks put this directory on PYTHONPATH); benchmarks/raw_ddp.py imports the same functions,
so both sides train the same network on the same samples.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from trainbox.tasks.mlp import mlp
from trainbox.train.data.contract import Datasets

# A small MLP (about 22k parameters): so little compute that per-step overhead shows.
MODEL_ARGS = {"in_features": 32, "classes": 10, "hidden": 128, "layers": 2}
DATA_ARGS = {"size": 16384, "in_features": 32, "classes": 10}


def model(
    *, in_features: int = 32, classes: int = 10, hidden: int = 128, layers: int = 2
) -> torch.nn.Module:
    """`layers` hidden ReLU layers of width `hidden`, then class logits."""
    return mlp(in_features=in_features, out_features=classes, hidden=hidden, layers=layers)


def data(*, size: int = 16384, in_features: int = 32, classes: int = 10, seed: int = 0) -> Datasets:
    """Random features with labels a fixed random linear map assigns (learnable, seeded).

    No validation set: the benchmarks time training steps only.
    """
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, in_features, generator=generator)
    teacher = torch.randn(in_features, classes, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return Datasets(train=TensorDataset(inputs, labels), val=None, max_workers=0)


def overrides(model_args: dict[str, int], data_args: dict[str, int]) -> list[str]:
    """trainbox config overrides that select these factories with these arguments."""
    return [
        "model.factory=benchtask:model",
        "data.factory=benchtask:data",
        *(f"model.args.{key}={value}" for key, value in model_args.items()),
        *(f"data.args.{key}={value}" for key, value in data_args.items()),
    ]
