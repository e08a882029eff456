"""The kinds of training data, and the one place that tells them apart."""

from __future__ import annotations

from typing import Any

from trainbox.streams.dataset import ShardStream
from trainbox.train.data.map_style import TrainBatches
from trainbox.train.data.seam import Batches, Loading
from trainbox.train.data.streams import StreamBatches


def open_batches(dataset: Any, loading: Loading) -> Batches:
    """The batches of `dataset` for this rank: a sharded stream's, or a map-style dataset's."""
    if isinstance(dataset, ShardStream):
        return StreamBatches(dataset, loading)
    return TrainBatches(dataset, loading)


def follows_the_step(dataset: Any) -> bool:
    """Whether a rank's position in `dataset` follows from the step count alone (map-style), so
    a process that takes the rank over mid-run can rebuild it without a checkpoint."""
    return not isinstance(dataset, ShardStream)
