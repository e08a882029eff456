"""The example sinks in examples/sinks do what their docstrings say."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sinks"
RECORDS = [
    {"kind": "train", "step": 5, "epoch": 0, "loss": 2.0, "lr": 0.01, "samples_per_s": 900.0,
     "time": 1000.0},
    {"kind": "val", "step": 10, "val_loss": 1.25, "val_samples": 64, "time": 1001.0},
    {"kind": "train", "step": 10, "epoch": 0, "loss": 1.5, "lr": 0.02, "samples_per_s": 950.0,
     "time": 1002.0},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # Set, then unset: monkeypatch then restores whatever the sink sets for its file store.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    for name in ("mlflow_sink", "csv_sink"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_mlflow_sink_writes_a_local_file_store(tmp_path: Path) -> None:
    import mlflow_sink

    sink = mlflow_sink.sink(tmp_path)
    for record in RECORDS:
        sink.write(record)
    sink.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.get_run(sink.run_id)
    assert (run.info.run_name, run.info.status) == (tmp_path.name, "FINISHED")
    history = client.get_metric_history(sink.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(5, 2.0), (10, 1.5)]
    assert [m.value for m in client.get_metric_history(sink.run_id, "val_loss")] == [1.25]
    assert set(run.data.metrics) == {"loss", "lr", "samples_per_s", "val_loss", "val_samples"}


def test_the_csv_sink_writes_one_row_per_train_record(tmp_path: Path) -> None:
    import csv_sink

    sink = csv_sink.sink(tmp_path)
    for record in RECORDS:
        sink.write(record)
    sink.close()
    rows = list(csv.reader((tmp_path / "train.csv").open()))
    assert rows == [["step", "loss", "lr", "samples_per_s"],
                    ["5", "2.0", "0.01", "900.0"], ["10", "1.5", "0.02", "950.0"]]  # fmt: skip
