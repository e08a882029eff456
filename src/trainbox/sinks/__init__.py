"""Metrics sinks: where the records of metrics.jsonl also go (TensorBoard, MLflow, W&B, ...).

A sink is any object with `write(record)` and `close()`. It receives, on rank 0 only, each
record MetricsFile appends (`kind` "train", "val", "stop", or fleet health's "gpu", "host" and
"straggler"; docs/tracking.md lists the fields),
on a background thread: a slow or failing sink never slows or stops the training step.
"""

from __future__ import annotations

from trainbox.sinks.from_config import build, check
from trainbox.sinks.runner import CLOSE_TIMEOUT_S, QUEUE_LIMIT, Sink, SinkRunner

__all__ = ["CLOSE_TIMEOUT_S", "QUEUE_LIMIT", "Sink", "SinkRunner", "build", "check"]
