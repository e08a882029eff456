"""structlog set-up: JSON lines for machines, a readable console for people; every line says who."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import TextIO

import structlog

from trainbox.launch.context import LaunchContext

log = structlog.get_logger("trainbox")

LEVELS = ("debug", "info", "warning", "error")


def wants_json(env: Mapping[str, str], stream: TextIO) -> bool:
    """JSON unless the stream is a terminal; TRAINBOX_LOG_FORMAT=json|console decides instead."""
    chosen = env.get("TRAINBOX_LOG_FORMAT", "").strip().lower()
    if chosen in ("json", "console"):
        return chosen == "json"
    return not stream.isatty()


def configure(env: Mapping[str, str], *, stream: TextIO | None = None) -> None:
    """Configure structlog once, from the CLI; log lines go to stderr so stdout stays for output."""
    stream = stream or sys.stderr
    level_name = env.get("TRAINBOX_LOG_LEVEL", "info").strip().lower()
    level = (
        getattr(logging, level_name.upper(), logging.INFO) if level_name in LEVELS else logging.INFO
    )
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if wants_json(env, stream)
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write() per line (PrintLogger writes the newline separately): ranks that share a
        # stream, as under srun or mpirun, then never splice two lines together.
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(
        rank=None, local_rank=None, node=socket.gethostname(), launcher=None, pid=os.getpid()
    )


def bind(context: LaunchContext) -> None:
    """Stamp every later line with this process's rank, local rank and launcher."""
    structlog.contextvars.bind_contextvars(
        rank=context.rank, local_rank=context.local_rank, launcher=context.launcher
    )
