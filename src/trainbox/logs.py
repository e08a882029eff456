"""structlog set-up: JSON lines for machines, a readable console for people; every line says who."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from typing import TextIO

import structlog

from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext

log = structlog.get_logger("trainbox")

FORMATS = ("json", "console")
LEVELS = ("debug", "info", "warning", "error")
HINT = "unset it, or set one of the values named (see docs/cli.md#environment-knobs)"

# Carriage return, then erase the whole line: the status line's old text disappears.
CLEAR = "\r\x1b[2K"


class StatusLine:
    """A terminal stream with at most one status line at its bottom."""

    def __init__(self) -> None:
        self.stream: TextIO | None = None
        self.status = ""
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether a status line is shown now."""
        return bool(self.status)

    def show(self, stream: TextIO, text: str) -> None:
        """Replace the status line with `text` (no newline: the line stays the bottom one)."""
        with self._lock:
            self.stream, self.status = stream, text
            stream.write(CLEAR + text)
            stream.flush()

    def release(self) -> None:
        """Leave the status line's last text as an ordinary line; later output starts below."""
        with self._lock:
            if self.stream is not None and self.status:
                self.stream.write(CLEAR + self.status + "\n")
                self.stream.flush()
            self.status = ""

    def write_above(self, stream: TextIO, text: str) -> None:
        """Write a log line; with a status line shown on `stream`, clear it and redraw it below."""
        with self._lock:
            # Always clear first: another rank on the same terminal may have a progress line
            # there (its next redraw brings it back); on an empty line it does nothing.
            text = CLEAR + text
            if self.status and stream is self.stream:
                text += self.status
            # One write() per line: ranks sharing a stream never splice two lines together.
            stream.write(text)
            stream.flush()


status_line = StatusLine()


class StatusLineWriter:
    """A file-like object for structlog's WriteLogger that writes through `status_line`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        status_line.write_above(self.stream, text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def choices(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The chosen log format (None: decided by the stream) and level; bad values are exit 2."""
    problems: list[str] = []
    chosen = _choice(env, "TRAINBOX_LOG_FORMAT", FORMATS, problems)
    level = _choice(env, "TRAINBOX_LOG_LEVEL", LEVELS, problems) or "info"
    if problems:
        raise UsageError(problems, hint=HINT)
    return chosen, level


def _choice(
    env: Mapping[str, str], variable: str, allowed: tuple[str, ...], problems: list[str]
) -> str | None:
    # Empty counts as unset: `VAR= trainbox ...` and blank manifest values mean "the default".
    value = env.get(variable, "").strip().lower()
    if value and value not in allowed:
        problems.append(f"{variable}={env[variable]!r} must be one of {', '.join(allowed)}")
        return None
    return value or None


def say(line: str) -> None:
    """One line to stderr, newline included, in a single write(): ranks that share the stream
    (torchrun, srun, mpirun) then never splice two lines together, as print's separate write
    of the newline lets them when two ranks fail at once."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def wants_json(env: Mapping[str, str], stream: TextIO) -> bool:
    """JSON unless the stream is a terminal; TRAINBOX_LOG_FORMAT=json|console decides instead."""
    chosen, _level = choices(env)
    return chosen == "json" if chosen else not stream.isatty()


def configure(env: Mapping[str, str], *, stream: TextIO | None = None) -> None:
    """Configure structlog once, from the CLI; log lines go to stderr so stdout stays for output.

    An unusable TRAINBOX_LOG_FORMAT or TRAINBOX_LOG_LEVEL is a UsageError, before any set-up.
    """
    stream = stream or sys.stderr
    _chosen, level_name = choices(env)
    level = getattr(logging, level_name.upper())
    as_json = wants_json(env, stream)
    shaping: list[structlog.typing.Processor] = [] if as_json else [skip_shown_steps, round_floats]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else console(colors=stream.isatty())
    )
    # On a terminal, log lines go above the progress line rather than into it.
    target: TextIO | StatusLineWriter = StatusLineWriter(stream) if stream.isatty() else stream
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *shaping,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write() per line (PrintLogger writes the newline separately): ranks that share a
        # stream, as under srun or mpirun, then never splice two lines together.
        # structlog's WriteLogger only calls write() and flush(), but its annotation asks for a
        # whole TextIO, which StatusLineWriter is not.
        logger_factory=structlog.WriteLoggerFactory(target),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(
        rank=None, local_rank=None, node=socket.gethostname(), launcher=None, pid=os.getpid()
    )


def console(*, colors: bool) -> structlog.typing.Processor:
    """structlog's console renderer, with a `table` field printed as indented lines under its
    line rather than as one string full of escaped newlines."""
    render = structlog.dev.ConsoleRenderer(colors=colors)

    def with_table(logger: object, name: str, event: structlog.typing.EventDict) -> str:
        table = event.pop("table", None)
        line = str(render(logger, name, event))
        if isinstance(table, str):
            line += "".join(f"\n  {row}" for row in table.strip("\n").splitlines())
        return line

    return with_table


def bind(context: LaunchContext) -> None:
    """Stamp every later line with this process's rank, local rank and launcher."""
    structlog.contextvars.bind_contextvars(
        rank=context.rank, local_rank=context.local_rank, launcher=context.launcher
    )


def skip_shown_steps(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Console only: a `step` record says what the progress line already shows, so drop it;
    other ranks' step records repeat rank 0's (the values are all-reduced)."""
    if event.get("event") == "step" and (status_line.active or event.get("rank") not in (0, None)):
        raise structlog.DropEvent
    return event


def round_floats(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Console only: floats to 4 significant digits (JSON lines keep every digit)."""
    return {key: _round(value) for key, value in event.items()}


def _round(value: object) -> object:
    return float(f"{value:.4g}") if isinstance(value, float) else value
