"""trainbox: one entrypoint that detects its launcher and runs PyTorch DDP the same everywhere.

The Python API (see trainbox.api) loads lazily: `import trainbox` stays torch-free, so the CLI
can pin CPUs before torch starts its thread pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainbox.version import __version__

# Public name -> the module that defines it.
_API = {
    "load_config": "trainbox.api",
    "launch_context": "trainbox.api",
    "init_distributed": "trainbox.api",
    "Session": "trainbox.api",
    "Trainer": "trainbox.api",
    "TrainSummary": "trainbox.api",
    "Datasets": "trainbox.train.data.contract",
    "Stopped": "trainbox.errors",
}
__all__ = [
    "Datasets",
    "Session",
    "Stopped",
    "TrainSummary",
    "Trainer",
    "__version__",
    "init_distributed",
    "launch_context",
    "load_config",
]

if TYPE_CHECKING:
    from trainbox.api import (
        Session,
        Trainer,
        TrainSummary,
        init_distributed,
        launch_context,
        load_config,
    )
    from trainbox.errors import Stopped
    from trainbox.train.data.contract import Datasets


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'trainbox' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
