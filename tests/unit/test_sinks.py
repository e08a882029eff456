"""Metrics sinks get every record MetricsFile writes, on rank 0 only, off the training thread."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from trainbox import sinks
from trainbox.errors import UsageError
from trainbox.sinks import SinkRunner
from trainbox.train.watch.metrics import MetricsFile


class Recorder:
    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []
        self.closed = False

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def close(self) -> None:
        self.closed = True


class Broken(Recorder):
    def write(self, record: Mapping[str, Any]) -> None:
        raise ConnectionError(f"tracking server down at step {record['step']}")


class Blocked(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, record: Mapping[str, Any]) -> None:
        self.release.wait()
        super().write(record)


RECORDS = [
    {"kind": "train", "step": 5, "loss": 1.5, "time": 1.0},
    {"kind": "val", "step": 10, "val_loss": 1.2, "time": 2.0},
    {"kind": "stop", "step": 12, "reason": "SIGTERM", "time": 3.0},
]


def test_a_sink_gets_every_record_the_file_gets_in_order(tmp_path: Path) -> None:
    sink = Recorder()
    metrics = MetricsFile(tmp_path / "metrics.jsonl", enabled=True, sinks=[sink])
    for record in RECORDS:
        metrics.append(record)
    metrics.close()
    assert sink.records == RECORDS
    assert sink.closed
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(RECORDS)


def test_ranks_other_than_0_feed_no_sink(tmp_path: Path) -> None:
    sink = Recorder()
    metrics = MetricsFile(tmp_path / "metrics.jsonl", enabled=False, sinks=[sink])
    metrics.append(RECORDS[0])
    metrics.close()
    assert sink.records == []


def test_a_failing_sink_is_dropped_and_the_others_go_on() -> None:
    broken, good = Broken(), Recorder()
    runner = SinkRunner([broken, good])
    for record in RECORDS:
        runner.put(record)
    runner.close()
    assert good.records == RECORDS
    assert runner.sinks == [good]


def test_a_slow_sink_never_blocks_the_caller() -> None:
    slow = Blocked()
    runner = SinkRunner([slow])
    for record in RECORDS:
        runner.put(record)  # returns at once although the sink waits
    assert slow.records == []
    slow.release.set()
    runner.close()
    assert slow.records == RECORDS


def test_records_past_the_queue_limit_are_dropped_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trainbox.sinks.runner.QUEUE_LIMIT", 2)
    slow = Blocked()
    runner = SinkRunner([slow])
    for step in range(10):
        runner.put({"kind": "train", "step": step})
    slow.release.set()
    runner.close()
    delivered = [record["step"] for record in slow.records]
    # The queue holds 2, and the thread may hold one more outside it, waiting on the sink.
    assert len(delivered) <= 3
    assert runner.dropped == 10 - len(delivered)
    assert delivered == sorted(delivered)


@pytest.mark.parametrize(
    ("factories", "named"),
    [
        (["no_such_module_xyz:sink"], "no_such_module_xyz"),
        (["trainbox.sinks:no_such_factory"], "no_such_factory"),
    ],
)
def test_an_unusable_sink_factory_is_one_usage_error(factories: list[str], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        sinks.check(tensorboard=False, factories=factories)


def test_a_factory_is_called_with_the_run_dir(tmp_path: Path) -> None:
    made = sinks.build(run_dir=tmp_path, tensorboard=False, factories=[f"{__name__}:_factory"])
    assert [type(sink).__name__ for sink in made] == ["Recorder"]
    assert [tmp_path] == _CALLS


_CALLS: list[Path] = []


def _factory(run_dir: Path) -> Recorder:
    _CALLS.append(run_dir)
    return Recorder()


def test_tensorboard_wanted_but_not_installed_is_one_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "tensorboard" else real(name),
    )
    with pytest.raises(UsageError, match=r"logging.tensorboard=true needs the tensorboard package"):
        sinks.check(tensorboard=True, factories=["no_such_module_xyz:sink"])
