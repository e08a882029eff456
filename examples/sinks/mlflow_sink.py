"""A trainbox metrics sink that logs to MLflow: `logging.sinks=[mlflow_sink:sink]`.

With MLFLOW_TRACKING_URI unset it writes MLflow's local file store to RUN_DIR/mlruns
(`mlflow ui --backend-store-uri RUN_DIR/mlruns` shows it). Needs `pip install mlflow-skinny`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

SKIP = frozenset({"kind", "step", "time", "epoch", "reason"})


class MLflowSink:
    """One MLflow run per trainbox run, named after run_dir; train and val metrics per step."""

    def __init__(self, run_dir: Path) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 keeps the file store only on request; it needs no database package.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name("trainbox")
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment("trainbox")
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("kind") not in ("train", "val"):
            return
        stamp, step = int(record.get("time", time.time()) * 1000), int(record["step"])
        metrics = [
            Metric(key, float(value), stamp, step)
            for key, value in record.items()
            if key not in SKIP and isinstance(value, int | float) and not isinstance(value, bool)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def sink(run_dir: Path) -> MLflowSink:
    """The `logging.sinks` factory: trainbox calls it once, on rank 0, with the run's directory."""
    return MLflowSink(run_dir)
