"""`trainbox run` with logging.tensorboard and a logging.sinks example: both receive the run's
records, and the event file reads back as TensorBoard reads it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from runs import QUICK, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sinks"


def test_a_run_feeds_tensorboard_and_a_configured_sink(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, *QUICK, "logging.tensorboard=true", "logging.sinks=[csv_sink:sink]",
          nproc=2, pythonpath=EXAMPLES)  # fmt: skip
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    written = events.Scalars("train/loss")
    assert [e.step for e in written] == [step for step, _ in losses]
    assert [e.value for e in written] == pytest.approx([loss for _, loss in losses])  # float32
    val_steps = [r["step"] for r in records if r["kind"] == "val"]
    assert [e.step for e in events.Scalars("val/val_accuracy")] == val_steps
    rows = list(csv.DictReader((run_dir / "train.csv").open()))
    assert [(int(row["step"]), float(row["loss"])) for row in rows] == losses


def test_a_sink_factory_that_is_not_there_is_exit_2_naming_it(tmp_path: Path) -> None:
    proc = train(tmp_path / "run", *QUICK, "logging.sinks=[no_such_sink_module:sink]", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "no_such_sink_module" in proc.stderr
