"""The Python API: what `trainbox run` is built from, for scripts with their own model and data.

    config = trainbox.load_config("train.yaml", ["train.max_steps=500"])
    with trainbox.init_distributed(seed=config.seed) as session:
        model, data = MyNet(), trainbox.Datasets(train=my_train, val=my_val)
        summary = trainbox.Trainer(config, session, model=model, data=data).fit()

Run the script under any launcher through `trainbox exec -- python script.py` (or torchrun).
A façade: each name lives in the package named by its job (runtime/, distributed/, config/,
train/).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainbox.config import Config, load
from trainbox.distributed.process_group import Session
from trainbox.runtime.group import agree_with_peers, init_distributed, launch_context
from trainbox.runtime.trainer import Trainer, recorded
from trainbox.train.data.contract import Datasets
from trainbox.train.resume.run_dir import TrainSummary

__all__ = [
    "Config",
    "Datasets",
    "Session",
    "TrainSummary",
    "Trainer",
    "agree_with_peers",
    "init_distributed",
    "launch_context",
    "load_config",
    "recorded",
]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """The run configuration from an optional YAML file and `key.sub=value` overrides."""
    return load(str(path) if path else None, list(overrides))
