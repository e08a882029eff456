"""Console log lines and the progress line share a terminal without splicing into each other."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from trainbox import logs
from trainbox.logs import CLEAR, StatusLineWriter, status_line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_status_line_left() -> Iterator[None]:
    yield
    status_line.status = ""
    structlog.reset_defaults()


def test_a_log_line_clears_the_status_line_and_redraws_it_below() -> None:
    stream = Terminal()
    status_line.show(stream, "[###] 3/10")
    StatusLineWriter(stream).write("hello\n")
    assert stream.getvalue() == CLEAR + "[###] 3/10" + CLEAR + "hello\n[###] 3/10"


def test_without_a_status_line_a_log_line_still_clears_another_rank_s() -> None:
    stream = Terminal()
    StatusLineWriter(stream).write("hello\n")
    assert stream.getvalue() == CLEAR + "hello\n"


def test_release_keeps_the_last_text_as_a_line() -> None:
    stream = Terminal()
    status_line.show(stream, "done")
    status_line.release()
    assert stream.getvalue().endswith(CLEAR + "done\n")
    assert not status_line.active


@pytest.mark.parametrize(
    ("event", "rank", "shown", "dropped"),
    [
        ("step", 0, True, True),  # the progress line shows it
        ("step", 0, False, False),
        ("step", None, False, False),  # before ranks are known
        ("step", 1, False, True),  # rank 0's record, repeated
        ("eval", 0, True, False),
        ("eval", 1, False, False),
    ],
)
def test_console_step_records_only_from_rank_0_and_only_without_a_progress_line(
    event: str, rank: int | None, shown: bool, dropped: bool
) -> None:
    status_line.status = "[#] 1/2" if shown else ""
    record: dict[str, Any] = {"event": event, "rank": rank, "loss": 1.0}
    if dropped:
        with pytest.raises(structlog.DropEvent):
            logs.skip_shown_steps(None, "info", record)
    else:
        assert logs.skip_shown_steps(None, "info", record) == record


def test_console_floats_are_cut_to_four_significant_digits() -> None:
    record = {"event": "step", "data_wait_share": 0.19434870187442763, "step": 7, "x": "0.123456"}
    assert logs.round_floats(None, "info", record) == {
        "event": "step", "data_wait_share": 0.1943, "step": 7, "x": "0.123456"
    }  # fmt: skip


def test_json_lines_keep_every_digit() -> None:
    stream = io.StringIO()
    logs.configure({"TRAINBOX_LOG_FORMAT": "json"}, stream=stream)
    logs.log.info("step", data_wait_share=0.19434870187442763)
    assert "0.19434870187442763" in stream.getvalue()
