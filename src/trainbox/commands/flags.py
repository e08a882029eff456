"""The flags several commands take, each worded once, and the types that read a flag's value."""

from __future__ import annotations

import argparse
from collections.abc import Callable

CONFIG_EPILOG = """\
config keys: `trainbox config [--config FILE] [key.sub=value ...]` prints every key with its
resolved value and where it came from (default, file or override), without running anything.
Each key is explained in docs/configuration.md."""


def config_flag(parser: argparse.ArgumentParser, text: str = "YAML config file") -> None:
    # Collected, not overwritten: the CLI refuses a second file instead of silently keeping one.
    parser.add_argument("--config", metavar="FILE", action="append", help=text)


def debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        help="distributed debugging: TORCH_DISTRIBUTED_DEBUG=DETAIL, NCCL_DEBUG=INFO, ... (unless"
        " already set) and debug log lines",
    )


def checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """--checkpoint, and --config defaulting to the run's own: what eval and predict read."""
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        required=True,
        help="a checkpoint file or sharded .dcp folder, RUN_DIR/checkpoints/latest, or a run"
        " directory (its latest)",
    )
    config_flag(parser, "YAML config file (default: the run's config.yaml)")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


# Binary multiples, as sizes of buffers are usually meant.
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def byte_size(text: str) -> int:
    """A byte count of at least 1 KiB: a number with an optional K, M or G (binary) suffix."""
    number, unit = text.strip(), ""
    if number[-1:].upper() in UNITS and number[-1:].isalpha():
        number, unit = number[:-1], number[-1].upper()
    try:
        value = int(number) * UNITS[unit]
    except ValueError:
        value = 0
    if value < 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size of at least 1K (e.g. 64M)")
    return value


def rate(text: str) -> float:
    """A positive, finite speed in Gbit/s."""
    return _number(text, lambda value: 0 < value < float("inf"), "a positive speed in Gbit/s")


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    return _number(text, lambda value: 0 < value <= 1, "a fraction in (0, 1]")


def _number(text: str, fits: Callable[[float], bool], what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not fits(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value
