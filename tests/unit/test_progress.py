"""The progress line draws only for a person at a terminal: step/total, values, ETA, last eval."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

from trainbox.logs import CLEAR, status_line
from trainbox.train.watch.progress import Progress, eta, line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_status_line_left() -> Iterator[None]:
    yield
    status_line.status = ""


def test_draws_in_place_and_leaves_the_last_line_on_close() -> None:
    stream = Terminal()
    progress = Progress(100, enabled=True, stream=stream)
    progress.update(50, loss=0.5)
    progress.close()
    text = stream.getvalue()
    assert text.startswith(CLEAR + "[" + "#" * 10 + "." * 10 + "] 50/100  loss 0.5  ETA --")
    assert text.endswith("ETA --\n")
    assert not status_line.active


def test_the_eval_metrics_join_the_line() -> None:
    stream = Terminal()
    progress = Progress(100, enabled=True, stream=stream)
    progress.update(10, loss=0.5)
    progress.eval(10, {"val_loss": 0.25, "val_accuracy": 0.875, "val_samples": 512.0})
    last = stream.getvalue().split(CLEAR)[-1]
    assert "val_loss 0.25  val_accuracy 0.875" in last
    assert "val_samples" not in last


def test_silent_off_a_terminal_or_off_rank_zero() -> None:
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        progress = Progress(10, enabled=enabled, stream=stream)
        progress.update(5, loss=1.0)
        progress.eval(5, {"val_loss": 1.0})
        progress.close()
        assert stream.getvalue() == ""


@pytest.mark.parametrize(
    ("done", "left", "seconds", "expected"),
    [
        (0, 100, 5.0, "--"),  # no pace yet
        (10, 10, 1.0, "1s"),
        (10, 900, 2.0, "3m00s"),
        (100, 19900, 60.0, "3h19m"),
    ],
)
def test_eta(done: int, left: int, seconds: float, expected: str) -> None:
    assert eta(done, left, seconds) == expected


def test_line_rounds_to_four_digits_and_groups_large_numbers() -> None:
    text = line(5, 20, {"loss": 0.123456, "samples_per_s": 29570.4}, eta_text="4s")
    assert text == "[#####...............] 5/20  loss 0.1235  samples/s 29,570  ETA 4s"
