"""logging.tensorboard: the event files hold the train and val scalars, read back as TensorBoard
reads them."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainbox.sinks.tensorboard import TensorBoardSink, scalars


def test_records_become_tagged_scalars_and_bookkeeping_does_not() -> None:
    record = {"kind": "val", "step": 20, "epoch": 1, "time": 5.0, "val_samples": 512,
              "val_loss": 0.5, "val_accuracy": 0.9}  # fmt: skip
    assert scalars(record) == {"val/val_loss": 0.5, "val/val_accuracy": 0.9}
    assert scalars({"kind": "stop", "step": 3, "reason": "SIGTERM"}) == {}


def test_telemetry_records_chart_under_their_kind() -> None:
    gpu = {"kind": "gpu", "step": 50, "time": 5.0, "ranks": 8, "temp_c_p50": 64.5,
           "throttle_hw_thermal_slowdown": 1}  # fmt: skip
    host = {"kind": "host", "step": 50, "time": 5.0, "ranks": 8, "rss_mib_max": 900.0}
    assert scalars(gpu) == {"gpu/ranks": 8.0, "gpu/temp_c_p50": 64.5,
                            "gpu/throttle_hw_thermal_slowdown": 1.0}  # fmt: skip
    assert scalars(host) == {"host/ranks": 8.0, "host/rss_mib_max": 900.0}


def test_the_event_file_reads_back(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tensorboard")
    for step, loss in [(5, 2.0), (10, 1.5)]:
        sink.write({"kind": "train", "step": step, "loss": loss, "lr": 0.01, "time": 100.0 + step})
    sink.write({"kind": "val", "step": 10, "val_accuracy": 0.75, "time": 111.0})
    sink.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value, e.wall_time) for e in events.Scalars("train/loss")]
    assert loss == [(5, 2.0, 105.0), (10, 1.5, 110.0)]
    assert [(e.step, e.value) for e in events.Scalars("val/val_accuracy")] == [(10, 0.75)]
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/lr", "val/val_accuracy"}
