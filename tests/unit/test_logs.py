"""structlog set-up: JSON off a terminal, console on one, every line bound with who wrote it."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from trainbox import logs
from trainbox.errors import UsageError
from trainbox.launch import detect


class Terminal(io.StringIO):
    """A stream that says it is a TTY."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.mark.parametrize(
    ("env", "stream", "json_lines"),
    [
        ({}, io.StringIO(), True),
        ({}, Terminal(), False),
        ({"TRAINBOX_LOG_FORMAT": "console"}, io.StringIO(), False),
        ({"TRAINBOX_LOG_FORMAT": "JSON"}, Terminal(), True),
        ({"TRAINBOX_LOG_FORMAT": ""}, Terminal(), False),
        ({"TRAINBOX_LOG_FORMAT": " "}, io.StringIO(), True),
    ],
)
def test_format_choice(env: dict[str, str], stream: io.StringIO, json_lines: bool) -> None:
    assert logs.wants_json(env, stream) is json_lines


def test_json_lines_carry_rank_local_rank_node_and_launcher() -> None:
    stream = io.StringIO()
    logs.configure({}, stream=stream)
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    logs.bind(detect(env))
    logs.log.info("hello", step=3)
    line = json.loads(stream.getvalue())
    assert line["event"] == "hello"
    assert (line["rank"], line["local_rank"], line["launcher"], line["step"]) == (1, 1, "mpi", 3)
    assert line["level"] == "info"
    assert line["node"]
    assert line["timestamp"]


def test_console_lines_are_readable() -> None:
    stream = Terminal()
    logs.configure({}, stream=stream)
    logs.bind(detect({}))
    logs.log.warning("careful")
    text = stream.getvalue()
    assert "careful" in text
    assert "rank" in text
    assert not text.lstrip().startswith("{")


def test_level_filter() -> None:
    stream = io.StringIO()
    logs.configure({"TRAINBOX_LOG_LEVEL": "warning"}, stream=stream)
    logs.log.info("hidden")
    logs.log.warning("shown")
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["shown"]


# Issue 19, item 11: a value trainbox cannot use is an error naming the variable and the choices.
@pytest.mark.parametrize(
    ("env", "messages"),
    [
        (
            {"TRAINBOX_LOG_FORMAT": "xml"},
            ["TRAINBOX_LOG_FORMAT='xml' must be one of json, console"],
        ),
        (
            {"TRAINBOX_LOG_LEVEL": "verbose"},
            ["TRAINBOX_LOG_LEVEL='verbose' must be one of debug, info, warning, error"],
        ),
        (
            {"TRAINBOX_LOG_FORMAT": "text", "TRAINBOX_LOG_LEVEL": "loud"},
            [
                "TRAINBOX_LOG_FORMAT='text' must be one of json, console",
                "TRAINBOX_LOG_LEVEL='loud' must be one of debug, info, warning, error",
            ],
        ),
    ],
)
def test_unusable_values_are_usage_errors(env: dict[str, str], messages: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        logs.configure(env, stream=io.StringIO())
    assert caught.value.problems == messages
    assert "docs/cli.md" in caught.value.hint


@pytest.mark.parametrize("value", ["", "  ", "WARNING"])
def test_empty_means_the_default_and_case_does_not_matter(value: str) -> None:
    logs.configure({"TRAINBOX_LOG_LEVEL": value}, stream=io.StringIO())


def test_a_table_prints_as_lines_under_its_console_line() -> None:
    stream = io.StringIO()
    logs.configure({"TRAINBOX_LOG_FORMAT": "console"}, stream=stream)
    logs.log.info("cluster", table="rank  host\n0     a\n1     b")
    first, *rest = stream.getvalue().splitlines()
    assert "cluster" in first
    assert "\\n" not in first
    assert rest == ["  rank  host", "  0     a", "  1     b"]


def test_json_lines_keep_the_table_as_one_field() -> None:
    stream = io.StringIO()
    logs.configure({}, stream=stream)
    logs.log.info("cluster", table="rank  host\n0     a")
    assert json.loads(stream.getvalue())["table"] == "rank  host\n0     a"
