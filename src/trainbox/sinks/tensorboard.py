"""TensorBoard event files from the metrics records: `train/loss`, `val/val_accuracy`, ..."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainbox.errors import UsageError

# Bookkeeping fields of a record, not scalars worth a chart.
NOT_SCALARS = frozenset({"kind", "step", "time", "epoch", "val_samples", "reason"})
# The record kinds charted: training, validation and fleet health's per-log-point telemetry.
# Event records (stop, straggler) are rare and hold names, not series.
CHARTED = frozenset({"train", "val", "gpu", "host"})


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A charted record's numbers as TensorBoard tags (`train/loss`, `gpu/temp_c_max`); others
    give none."""
    kind = record.get("kind")
    if kind not in CHARTED:
        return {}
    return {
        f"{kind}/{key}": float(value)
        for key, value in record.items()
        if key not in NOT_SCALARS and isinstance(value, int | float) and not isinstance(value, bool)
    }


class TensorBoardSink:
    """Writes scalars to `directory` (point `tensorboard --logdir` at it or at runs/)."""

    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise UsageError(
                "logging.tensorboard=true needs the tensorboard package, which is not installed",
                hint="pip install 'trainbox[tensorboard]' (or tensorboard) into the image,"
                " or set logging.tensorboard=false",
            ) from err
        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=10)

    def write(self, record: Mapping[str, Any]) -> None:
        step, walltime = int(record.get("step", 0)), record.get("time")
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)

    def close(self) -> None:
        self.writer.close()
