"""The smallest trainbox metrics sink, train records as CSV: `logging.sinks=[csv_sink:sink]`."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

COLUMNS = ("step", "loss", "lr", "samples_per_s")


class CsvSink:
    """RUN_DIR/train.csv: one row per train record (the columns a spreadsheet wants)."""

    def __init__(self, run_dir: Path) -> None:
        self.handle = (run_dir / "train.csv").open("w", newline="")
        self.rows = csv.writer(self.handle)
        self.rows.writerow(COLUMNS)

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("kind") == "train":
            self.rows.writerow([record.get(name, "") for name in COLUMNS])

    def close(self) -> None:
        self.handle.close()


def sink(run_dir: Path) -> CsvSink:
    """The `logging.sinks` factory: called once, on rank 0, with the run's directory."""
    return CsvSink(run_dir)
