"""Model and data factories shared by trainbox runs and the raw loops of the benchmarks, and the
command lines that train them on either side.

trainbox loads them as `model.factory=benchtask:model data.factory=benchtask:data` (the
benchmarks put this directory on PYTHONPATH); benchmarks/raw_ddp.py imports the same functions,
so both sides train the same network on the same samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from trainbox.tasks.mlp import mlp
from trainbox.train.data.contract import Datasets

HERE = Path(__file__).resolve().parent
# A small MLP (about 22k parameters): so little compute that per-step overhead shows.
MODEL_ARGS = {"in_features": 32, "classes": 10, "hidden": 128, "layers": 2}
DATA_ARGS = {"size": 16384, "in_features": 32, "classes": 10}
# A trainbox run that only trains: no evaluation, no checkpoint but the last, no resume.
TRAIN_ONLY = ("train.eval_every=0", "train.ckpt_every=0", "train.resume=never")


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


def overrides(model_args: Mapping[str, int], data_args: Mapping[str, int]) -> list[str]:
    """trainbox config overrides that select these factories with these arguments."""
    return [
        "model.factory=benchtask:model",
        "data.factory=benchtask:data",
        *(f"model.args.{key}={value}" for key, value in model_args.items()),
        *(f"data.args.{key}={value}" for key, value in data_args.items()),
    ]


def trainbox_run(
    run_dir: Path | str,
    *,
    steps: int,
    model_args: Mapping[str, int] = MODEL_ARGS,
    data_args: Mapping[str, int] = DATA_ARGS,
    extra: Iterable[str] = (),
) -> list[str]:
    """`-m trainbox run` of these factories for `steps` steps, TRAIN_ONLY, then `extra`."""
    return ["-m", "trainbox", "run", f"run_dir={run_dir}", f"train.max_steps={steps}",
            *TRAIN_ONLY, *overrides(model_args, data_args), *extra]  # fmt: skip


def raw_loop(
    *,
    steps: int,
    model_args: Mapping[str, int] = MODEL_ARGS,
    data_args: Mapping[str, int] = DATA_ARGS,
    extra: Iterable[str] = (),
    script: str = "raw_ddp.py",
) -> list[str]:
    """The hand-written loop (`script`) on the same factories for `steps` steps, one thread."""
    return [str(HERE / script), f"--steps={steps}", "--threads=1",
            f"--model-args={json.dumps(dict(model_args))}",
            f"--data-args={json.dumps(dict(data_args))}", *extra]  # fmt: skip
